"""PAG through the training loop: selective revision, per-turn rewards with the revision bonus, injected tokens
in no loss, turn-independent advantages and RoleAdvNorm over the whole batch."""

import dataclasses
from pathlib import Path

import pytest
import torch

from reasonrl.algo.presets import get_preset
from reasonrl.config import ConfigError, load_config
from reasonrl.models.load import load_tokenizer
from reasonrl.rollout.fake import FakeEngine
from reasonrl.rollout.multiturn.episodes import ROLE_POLICY
from reasonrl.rollout.multiturn.pag_rules import DIRECT_REVISE_PROMPT, PAG_REVISE_PROMPT, PAG_VERIFY_PROMPT
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.update.advantage_stage import assign_advantages
from tests.helpers import DigitFraction

PAG_TINY = [
    "model.name_or_path=tiny-random",
    "rollout.rollout_prompts=2",
    "rollout.samples_per_prompt=2",
    "rollout.max_response_tokens=48",
    "rollout.max_conversation_tokens=1200",
    "train.minibatch_sequences=4",
    "train.microbatch_tokens=4096",
    "data.eval_prompts=2",
    "reward.workers=1",
    "train.rollout_steps=1",
    "run.eval_every=100",
]


def scripted_engine(verdict: str):
    """First attempts answer "Answer: 5" (wrong for DigitFraction), revisions "12345" (right); every verify
    turn ends with ``verdict``."""
    tokenizer = load_tokenizer("tiny-random")
    stop = tokenizer.eos_token_id

    def respond(prompt, rng):
        last_user = tokenizer.decode(prompt).rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
        reply = {
            PAG_VERIFY_PROMPT: f"Step 1 checked. {verdict}",
            PAG_REVISE_PROMPT: "12345",
            DIRECT_REVISE_PROMPT: "12345",
        }
        return [*tokenizer(reply.get(last_user, "Answer: 5"), add_special_tokens=False)["input_ids"], stop]

    return FakeEngine(respond, stop_token_ids=[stop])


def first_step(run_dir):
    return next(r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] == 1)


def test_a_wrong_verdict_revises_and_earns_the_revision_bonus(tmp_path):
    cfg = load_config("pag", PAG_TINY)
    fit(cfg, tmp_path, engine=scripted_engine("The answer is wrong."), verifier=DigitFraction(), show_progress=False)
    m = first_step(tmp_path)
    assert m["multiturn/revision_rate"] == 1.0 and m["multiturn/turns_mean"] == 3.0
    assert m["multiturn/accuracy_t1"] == 0.0 and m["multiturn/accuracy_final"] == 1.0
    assert m["multiturn/verifier_accuracy"] == 1.0  # "wrong" about a wrong attempt
    assert m["reward/mean"] == 3.0  # attempt 1: 0, verify: 1, attempt 2: 1 + α(1 − 0) = 2
    assert m["reward/accuracy"] == 1.0  # the final attempt's verdict


def test_a_correct_verdict_ends_the_conversation(tmp_path):
    cfg = load_config("pag", PAG_TINY)
    fit(cfg, tmp_path, engine=scripted_engine("The answer is correct."), verifier=DigitFraction(), show_progress=False)
    m = first_step(tmp_path)
    assert m["multiturn/revision_rate"] == 0.0 and m["multiturn/turns_mean"] == 2.0
    assert m["multiturn/verifier_accuracy"] == 0.0 and m["reward/mean"] == 0.0


def test_direct_multiturn_revises_without_verifying(tmp_path):
    cfg = load_config("direct_multiturn", PAG_TINY)
    fit(cfg, tmp_path, engine=scripted_engine("unused"), verifier=DigitFraction(), show_progress=False)
    m = first_step(tmp_path)
    assert m["multiturn/turns_mean"] == 2.0 and "multiturn/verifier_accuracy" not in m
    assert m["reward/mean"] == 2.0  # 0, then 1 + (1 − 0)


def collected_batch(verdict="The answer is wrong."):
    from reasonrl.training.setup import setup

    cfg = load_config("pag", PAG_TINY)
    run = setup(cfg, Path("unused"), scripted_engine(verdict), DigitFraction())
    return run.rollout.collect(1)[0]


@pytest.fixture(scope="module")
def pag_batch():
    return collected_batch()


def test_injected_tokens_are_in_no_loss_and_turns_do_not_share_credit(pag_batch):
    batch = pag_batch
    injected = batch.turns.role_ids < 0
    assert (
        injected.any()
        and not (batch.policy_loss_mask & injected).any()
        and not (batch.value_loss_mask & injected).any()
    )
    spec = get_preset("pag")
    batch.values = torch.zeros_like(batch.rollout_logprobs)
    assign_advantages(batch, dataclasses.replace(spec, advantage_norm="none"), kl_coef=0.0)
    # γ = λ = 1 with a zero critic: each turn's advantage is its own reward, on every token of the turn
    for row in range(len(batch)):
        for turn in batch.turns.turn_ids[row].unique().tolist():
            if turn < 0:
                continue
            tokens = batch.turns.turn_ids[row] == turn
            turn_reward = batch.turns.rewards[row][tokens].sum()
            assert torch.allclose(batch.advantages[row][tokens], turn_reward.expand(int(tokens.sum())))
    # changing the last turn's reward leaves the earlier turns' advantages as they were
    before = batch.advantages.clone()
    last_turn = batch.turns.turn_ids == batch.turns.turn_ids.max(dim=1, keepdim=True).values
    rewards = batch.turns.rewards
    batch.turns = dataclasses.replace(
        batch.turns, rewards=rewards + 5.0 * (last_turn & batch.response_mask) * (rewards != 0)
    )
    assign_advantages(batch, dataclasses.replace(spec, advantage_norm="none"), kl_coef=0.0)
    earlier = (batch.turns.turn_ids >= 0) & ~last_turn
    assert torch.equal(batch.advantages[earlier], before[earlier])


def test_role_adv_norm_whitens_each_role_over_the_whole_batch(pag_batch):
    batch = pag_batch
    batch.values = torch.zeros_like(batch.rollout_logprobs)
    rewards = batch.turns.rewards
    batch.turns = dataclasses.replace(batch.turns, rewards=rewards + torch.rand_like(rewards) * (rewards != 0))
    assign_advantages(batch, get_preset("pag"), kl_coef=0.0)
    for role in (0, 1):
        a = batch.advantages[(batch.turns.role_ids == role) & batch.policy_loss_mask]
        assert abs(a.mean().item()) < 1e-5 and abs(a.std().item() - 1.0) < 1e-4
    assert (batch.turns.role_ids[batch.response_mask] == ROLE_POLICY).any()


def test_multiturn_refuses_settings_it_cannot_honour():
    with pytest.raises(ConfigError) as error:
        load_config("pag", ["algo.dynamic_sampling=true", "rollout.fire.enabled=true", "rollout.max_attempts=0"])
    message = str(error.value)
    assert "rollout.multiturn does not run with algo.dynamic_sampling: turn one off" in message
    assert "rollout.multiturn does not run with rollout.fire: turn one off" in message
    assert "rollout.max_attempts=0 must be >= 1" in message
    with pytest.raises(ConfigError) as error:
        load_config("tool_grpo", ["rollout.tool_batch_timeout_seconds=2"])  # a single call would be cut short
    assert "rollout.tool_batch_timeout_seconds=2 must be >= rollout.tool_timeout_seconds=3" in str(error.value)


def test_a_resumed_multiturn_run_equals_an_uninterrupted_one(tmp_path):
    # real sampling (the fast engine on tiny-random), two attempts per conversation: every conversation of a
    # step is regenerated from the checkpoint's weights and the step's seeds, so a resume samples the same
    from safetensors.torch import load_file

    from tests.train.test_loop import comparable

    base = [*PAG_TINY[:-2], "rollout.max_response_tokens=12", "run.save_every=1", "train.lr=1e-3", "run.eval_every=100"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    fit(
        load_config("direct_multiturn", [*base, "train.rollout_steps=2"]),
        straight,
        verifier=DigitFraction(),
        show_progress=False,
    )
    fit(
        load_config("direct_multiturn", [*base, "train.rollout_steps=1"]),
        split,
        verifier=DigitFraction(),
        show_progress=False,
    )
    fit(
        load_config("direct_multiturn", [*base, "train.rollout_steps=2"]),
        split,
        verifier=DigitFraction(),
        show_progress=False,
    )
    assert first_step(straight)["multiturn/turns_mean"] == 2.0
    a = load_file(straight / "checkpoints" / "step-000002" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step-000002" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert comparable(read_metrics(straight / "metrics.jsonl")) == comparable(read_metrics(split / "metrics.jsonl"))


def test_every_multiturn_metric_is_documented(tmp_path):
    from tests.train.test_loop import undocumented_metrics

    fit(
        load_config("pag", PAG_TINY),
        tmp_path,
        engine=scripted_engine("The answer is wrong."),
        verifier=DigitFraction(),
        show_progress=False,
    )
    assert not undocumented_metrics(tmp_path / "metrics.jsonl")


def test_the_sandboxed_python_tool_returns_output_or_an_error_and_never_raises():
    from reasonrl.training.rollouts.conversation_stage import sandboxed_python

    run = sandboxed_python(timeout_s=1.0, budget_s=10.0)
    printed, crashed, looped, flooded, binary = run(
        ["print(2 + 3)\nprint('done')", "print('before')\nraise ValueError('boom')", "while True:\n    pass",
         "print('x' * 10**7)", "import sys\nsys.stdout.buffer.write(bytes(range(256)))\nsys.stdout.flush()"]
    )  # fmt: skip
    assert printed.text == "5\ndone\n" and not printed.failed
    assert crashed.text.startswith("before\n") and "ValueError: boom" in crashed.text and crashed.failed
    assert "Error:" in looped.text and looped.failed  # the time limit, as a message to the model
    assert "Error:" in flooded.text and flooded.failed  # a flood of output
    assert binary.text.encode() and "\ufffd" in binary.text  # bytes that are no UTF-8 come back as text


def test_a_turns_tool_calls_share_one_time_budget():
    import time

    from reasonrl.training.rollouts.conversation_stage import sandboxed_python

    run = sandboxed_python(timeout_s=1.0, budget_s=1.5, workers=2)
    started = time.monotonic()
    outputs = run(["while True:\n    pass"] * 6)  # three rounds of two at 1 s each, were there no budget
    assert time.monotonic() - started < 2.5
    assert all(o.failed for o in outputs) and outputs[-1].text == "Error: no time left in the batch's budget"


def test_tool_grpo_trains_and_a_tool_call_that_loops_forever_times_out_and_the_run_goes_on(tmp_path):
    from tests.train.test_loop import undocumented_metrics

    tokenizer = load_tokenizer("tiny-random")
    stop = tokenizer.eos_token_id

    def respond(prompt, rng):  # every first turn calls a tool that never returns; the next turn answers
        first = tokenizer.decode(prompt).count("<|im_start|>user") == 1
        reply = "```python\nwhile True:\n    pass\n```" if first else "12345"
        return [*tokenizer(reply, add_special_tokens=False)["input_ids"], stop]

    overrides = [
        *PAG_TINY,
        "rollout.tool_timeout_seconds=1",
        "rollout.max_response_tokens=48",
        "algo.kl_placement=none",
    ]
    cfg = load_config("tool_grpo", overrides)
    fit(cfg, tmp_path, engine=FakeEngine(respond, [stop]), verifier=DigitFraction(), show_progress=False)
    m = first_step(tmp_path)
    assert m["multiturn/tool_calls_mean"] == 1.0 and m["multiturn/turns_mean"] == 2.0
    assert m["perf/generate_seconds"] >= 1.0  # four conversations, each call ran to its 1 s limit (together)
    assert m["multiturn/tool_errors_mean"] == 1.0  # and each timeout was told to the model, and counted
    assert not undocumented_metrics(tmp_path / "metrics.jsonl")
    assert m["reward/accuracy"] == 1.0  # and each went on to its final answer, "12345"


def test_values_placed_on_injected_tokens_cannot_change_any_gradient(pag_batch):
    # the PAG batch (injected verify and revise templates), with advantages and old log-probs on every token:
    # whatever sits on the injected tokens, one SGD step of the policy lands on the same weights
    from tests.train.test_step import updated_parameters

    g = torch.Generator().manual_seed(0)
    generated = pag_batch.response_mask
    batch = dataclasses.replace(
        pag_batch,
        old_logprobs=torch.where(generated, -2.0 + 0.1 * torch.randn(generated.shape, generator=g), 0.0),
        advantages=torch.where(generated, torch.randn(generated.shape, generator=g), 0.0),
    )
    injected = batch.turns.role_ids < 0
    poisoned = dataclasses.replace(
        batch,
        old_logprobs=torch.where(injected, 50.0, batch.old_logprobs),
        advantages=torch.where(injected, 1e6, batch.advantages),
        turns=dataclasses.replace(batch.turns, rewards=torch.where(injected, 1e6, batch.turns.rewards)),
    )
    clean, _, _ = updated_parameters(4096, "token-mean", batch, lr=0.1)
    dirty, _, _ = updated_parameters(4096, "token-mean", poisoned, lr=0.1)
    changed = [name for name in clean if not torch.equal(clean[name], dirty[name])]
    assert not changed, changed
    flipped, _, _ = updated_parameters(
        4096, "token-mean", dataclasses.replace(batch, advantages=-batch.advantages), lr=0.1
    )
    assert any(not torch.equal(clean[name], flipped[name]) for name in clean)  # the generated tokens' do move it


def test_a_step_whose_prompts_are_all_too_long_stops_with_the_setting_to_change(tmp_path):
    from reasonrl.data.loaders import DataError

    cfg = load_config("pag", [*PAG_TINY, "rollout.max_prompt_tokens=8"])
    # (the run's start measures its first prompts and stops before any model loads, naming the value that fits)
    with pytest.raises(DataError, match=r"longer than rollout.max_prompt_tokens=8 .*set rollout.max_prompt_tokens="):
        fit(
            cfg, tmp_path, engine=scripted_engine("The answer is wrong."), verifier=DigitFraction(), show_progress=False
        )


def test_tool_prompts_advertise_the_python_tool_only_where_the_chat_template_has_a_tool_call_format():
    from reasonrl.rollout.multiturn.conversations import PYTHON_TOOL
    from reasonrl.training.rollouts.conversation_stage import prompt_tools
    from tests.rollout.test_multiturn import HERMES_TEMPLATE

    plain = load_tokenizer("tiny-random")
    hermes = load_tokenizer("tiny-random")
    hermes.chat_template = HERMES_TEMPLATE
    tool, pag = load_config("tool_grpo").rollout, load_config("pag").rollout
    assert prompt_tools(tool, hermes) == [PYTHON_TOOL]
    assert prompt_tools(tool, plain) is None  # fenced python blocks, as the preset's system prompt asks
    assert prompt_tools(pag, hermes) is None


@pytest.mark.parametrize("model", ["tiny-random", pytest.param("smollm2-135m", marks=pytest.mark.slow)])
def test_tools_a_template_cannot_render_are_written_into_the_system_prompt_unless_data_sets_one(model, caplog):
    from reasonrl.data.countdown import countdown_examples
    from reasonrl.data.prompts import PromptEncoder
    from reasonrl.rollout.multiturn.environments import Countdown
    from reasonrl.rollout.multiturn.tool_calls import hermes_tool_prompt, native_tool_format
    from reasonrl.training.rollouts.conversation_stage import episode_encoder
    from tests.rollout.test_multiturn import HERMES_TEMPLATE

    tokenizer, tools, row = load_tokenizer(model), list(Countdown.tools), countdown_examples("test")[0]
    assert native_tool_format(tokenizer) is None  # apply_chat_template(tools=...) would drop them
    with caplog.at_level("INFO", logger="reasonrl"):
        written = episode_encoder(PromptEncoder(tokenizer, "plain", 4096), tools)
    assert written.messages(row)[0] == {"role": "system", "content": hermes_tool_prompt(tools)}
    prompt = tokenizer.decode(written(row))
    assert '{"name": "calculator", "description": ' in prompt and '<tool_call>\n{"name": <function-name>' in prompt
    assert "the tools (calculator) and how to call them (<tool_call> blocks) are written into the system" in caplog.text
    caplog.clear()
    own = PromptEncoder(tokenizer, "plain", 4096, system_prompt="Call the calculator as <tool_call>...</tool_call>.")
    with caplog.at_level("INFO", logger="reasonrl"):
        assert episode_encoder(own, tools) is own  # the user's system prompt, as written
    assert "data.system_prompt is kept as written: it alone tells the model how to call the tools" in caplog.text
    hermes = load_tokenizer("tiny-random")
    hermes.chat_template = HERMES_TEMPLATE
    rendering = PromptEncoder(hermes, "plain", 4096, tools=tools)
    assert episode_encoder(rendering, tools) is rendering  # the template renders them itself
