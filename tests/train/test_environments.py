"""Environments through the training loop: the shipped games train from their presets, a user's environment that
fails costs its episodes and never the run, and PAG and the python tool, now environments, train as before."""

import json
import logging
import re

import pytest

from reasonrl.config import load_config
from reasonrl.data.countdown import Puzzle
from reasonrl.models.load import load_tokenizer
from reasonrl.rollout.fake import FakeEngine
from reasonrl.rollout.multiturn.episodes import ROLE_POLICY, Environment, Injection, Step
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
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
    """Adds 1 or 2 (seeded) where the system prompt shows the tool, then answers once the total is in the chat."""
    if "<|im_start|>tool" in text:
        return "Done."
    if '"name": "add"' not in text.split("<|im_start|>user")[0]:
        return "I have no tool."
    return f'<tool_call>{{"name": "add", "arguments": {{"value": {rng.choice([1, 2])}}}}}</tool_call>'


def test_a_trl_environment_class_trains_two_steps_rewarded_by_its_get_reward(tmp_path):
    # tiny-random's template renders no tools: they are written into the system prompt (669 byte tokens)
    environment = "rollout.environment=tests.train.test_environments:Abacus"
    calls = "rollout.max_response_tokens=96"  # a call is ~70 byte tokens
    cfg = load_config(
        "grpo", [*TWO_STEPS, "rollout.multiturn=env", environment, calls, "rollout.max_prompt_tokens=1024"]
    )
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


WORDS = ("crane", "slate", "pious", "chair")


class WordleEnv:
    """Wordle, written as TRL's docs write an ``environment_factory`` class (docs/source/openenv.md's Wordle: a
    ``reward`` attribute, a ``done`` flag, a tool that raises once the game is over, no ``get_reward``): no
    reasonrl in it.  The secret is the row's, so that a test can play it."""

    def reset(self, **kwargs) -> str | None:
        self.secret = WORDS[int(kwargs["game"]) % len(WORDS)]
        self.reward = 0.0
        self.done = False
        return None

    def guess(self, guess: str) -> str:
        """
        Guess the secret five-letter word.

        Args:
            guess: The guessed word, five lowercase letters.
        """
        if self.done:
            raise ValueError("Game over.")
        if guess == self.secret:
            self.reward, self.done = 1.0, True
            return "You won!"
        marks = ["G" if g == s else "Y" if g in self.secret else "_" for g, s in zip(guess, self.secret, strict=False)]
        return f"{guess}: {''.join(marks)}"


def reward_from_env(environments, **kwargs) -> list[float]:
    """TRL's documented reward function of an environment run: each episode's environment's reward."""
    return [env.reward for env in environments]


def reward_guesses(completions, **kwargs) -> list[float]:
    """A second TRL reward, summed with the first: 0.1 for each guess tool message in the episode's completion."""
    return [0.1 * sum(m["role"] == "tool" for m in completion) for completion in completions]


def wordle_player(text, rng):
    """Guesses once (the right word half the time, seeded), then says it is done."""
    if "<|im_start|>tool" in text or "<tool_response>" in text:
        return "Done."
    secret = WORDS[int(re.search(r"game (\d+)", text).group(1)) % len(WORDS)]
    word = secret if rng.random() < 0.5 else "zzzzz"
    return f'<tool_call>{{"name": "guess", "arguments": {{"guess": "{word}"}}}}</tool_call>'


def test_a_trl_environment_written_as_trl_documents_it_trains_with_its_own_reward_functions(tmp_path):
    """TRL's Wordle pattern, unchanged: the class keeps its reward in ``self.reward`` and has no ``get_reward``;
    ``reward_from_env(environments, **kwargs)`` reads it, ``reward_guesses`` reads the completions as messages;
    the rows have a prompt and no answer (TRL needs only a prompt).  Both functions are summed, as TRL sums them."""
    rows = tmp_path / "wordle.jsonl"
    prompt = "Play Wordle, game {}. Use the tool `guess` to make a guess."
    rows.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": prompt.format(n)}], "game": n}) + "\n"
                            for n in range(40)))  # fmt: skip
    functions = (
        "reward.functions=[tests.train.test_environments:reward_from_env,tests.train.test_environments:reward_guesses]"
    )
    overrides = [*TWO_STEPS, "rollout.multiturn=env", "rollout.environment=tests.train.test_environments:WordleEnv",
                 f"data.dataset={rows}", functions, "rollout.max_response_tokens=96", "rollout.max_prompt_tokens=1024",
                 "train.constant_reward_stop_steps=0"]  # fmt: skip
    fit(load_config("grpo", overrides), tmp_path / "run", engine=scripted(wordle_player), show_progress=False)
    logged = steps(tmp_path / "run")
    assert len(logged) == 2
    for m in logged:
        assert m["multiturn/tool_calls_mean"] == 1.0 and m["multiturn/environment_error_fraction"] == 0.0
        # each episode: its env's reward (1 when it guessed right) + 0.1 for its one guess
        assert 0.1 < m["reward/mean"] < 1.1 and m["reward/fn/reward_from_env/errors"] == 0.0
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2} and all(len(s["turns"]) == 3 for s in samples)
    assert all(s["reward"] in (pytest.approx(0.1), pytest.approx(1.1)) for s in samples)


def wordle_run(tmp_path, *overrides):
    rows = tmp_path / "wordle.jsonl"
    prompt = "Play Wordle, game {}. Use the tool `guess` to make a guess."
    rows.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": prompt.format(n)}], "game": n}) + "\n"
                            for n in range(40)))  # fmt: skip
    settings = [*TWO_STEPS, "rollout.multiturn=env", f"data.dataset={rows}", "rollout.max_response_tokens=96",
                "rollout.max_prompt_tokens=1024", "train.constant_reward_stop_steps=0", *overrides]  # fmt: skip
    fit(load_config("grpo", settings), tmp_path / "run", engine=scripted(wordle_player), show_progress=False)
    return steps(tmp_path / "run")


def test_a_trl_class_without_get_reward_and_without_reward_functions_is_rewarded_by_its_reward_attribute(
    tmp_path, caplog
):
    """Such a run once trained on zeros, silently (the verifier scored the last turn against an answer column): the
    instance's ``reward`` attribute is the episode's reward, and the run says so."""
    with caplog.at_level(logging.INFO):
        logged = wordle_run(tmp_path, "rollout.environment=tests.train.test_environments:WordleEnv")
    assert all(0 < m["reward/mean"] <= 1 for m in logged) and any(m["reward/mean"] < 1 for m in logged)
    assert "has no get_reward and the run no reward.functions: each episode's reward is its instance's" in caplog.text


class WordleWithGetReward(WordleEnv):
    def get_reward(self) -> float:
        return 2 * self.reward


def test_a_get_reward_is_summed_with_the_reward_functions(tmp_path):
    """TRL adds ``get_reward`` to the reward functions (weight 1); it once made reasonrl drop ``reward_funcs``."""
    functions = "reward.functions=[tests.train.test_environments:reward_guesses]"
    logged = wordle_run(tmp_path, "rollout.environment=tests.train.test_environments:WordleWithGetReward", functions)
    for m in logged:  # 2 per win + 0.1 per guess, every episode guessing once
        assert m["reward/fn/reward_guesses/errors"] == 0.0
        assert round(m["reward/mean"] - 0.1, 6) in {round(2 * k / 4, 6) for k in range(5)}


def test_a_reward_function_that_fails_on_the_episodes_costs_their_term(tmp_path):
    functions = "reward.functions=[tests.train.test_environments:reward_from_env,tests.reward_functions:always_raises]"
    logged = wordle_run(tmp_path, "rollout.environment=tests.train.test_environments:WordleEnv", functions,
                        "reward.max_error_fraction=1.1")  # fmt: skip
    assert all(m["reward/fn/always_raises/errors"] == 4.0 for m in logged)


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

    from reasonrl.rollout.multiturn import episodes
    from reasonrl.training.rollouts.conversation_stage import sandboxed_python

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
    from reasonrl.training.rollouts.conversation_stage import ConversationCollector

    scored = ConversationCollector.evaluate(None, [], SamplingParams(max_new_tokens=8, temperature=0.0))
    assert scored == {"eval/accuracy": 0.0, "eval/response_length": 0.0}  # no row to play: nothing to crash on


class NoDocstring:
    """A TRL class whose tool has no docstring: TRL cannot describe it."""

    def reset(self, **kwargs) -> None:
        return None

    def poke(self, x: int) -> str:
        return str(x)


@pytest.mark.parametrize(
    ("environment", "said"),
    [
        ("tests.train.test_environments:WordelEnv", "has no 'WordelEnv'; did you mean 'WordleEnv'?"),
        ("tests.train.test_environments:NoDocstring", "its method poke cannot be a tool"),
    ],
)
def test_a_misspelt_environment_or_an_undescribed_tool_fails_in_one_line_before_any_model_loads(
    tmp_path, monkeypatch, capsys, environment, said
):
    from reasonrl.cli import main
    from reasonrl.training import setup

    monkeypatch.setattr(setup, "load_model", lambda *a, **k: pytest.fail("a model loaded before the check"))
    argv = ["train", "grpo", *PAG_TINY, "rollout.multiturn=env", f"rollout.environment={environment}",
            f"run.output_dir={tmp_path}", "--quiet"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("reasonrl: error")]) == 1 and said in err[-1]
