"""RL with a process reward model (arXiv 2410.17621): dense line rewards on code responses, the critic
initialised from the PRM, and a `prm_ppo` run end to end."""

import json
import re
from types import SimpleNamespace

import pytest
import torch

from reasonrl.config import ConfigError, load_config, resolve
from reasonrl.jobs.reward_model import RewardModelRun, run_reward_model_training
from reasonrl.models.load import load_tokenizer
from reasonrl.reward.prm import Line, ProcessRewardModel
from reasonrl.rollout.fake import FakeEngine
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.rollouts.process_rewards import ProcessRewards, all_failed_prompt_stats
from tests.reward.test_prm import synthetic_rows

TINY = [
    "model.name_or_path=tiny-random",
    "model.dtype=float32",
    "rollout.rollout_prompts=2",
    "rollout.max_prompt_tokens=2048",
    "rollout.max_response_tokens=48",
    "train.minibatch_sequences=2",
    "train.microbatch_tokens=4096",
    "data.eval_prompts=2",
    "reward.workers=1",
    "train.rollout_steps=1",
    "run.eval_every=100",
    "reward.incorrect_score=-1.0",
]


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("prm")
    data = root / "labels.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(load_tokenizer("tiny-random"), 8, 0)))
    settings = RewardModelRun(kind="prm", model="tiny-random", data=str(data), out=str(root / "prm"), steps=2,
                              batch_pairs=4, max_prompt_tokens=64, max_response_tokens=64)  # fmt: skip
    run_reward_model_training(settings)
    return root / "prm"


class Batch(SimpleNamespace):
    def __len__(self):
        return self.response_ids.shape[0]


def batch_of(rows, correct, groups):
    """A RolloutBatch's fields the process rewards read: [B, T] responses, outcome and groups."""
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.bool)
    return Batch(
        prompt_ids=torch.zeros(len(rows), 1, dtype=torch.long), prompt_mask=torch.ones(len(rows), 1, dtype=torch.bool),
        response_ids=ids, response_mask=mask, correct=torch.tensor(correct), group_ids=torch.tensor(groups),
        rewards=torch.where(torch.tensor(correct), 1.0, -1.0),
    )  # fmt: skip


class ScriptedPRM:
    """Every response has 3 lines ending at tokens 1, 3, 5, the second a comment; the PRM's probability
    after t tokens is 1 − t/10."""

    def lines(self, response_ids):
        return [Line("a\n", 1, False), Line("#\n", 3, True), Line("b\n", 5, False)]

    def state_scores(self, prompt_ids, prompt_mask, response_ids, response_mask):
        width = response_ids.shape[1] + 1
        return (1 - torch.arange(width) / 10).expand(response_ids.shape[0], width).clone()


@pytest.mark.parametrize("mode", ["paper", "potential"])
def test_dense_rewards_sit_on_line_end_tokens_of_code_rows_only(mode):
    cfg = load_config("ppo", ["reward.incorrect_score=-1.0", f"reward.prm_dense={mode}", "reward.prm_path=x"])
    rewards = ProcessRewards(cfg.reward, ScriptedPRM())
    batch = batch_of([[7] * 8, [7] * 8, [7] * 8], [False, True, False], [0, 0, 1])
    dense, stats = rewards(batch, torch.tensor([True, True, False]))
    # the score after line l's end token e is 1 - (e + 1)/10, on the reward scale [-1, 1]: -1 + 2 p
    after = {1: -1 + 2 * 0.8, 5: -1 + 2 * 0.4}
    if mode == "paper":  # lambda by the outcome, divided by the 2 rewarded lines; the comment gets 0
        expected = {0: {e: 0.25 * s / 2 for e, s in after.items()}, 1: {e: 0.025 * s / 2 for e, s in after.items()}}
    else:  # c * (score - score of the previous rewarded line), starting from the empty prefix's (1.0 -> 1.0)
        steps = {1: after[1] - 1.0, 5: after[5] - after[1]}
        expected = {0: steps, 1: steps}
    for row in (0, 1):
        want = torch.zeros(8)
        for end, value in expected[row].items():
            want[end] = value
        torch.testing.assert_close(dense[row], want)
    assert dense[2].abs().sum() == 0  # not a code task: no process reward
    assert stats["reward/prm_lines_mean"] == 3.0
    # prompt 0 has a passing sample; prompt 1 is not code: no all-failed code prompt this batch
    batch.dense_rewards = dense
    assert all_failed_prompt_stats(batch, torch.tensor([True, True, False]))["reward/all_failed_prompts"] == 0.0


def test_prompts_whose_samples_all_fail_get_a_signal_from_the_prm():
    cfg = load_config("ppo", ["reward.incorrect_score=-1.0", "reward.prm_dense=paper", "reward.prm_path=x"])
    short, long = [7] * 8, [7] * 12  # the same lines, so the same rewards: no signal between them
    batch = batch_of([short, long], [False, False], [0, 0])
    code = torch.tensor([True, True])
    batch.dense_rewards = None  # outcome only: both samples failed with the same reward
    stats = all_failed_prompt_stats(batch, code)
    assert stats["reward/all_failed_prompts"] == 1.0 and stats["reward/all_failed_prompts_with_signal"] == 0.0
    batch.dense_rewards, _ = ProcessRewards(cfg.reward, ScriptedPRM())(batch, code)
    assert all_failed_prompt_stats(batch, code)["reward/all_failed_prompts_with_signal"] == 0.0

    class LongerIsBetter(ScriptedPRM):
        def state_scores(self, prompt_ids, prompt_mask, response_ids, response_mask):
            return response_mask.sum(1, keepdim=True).float().expand(-1, response_ids.shape[1] + 1) / 12

    batch.dense_rewards, _ = ProcessRewards(cfg.reward, LongerIsBetter())(batch, code)
    assert all_failed_prompt_stats(batch, code)["reward/all_failed_prompts_with_signal"] == 1.0


def test_the_critic_starts_as_the_prm_on_the_reward_scale(prm_dir):
    from reasonrl.training.setup import build_critic

    cfg = load_config("prm_ppo", [*TINY, f"reward.prm_path={prm_dir}"])
    critic = build_critic(cfg, resolve(cfg, "cpu", 1), torch.device("cpu"))
    prm = ProcessRewardModel(str(prm_dir), load_tokenizer("tiny-random"), torch.float32)
    ids, mask = torch.randint(3, 200, (2, 6)), torch.ones(2, 6, dtype=torch.bool)
    with torch.no_grad():
        value = critic.model(ids[:, :2], mask[:, :2], ids[:, 2:], mask[:, 2:])
        probability = prm.model(ids[:, :2], mask[:, :2], ids[:, 2:], mask[:, 2:])
    torch.testing.assert_close(value, -1.0 + 2.0 * probability)


def test_prm_settings_that_cannot_work_are_refused():
    with pytest.raises(ConfigError, match=re.escape("reward.prm_dense=paper needs reward.prm_path")):
        load_config("prm_ppo", ["reward.prm_path=null"])
    with pytest.raises(ConfigError, match=re.escape("reward.prm_dense does not run with rollout.multiturn")):
        load_config("prm_ppo", ["reward.prm_path=x", "rollout.multiturn=tool"])


def test_a_prm_ppo_run_without_a_trained_prm_says_how_to_make_one(tmp_path):
    from reasonrl.models.load import ModelError

    with pytest.raises(ModelError, match=re.escape("`reasonrl rm train --kind bt` (or --kind prm for a PRM)")):
        fit(load_config("prm_ppo", [*TINY, f"reward.prm_path={tmp_path / 'none'}"]), tmp_path / "run")


def test_prm_ppo_trains_end_to_end_with_dense_rewards(tmp_path, prm_dir):
    tokenizer = load_tokenizer("tiny-random")
    stop = tokenizer.eos_token_id
    program = "def f(x):\n    # no idea\n    return x\n"
    engine = FakeEngine(lambda p, rng: [*tokenizer(program, add_special_tokens=False)["input_ids"], stop], [stop])
    cfg = load_config("prm_ppo", [*TINY, f"reward.prm_path={prm_dir}", "rollout.samples_per_prompt=2"])
    fit(cfg, tmp_path, engine=engine, show_progress=False)
    step = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1)
    assert step["reward/prm_lines_mean"] == 3.0 and step["reward/prm_dense_mean"] != 0.0
    assert step["reward/accuracy"] == 0.0 and step["reward/all_failed_prompts"] == 2.0  # both prompts, 2 samples
    assert step["perf/process_reward_seconds"] > 0
