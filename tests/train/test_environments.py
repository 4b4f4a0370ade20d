"""Environments through the training loop: the shipped games train from their presets, a user's environment that
fails costs its episodes and never the run, and PAG and the python tool, now environments, train as before."""

import re

import pytest

from reasonrl.config import load_config
from reasonrl.data.countdown import Puzzle
from reasonrl.models.load import load_tokenizer
from reasonrl.rollout.episodes import ROLE_POLICY, Environment, Injection, Step
from reasonrl.rollout.fake import FakeEngine
from reasonrl.train.loop import fit
from reasonrl.train.metrics import read_metrics
from tests.helpers import DigitFraction
from tests.rollout.test_environments import expressions
from tests.train.test_loop import undocumented_metrics
from tests.train.test_multiturn import PAG_TINY

TWO_STEPS = [*PAG_TINY[:-2], "train.rollout_steps=2", "run.eval_every=100", "reward.timeout_seconds=300"]


def scripted(reply):
    """A FakeEngine on tiny-random whose turn is ``reply(the chat so far as text, rng)``."""
    tokenizer = load_tokenizer("tiny-random")
    stop = tokenizer.eos_token_id
    return FakeEngine(
        lambda prompt, rng: [
            *tokenizer(reply(tokenizer.decode(prompt), rng), add_special_tokens=False)["input_ids"],
            stop,
        ],
        [stop],
    )


def steps(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0 and "multiturn/turns_mean" in r]


def countdown_player(text, rng):
    """Calls the calculator once, then answers: the solution (found by search) or, half the time, a wrong one."""
    if "<|im_start|>tool" not in text:
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "2 * (3 + 4)"}}</tool_call>'
    numbers, target = re.search(r"the numbers ([\d, ]+), each .* equals (\d+)\.", text).groups()
    puzzle = Puzzle(tuple(int(n) for n in numbers.split(", ")), int(target))
    solution = next(e for e in expressions(list(puzzle.numbers)) if puzzle.solved_by(f"<answer>{e}</answer>"))
    return f"<answer>{solution if rng.random() < 0.5 else f'{solution} + 1'}</answer>"


def test_countdown_trains_two_steps_from_its_preset(tmp_path):
    # a call is ~90 byte tokens; 4 held-out puzzles, so the greedy player (one RNG per call) solves some
    cfg = load_config("countdown", [*TWO_STEPS, "rollout.max_response_tokens=160", "data.eval_prompts=4"])
    fit(cfg, tmp_path, engine=scripted(countdown_player), show_progress=False)
    for m in steps(tmp_path):
        assert m["multiturn/tool_calls_mean"] == 1.0 and m["multiturn/turns_mean"] == 2.0
        assert m["multiturn/tool_errors_mean"] == 0.0 and m["multiturn/environment_error_fraction"] == 0.0
        assert m["reward/mean"] == m["reward/accuracy"]  # the environment's 1 for a solved puzzle, else 0
    assert len(steps(tmp_path)) == 2 and 0 < sum(m["reward/accuracy"] for m in steps(tmp_path)) < 2
    # the held-out evaluation plays the same episodes (greedy): a calculator call, then the answer
    before = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert before["step"] == 0 and before["eval/tool_calls_mean"] == 1.0 and before["eval/turns_mean"] == 2.0
    assert 0 < before["eval/accuracy"] < 1 and before["eval/environment_error_fraction"] == 0.0
    assert not undocumented_metrics(tmp_path / "metrics.jsonl")


def guesser(text, rng):
    """Guesses at random first, then halves the range the feedback leaves (found in 6 turns, or not)."""
    feedback = re.findall(r"(\d+) is too (low|high)", text)
    low, high = 1, 50
    for guess, word in feedback:
        low, high = (int(guess) + 1, high) if word == "low" else (low, int(guess) - 1)
    return f"Answer: {(low + high) // 2 if feedback else rng.randint(1, 50)}"


def test_guess_number_trains_two_steps_from_its_preset(tmp_path):
    cfg = load_config("guess_number", TWO_STEPS)
    fit(cfg, tmp_path, engine=scripted(guesser), show_progress=False)
    for m in steps(tmp_path):
        assert 1.0 < m["multiturn/turns_mean"] <= 6.0 and m["multiturn/tool_calls_mean"] == 0.0
        assert m["reward/mean"] == m["reward/accuracy"] > 0  # 1 on the turn that finds it
    assert len(steps(tmp_path)) == 2


class BoomOnce(Environment):
    """A user's one-turn environment whose reward fails on a turn that says "boom"."""

    def step(self, episode):
        return Step()

    def finish(self, episode):
        if "boom" in episode.turns()[-1].text:
            raise RuntimeError("the scorer of this game crashed")
        return 1.0


def test_a_users_environment_that_fails_costs_its_episodes_and_the_run_goes_on(tmp_path, caplog):
    environment = "rollout.environment=tests.train.test_environments:BoomOnce"
    overrides = [*PAG_TINY, "reward.timeout_seconds=300", "rollout.multiturn=env", environment]
    engine = scripted(lambda text, rng: "boom" if rng.random() < 0.5 else "fine")
    fit(load_config("grpo", overrides), tmp_path, engine=engine, show_progress=False)
    (m,) = steps(tmp_path)
    assert 0 < m["multiturn/environment_error_fraction"] < 1
    assert m["reward/mean"] == 1 - m["multiturn/environment_error_fraction"]  # a failed episode is rewarded 0
    assert "the scorer of this game crashed" in caplog.text


class HugeTurns(Environment):
    """A two-turn game whose every turn's reward is 3e38: each within float32's range, their sum (6e38) beyond it,
    for the episodes whose first turn says "huge"; the others get 1.0 a turn."""

    def step(self, episode):
        huge = "huge" in episode.turns()[0].text
        return (
            Step(None, 3e38 if huge else 1.0)
            if len(episode.turns()) >= 2
            else Step(Injection("go on", ROLE_POLICY), 3e38 if huge else 1.0)
        )

    def finish(self, episode):
        return 0.0


def test_turn_rewards_that_sum_past_float32_fail_their_episode_only(tmp_path, caplog):
    environment = "rollout.environment=tests.train.test_environments:HugeTurns"
    overrides = [*PAG_TINY, "reward.timeout_seconds=300", "rollout.multiturn=env", environment]
    engine = scripted(lambda text, rng: "huge" if rng.random() < 0.5 else "fine")
    fit(load_config("grpo", overrides), tmp_path, engine=engine, show_progress=False)
    (m,) = steps(tmp_path)
    assert 0 < m["multiturn/environment_error_fraction"] < 1
    assert m["reward/mean"] == 2 * (1 - m["multiturn/environment_error_fraction"])  # finite: 2.0, or 0 when failed
    assert "sum past float32's range" in caplog.text


class Abacus:
    """A TRL ``environment_factory`` class, written as TRL's docs write one: no reasonrl in it."""

    def reset(self, **kwargs) -> None:
        self.total = 0

    def add(self, value: int) -> int:
        """
        Add a value to the abacus.

        Args:
            value: The value to add.

        Returns:
            The new total.
        """
        self.total += value
        return self.total

    def get_reward(self) -> float:
        return self.total / 4


def abacus_player(text, rng):
    """Adds 1 or 2 (seeded), then answers once the total is in the chat."""
    if "<|im_start|>tool" not in text:
        return f'<tool_call>{{"name": "add", "arguments": {{"value": {rng.choice([1, 2])}}}}}</tool_call>'
    return "Done."


def test_a_trl_environment_class_trains_two_steps_rewarded_by_its_get_reward(tmp_path):
    environment = "rollout.environment=tests.train.test_environments:Abacus"
    calls = "rollout.max_response_tokens=96"  # a call is ~70 byte tokens
    cfg = load_config("grpo", [*TWO_STEPS, "rollout.multiturn=env", environment, calls])
    fit(cfg, tmp_path, engine=scripted(abacus_player), show_progress=False)
    logged = steps(tmp_path)
    assert len(logged) == 2
    for m in logged:
        assert m["multiturn/tool_calls_mean"] == 1.0 and m["multiturn/turns_mean"] == 2.0
        assert m["multiturn/tool_errors_mean"] == 0.0 and m["multiturn/environment_error_fraction"] == 0.0
        assert 0.25 <= m["reward/mean"] <= 0.5  # get_reward: the total / 4, the total 1 or 2
    assert {m["reward/mean"] for m in logged} != {0.25}  # both totals were drawn
    before = read_metrics(tmp_path / "metrics.jsonl")[0]  # the held-out episodes play it too
    assert before["eval/tool_calls_mean"] == 1.0 and before["eval/accuracy"] == 1.0  # get_reward > 0: solved
    assert not undocumented_metrics(tmp_path / "metrics.jsonl")


def pag_or_tool_player(kind):
    """Replies drawn by the engine's seeded RNG: attempts, verdicts and revisions (pag); python calls that
    print, that raise, or none, and answers after them (tool)."""

    def reply(text, rng):
        if kind == "pag":
            if text.rsplit("<|im_start|>user\n", 1)[1].startswith("Check the math"):
                return rng.choice(["Fine. The answer is correct.", "Step 1 is off. The answer is wrong.", "Hmm."])
            return rng.choice(["Answer: 5", "12345", "Answer: 42"])
        if text.count("<|im_start|>user") == 1:
            return rng.choice(["```python\nprint(6 * 7)\n```", "```python\nraise ValueError(1)\n```", "Answer: 7"])
        return rng.choice(["12345", "The answer is 42", "x"])

    return reply


# What the code before environments logged for these runs (seed 3, two steps): rollout metrics only, which the
# scripted replies and the digit-fraction reward fix on any platform (the losses depend on the CPU's float kernels)
BEFORE = {
    "pag": [
        {"multiturn/accuracy_final": 0.0, "multiturn/accuracy_t1": 0.0, "multiturn/revision_rate": 0.25,
         "multiturn/turns_mean": 2.25, "multiturn/verdict_unparsed_fraction": 0.5, "multiturn/verifier_accuracy": 0.25,
         "reward/accuracy": 0.0, "reward/mean": 0.25, "rollout/response_length": 31.75,
         "rollout/response_length_max": 57.0, "rollout/tokens_generated": 127.0},
        {"multiturn/accuracy_final": 0.75, "multiturn/accuracy_t1": 0.75, "multiturn/revision_rate": 0.25,
         "multiturn/turns_mean": 2.25, "multiturn/verdict_unparsed_fraction": 0.25, "multiturn/verifier_accuracy": 0.25,
         "reward/accuracy": 0.75, "reward/mean": 1.25, "rollout/response_length": 33.5,
         "rollout/response_length_max": 48.0, "rollout/tokens_generated": 134.0},
    ],
    "tool_grpo": [
        {"multiturn/tool_calls_mean": 0.75, "multiturn/tool_errors_mean": 0.0, "multiturn/turns_mean": 1.75,
         "reward/accuracy": 0.0, "reward/mean": 0.0590277761220932, "rollout/response_length": 28.0,
         "rollout/response_length_max": 44.0, "rollout/tokens_generated": 112.0},
        {"multiturn/tool_calls_mean": 0.75, "multiturn/tool_errors_mean": 0.75, "multiturn/turns_mean": 1.75,
         "reward/accuracy": 0.5, "reward/mean": 0.5277777910232544, "rollout/response_length": 31.5,
         "rollout/response_length_max": 40.0, "rollout/tokens_generated": 126.0},
    ],
}  # fmt: skip


@pytest.mark.parametrize(("preset", "kind"), [("pag", "pag"), ("tool_grpo", "tool")])
def test_pag_and_the_python_tool_as_environments_train_as_before(tmp_path, preset, kind):
    cfg = load_config(preset, [*TWO_STEPS, "run.seed=3"])
    fit(cfg, tmp_path, engine=scripted(pag_or_tool_player(kind)), verifier=DigitFraction(), show_progress=False)
    logged = steps(tmp_path)
    for before, after in zip(BEFORE[preset], logged, strict=True):
        assert {key: after[key] for key in before} == pytest.approx(before, rel=1e-6)
    if kind == "tool":  # the python tool is an environment now: its failures would be counted
        assert [m["multiturn/environment_error_fraction"] for m in logged] == [0.0, 0.0]


def test_the_tool_calls_of_one_turn_share_one_time_budget_however_many_wait_for_a_thread(monkeypatch):
    # six episodes' steps, two threads (as when more episodes than threads call at once), each step one looping
    # program on two sandboxes, a 1.5 s budget: the turn's calls end within it together (a budget per call would
    # give three rounds, 3 s)
    import time

    from reasonrl.rollout import episodes
    from reasonrl.train.conversation_stage import sandboxed_python

    run = sandboxed_python(timeout_s=1.0, budget_s=1.5, workers=2)
    assert run(["print(1)"])[0].text == "1\n"  # warm: the sandbox's probe
    monkeypatch.setattr(episodes, "MAX_ENVIRONMENT_THREADS", 2)
    started = time.monotonic()
    outputs = episodes.contained([lambda: run(["while True:\n    pass"])[0]] * 6, timeout_s=30)
    assert time.monotonic() - started < 2.5
    assert all(o.failed for o in outputs) and outputs[-1].text == "Error: no time left in the batch's budget"


ENV = "rollout.multiturn=env"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.environment=countdown"], "rollout.environment=countdown needs rollout.multiturn=env"),
        ([ENV], "rollout.multiturn=env needs an environment: one of countdown, guess_number, python"),
        ([ENV, "rollout.environment=chess"], "rollout.environment=chess must be one of"),
        ([ENV, "rollout.environment=countdown"], "plays the rows of its own dataset: set data.dataset=countdown"),
        ([ENV, "rollout.environment=game:Chess", "rollout.max_turns=0"], "rollout.max_turns must be >= 1"),
        (["rollout.multiturn=tool", "rollout.environment_timeout_seconds=30"],
         "rollout.environment_timeout_seconds=30 must be more than rollout.tool_batch_timeout_seconds=30"),
    ],
)  # fmt: skip
def test_environment_settings_are_refused_with_the_setting_to_change(overrides, message):
    from reasonrl.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("grpo", overrides)


def test_an_environment_run_with_no_held_out_row_evaluates_as_a_single_turn_run_does():
    from reasonrl.rollout import SamplingParams
    from reasonrl.train.conversation_stage import ConversationCollector

    scored = ConversationCollector.evaluate(None, [], SamplingParams(max_new_tokens=8, temperature=0.0))
    assert scored == {"eval/accuracy": 0.0, "eval/response_length": 0.0}  # no row to play: nothing to crash on
