"""T-PPO end to end: pooled batches, token filtering, EGAE in the loop, the critic on finished
responses only, resume in the middle of an unfinished pool, and learning on tiny-random."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.algo.value_loss import value_loss
from reasonrl.config import load_config, resolve
from reasonrl.data.prompts import PromptEncoder
from reasonrl.data.source import TrainingStream
from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.models.value import load_value_model, value_model_from_policy
from reasonrl.reward.scoring_pool import ScoringPool
from reasonrl.rollout.fake import FakeEngine
from reasonrl.rollout.tppo_pool import RolloutPool
from reasonrl.training.loop import fit, logprob_stage
from reasonrl.training.placement.parallel import SINGLE_PROCESS
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.rollouts.rollout_stage import PoolCollector, RolloutCollector, RolloutSettings
from reasonrl.training.run_inputs import data_spec
from reasonrl.training.update.advantage_stage import assign_advantages
from reasonrl.training.update.critic import CriticUpdater
from reasonrl.training.update.policy import TokenLogprobs
from tests.helpers import DigitFraction
from tests.train.test_loop import TINY, undocumented_metrics

WINDOW, CAP = 4, 12


def tppo_config(*overrides):
    return load_config("t_ppo", [*TINY, f"algo.window_tokens={WINDOW}", *overrides])


class UniqueLogprobEngine(FakeEngine):
    """Responses of 1 to 14 digits then EOS; every generated token gets its own log-prob (−1, −2, ...),
    which identifies it wherever it later appears in a batch."""

    def __init__(self, tokenizer):
        digit, eos = tokenizer.convert_tokens_to_ids("7"), tokenizer.eos_token_id
        super().__init__(lambda prompt, rng: [digit] * rng.randint(1, 14) + [eos], stop_token_ids=[eos])
        self.issued = 0

    def generate(self, prompts, params):
        completions = super().generate(prompts, params)
        out = []
        for completion in completions:
            ids = list(range(self.issued + 1, self.issued + 1 + len(completion.token_ids)))
            self.issued += len(ids)
            out.append(type(completion)(completion.token_ids, [-float(i) for i in ids], completion.finish_reason))
        return out


def pool_collector(cfg, engine=None):
    tokenizer = load_tokenizer("tiny-random")
    engine = engine or UniqueLogprobEngine(tokenizer)
    scorer = ScoringPool(DigitFraction(), workers=1, timeout=30)
    stream = TrainingStream(data_spec(cfg), seed=0)
    encoder = PromptEncoder(tokenizer, cfg.data.prompt_template, cfg.rollout.max_prompt_tokens)
    plan = resolve(cfg)
    collector = RolloutCollector(RolloutSettings.of(cfg, plan), engine, tokenizer, scorer, stream, encoder)
    pool = RolloutPool(plan.sequences_per_rollout, cfg.algo.window_tokens, cfg.rollout.max_response_tokens)
    return PoolCollector(collector, pool), scorer


def test_each_generated_token_enters_the_policy_loss_exactly_once_over_many_windows():
    collector, scorer = pool_collector(tppo_config(f"rollout.max_response_tokens={CAP}"))
    policy_counts: dict[float, int] = {}
    seen: set[float] = set()
    finished, longest_span = 0, 0.0
    with scorer:
        for step in range(1, 13):
            batch, stats = collector.collect(step)
            assert stats["rollout/pool_fill"] == 1.0 and len(batch) == 16  # the pool stays full
            for value in batch.rollout_logprobs[batch.policy_loss_mask].tolist():
                policy_counts[value] = policy_counts.get(value, 0) + 1
            seen |= set(batch.rollout_logprobs[batch.response_mask].tolist())
            finished += int(stats["rollout/finished_sequences"])
            if stats["rollout/finished_sequences"]:
                longest_span = max(longest_span, stats["rollout/windows_per_response"])
            # the stale tokens are exactly the response tokens outside the policy loss
            assert torch.equal(batch.pool_window.stale_mask, batch.response_mask & ~batch.policy_loss_mask)
            # a continued sequence's prompt and earlier windows are prefilled again
            continued = batch.pool_window.stale_mask.any(1)
            reprefill = batch.prompt_mask.sum(1)[continued].sum() + batch.pool_window.stale_mask.sum()
            assert stats["rollout/reprefill_tokens"] == reprefill and (step == 1) == (reprefill == 0)
            assert torch.equal(batch.value_loss_mask, batch.response_mask & ~batch.pool_window.running[:, None])
    assert finished > 16 and longest_span > 1  # responses finished, some across several windows
    assert set(policy_counts) == seen, "a generated token never reached the policy loss"
    assert set(policy_counts.values()) == {1}, "a token reached the policy loss twice"


def test_all_generated_policy_tokens_train_on_the_whole_response_so_far():
    cfg = tppo_config(f"rollout.max_response_tokens={CAP}", "algo.policy_tokens=all_generated")
    collector, scorer = pool_collector(cfg)
    with scorer:
        for step in (1, 2, 3):
            batch, _ = collector.collect(step)
            assert torch.equal(batch.policy_loss_mask, batch.response_mask)
    assert resolve(cfg).separate_old_logprob_pass  # stale tokens need their stored log-probs


def running_and_finished_batch(*overrides):
    """A pooled batch after its second window (some rows finished, some running) with values and returns."""
    cfg = tppo_config(f"rollout.max_response_tokens={CAP}", *overrides)
    collector, scorer = pool_collector(cfg)
    with scorer:
        collector.collect(1)
        batch, _ = collector.collect(2)
    assert batch.pool_window.running.any() and (~batch.pool_window.running).any()
    critic = value_model_from_policy("tiny-random", None)
    with torch.no_grad():
        critic.head.bias.fill_(0.3)
        critic.head.weight.normal_(0, 0.05)
    batch.values = critic(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask).detach()
    assign_advantages(batch, cfg.algo, 0.0)
    return cfg, critic, batch


def test_the_value_loss_has_zero_gradient_for_every_token_of_a_running_sequence():
    _, critic, batch = running_and_finished_batch()
    captured = []
    embeddings = critic.backbone.get_input_embeddings()

    def keep_gradient(module, inputs, output):
        output.register_hook(captured.append)

    hook = embeddings.register_forward_hook(keep_gradient)
    # padded, so that row i of the embeddings' gradient is sequence i's (packing lays rows out in lanes)
    values = critic(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask, packed=False)
    loss, _ = value_loss(values, batch.values, batch.returns, batch.value_loss_mask, 0.5, "token-mean")
    loss.backward()
    hook.remove()
    grad = captured[0]  # [B, P + T, d]: d loss / d input embedding of every prompt and response token
    running = batch.pool_window.running
    assert torch.count_nonzero(grad[running]) == 0
    assert all(torch.count_nonzero(grad[row]) > 0 for row in (~running).nonzero().squeeze(1).tolist())


def test_the_critic_step_is_skipped_when_no_sequence_finished():
    _, critic, batch = running_and_finished_batch()
    running_only = batch.select(batch.pool_window.running.nonzero().squeeze(1))
    before = {k: v.clone() for k, v in critic.state_dict().items()}
    updater = CriticUpdater(
        critic,
        torch.optim.AdamW(critic.parameters(), lr=1e-2),
        value_clip=0.5,
        minibatch_sequences=len(running_only),
        epochs=1,
        microbatch_tokens=4096,
        grad_clip=1.0,
        compute_dtype=torch.float32,
    )
    metrics = updater.update(running_only, seed=0)
    assert metrics["critic/skipped_update"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in critic.state_dict().items())


def test_egae_in_the_loop_bootstraps_running_rows_and_is_gae_on_finished_rows():
    cfg, _, batch = running_and_finished_batch("algo.advantage_norm=none")
    finished = batch.select((~batch.pool_window.running).nonzero().squeeze(1))
    finished.pool_window = None  # the same rows as a synchronous batch: plain GAE
    gae_spec = dataclasses.replace(cfg.algo, advantage_estimator="gae", window_tokens=None)
    advantages = batch.advantages[~batch.pool_window.running][:, : finished.advantages.shape[1]]
    assign_advantages(finished, gae_spec, 0.0)
    assert torch.equal(advantages, finished.advantages)
    last = batch.response_mask.sum(1) - 1
    running_last = batch.advantages[torch.arange(len(batch)), last][batch.pool_window.running]
    # γ = 1, reward 0: the newest token gets A = 0 (docs/algorithms.md, ambiguity 8)
    assert torch.count_nonzero(running_last) == 0


def test_truncated_rollouts_need_no_dynamic_sampling_or_fire():
    from reasonrl.config import ConfigError

    with pytest.raises(ConfigError, match="dynamic_sampling=false"):
        resolve(tppo_config("algo.dynamic_sampling=true"))
    with pytest.raises(ConfigError, match=r"fire\.enabled=false"):
        resolve(tppo_config("rollout.fire.enabled=true"))
    with pytest.raises(ConfigError, match=r"set algo\.window_tokens too"):
        resolve(load_config("ppo", [*TINY, "algo.policy_tokens=all_generated"]))


def test_resume_in_the_middle_of_an_unfinished_pool_is_exact(tmp_path):
    def run(directory, steps):
        cfg = tppo_config(f"train.rollout_steps={steps}", "run.save_every=2", "train.lr=1e-3")
        fit(cfg, directory, verifier=DigitFraction(), show_progress=False)

    run(tmp_path / "straight", 4)
    run(tmp_path / "split", 2)
    saved = json.loads((tmp_path / "split" / "checkpoints" / "step-000002" / "state.json").read_text())
    assert any(not s["finish_reason"] and s["token_ids"] for s in saved["pool"]["active"]), "no unfinished sequence"
    run(tmp_path / "split", 4)
    final = [d / "checkpoints" / "step-000004" for d in (tmp_path / "straight", tmp_path / "split")]
    policies = [load_file(d / "model.safetensors") for d in final]
    assert all(torch.equal(policies[0][k], policies[1][k]) for k in policies[0])
    critics = [load_value_model(d / "critic").state_dict() for d in final]
    assert all(torch.equal(critics[0][k], critics[1][k]) for k in critics[0])
    states = [json.loads((d / "state.json").read_text()) for d in final]
    assert states[0]["pool"] == states[1]["pool"]
    keep = ("critic/", "reward/", "loss/", "rollout/")
    metrics = [
        [{k: v for k, v in r.items() if k.startswith(keep)} for r in read_metrics(d / "metrics.jsonl")]
        for d in (tmp_path / "straight", tmp_path / "split")
    ]
    assert metrics[0] == metrics[1]
    assert not undocumented_metrics(tmp_path / "straight" / "metrics.jsonl")


@pytest.mark.parametrize("kl_placement", ["none", "reward", "loss"])
def test_the_old_logprob_pass_runs_the_lm_head_where_its_log_probs_are_read(kl_placement):
    kl = [] if kl_placement == "none" else [f"algo.kl_placement={kl_placement}", "algo.kl_coef=0.1"]
    cfg = tppo_config(f"rollout.max_response_tokens={CAP}", *kl)
    collector, scorer = pool_collector(cfg)
    with scorer:
        collector.collect(1)
        batch, _ = collector.collect(2)
    assert batch.pool_window.stale_mask.any()
    policy = TokenLogprobs(load_model("tiny-random"), 1.0, torch.float32)
    run = SimpleNamespace(
        cfg=cfg,
        plan=resolve(cfg),
        parallel=SINGLE_PROCESS,
        microbatch_tokens=768,
        updater=SimpleNamespace(policy=policy, minibatch_sequences=len(batch)),
        reference=policy,  # the same weights: reference log-probs = the policy's
        kl=SimpleNamespace(coef=0.1),
    )
    stats = logprob_stage(run, batch, seed=0)
    with torch.no_grad():
        every, _ = policy(batch)
    fresh, stale = batch.response_mask & ~batch.pool_window.stale_mask, batch.pool_window.stale_mask
    torch.testing.assert_close(batch.old_logprobs[fresh], every[fresh], atol=1e-6, rtol=1e-6)
    assert torch.equal(batch.old_logprobs[stale], batch.rollout_logprobs[stale])  # the stored behaviour ones
    head = int(fresh.sum())
    if kl_placement == "reward":  # every token's reward carries a KL: the reference runs on all of them
        torch.testing.assert_close(batch.ref_logprobs[batch.response_mask], every[batch.response_mask])
        head += int(batch.response_mask.sum())
    elif kl_placement == "loss":  # the loss reads the window's tokens
        torch.testing.assert_close(batch.ref_logprobs[fresh], every[fresh])
        head += int(fresh.sum())
    assert stats["perf/lm_head_tokens_logprob"] == head
