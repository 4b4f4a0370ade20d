"""Evaluation metrics and the `reasonrl eval` / `reasonrl train` commands on tiny-random."""

import json
import re

import pytest
import torch

from reasonrl.cli import main
from reasonrl.jobs.eval_metrics import majority_correct, sampled_metrics
from reasonrl.reward.verifier_protocol import RewardResult
from tests.train.test_loop import TINY

PARITY_REWARDS = """
def odd_answer(prompts, completions, solution, **kwargs):
    return [float(int(s) % 2) for s in solution]


def even_answer(prompts, completions, solution, **kwargs):
    return [1.0 - int(s) % 2 for s in solution]
"""


def result(extracted, correct):
    return RewardResult(float(correct), correct, {"extracted": extracted})


def test_sampled_metrics_hand_computed():
    problems = [
        [result("5", True), result("4", False), result("5", True)],  # avg 2/3, majority 5 (right), pass
        [result("1", False), result("2", False), result("2", False)],  # avg 0, majority wrong, no pass
        [result("7", True), result("8", False), result("8", False)],  # avg 1/3, majority 8 (wrong), pass
    ]
    metrics = sampled_metrics(problems)
    assert metrics["avg@k"] == pytest.approx((2 / 3 + 0 + 1 / 3) / 3)
    assert metrics["maj@k"] == pytest.approx(1 / 3)
    assert metrics["pass@k"] == pytest.approx(2 / 3)


def test_majority_vote_normalises_numbers_and_breaks_ties_by_order():
    assert majority_correct([result("0.5", True), result("1/2", True), result("3", False)])
    assert not majority_correct([result("3", False), result("4", True)])  # tie: the earliest wins
    assert not majority_correct([result(None, False)])


def test_eval_command_on_a_jsonl_file(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3))
    )
    out, records = tmp_path / "result.json", tmp_path / "answers.jsonl"
    argv = ["eval", "--model", "tiny-random", "--dataset", str(data), "--k", "2", "--max-new-tokens", "4"]
    assert main([*argv, "--output", str(out), "--records", str(records)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert result["problems"] == 3 and result["k"] == 2 and result["samples"] == 2  # --n is "samples"
    assert "n" not in result  # "n" would read as --n, the samples per problem
    for key in ("greedy_pass@1", "avg@k", "maj@k", "pass@k"):
        assert 0.0 <= result[key] <= 1.0
    answers = [json.loads(line) for line in records.read_text().splitlines()]  # one per greedy answer
    assert len(answers) == 3 and len({a["id"] for a in answers}) == 3
    assert all(1 <= a["response_tokens"] <= 4 and isinstance(a["correct"], bool) for a in answers)
    assert sum(a["correct"] for a in answers) / 3 == result["greedy_pass@1"]


def test_eval_takes_field_mappings_and_labels_the_greedy_score(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"What is {i} + 1?", "solution": str(i + 1)}) + "\n" for i in range(2))
    )
    args = ["eval", "--model", "tiny-random", "--dataset", str(data), "--max-new-tokens", "2"]
    assert main([*args, "--question-field", "problem", "--answer-field", "solution"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["problems"] == 2 and "greedy_pass@1" in result and "pass@1" not in result
    assert main(args) == 1
    assert "no field 'question' (fields present: problem, solution)" in capsys.readouterr().err


def test_eval_command_reports_bad_data(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    assert main(["eval", "--model", "tiny-random", "--dataset", str(bad)]) == 1
    assert f"{bad}:1: malformed JSON line" in capsys.readouterr().err


def test_eval_shows_progress_on_stderr_only_when_asked_and_stdout_stays_json(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3))
    )
    argv = ["eval", "--model", "tiny-random", "--dataset", str(data), "--k", "2", "--max-new-tokens", "4"]
    assert main(argv) == 0
    quiet = capsys.readouterr()  # stderr is no terminal here: no progress unless asked
    assert main([*argv, "--progress"]) == 0
    shown = capsys.readouterr()
    quiet_result, shown_result = json.loads(quiet.out), json.loads(shown.out)  # stdout holds the JSON alone
    assert quiet_result.pop("wall_seconds") > 0 and shown_result.pop("wall_seconds") > 0
    assert quiet_result == shown_result
    assert "problems" not in quiet.err and "eval" not in quiet.err
    last = {line.split(":")[0]: line for line in shown.err.splitlines()}  # each pass's last line
    for phase in ("eval greedy", "eval sampled"):
        assert re.fullmatch(
            rf"{phase}: 3/3 problems  acc [01]\.\d\d  \d+ tok/s  elapsed 0:00:\d\d  left 0:00:00", last[phase]
        )


def test_eval_in_engine_batches_samples_what_one_call_samples():
    from reasonrl.data.examples import Example
    from reasonrl.data.prompts import PromptEncoder
    from reasonrl.jobs.evaluate import scored_in_batches
    from reasonrl.models.load import load_model, load_tokenizer
    from reasonrl.rollout import SamplingParams, build_engine
    from reasonrl.rollout.scored import sample_and_score
    from reasonrl.timing import Progress

    class Unscored:
        def score_examples(self, examples, responses, context=None):
            return [result(None, False) for _ in responses]

    tokenizer = load_tokenizer("tiny-random")
    engine = build_engine("fast", load_model("tiny-random"), tokenizer, dtype=torch.float32, max_batch_sequences=4)
    examples = [Example(f"q{i}", f"What is {i} + 1?", str(i + 1)) for i in range(5)]
    encoder, params = PromptEncoder(tokenizer, "plain", 10**9), SamplingParams(6, temperature=1.0, seed=3)
    progress = Progress("eval", show=False)
    progress.stage("sampled", len(examples), "problems")
    batched = scored_in_batches(engine, tokenizer, Unscored(), encoder, examples, params, progress, repeats=3)
    whole = sample_and_score(engine, tokenizer, Unscored(), encoder, examples, params, repeats=3)
    assert [c.token_ids for c in batched.completions] == [c.token_ids for c in whole.completions]
    assert progress.state.done == 5 and progress.state.tokens == sum(len(c.token_ids) for c in whole.completions)


def test_train_command_writes_a_run_directory(tmp_path, capsys):
    overrides = [
        "model.name_or_path=tiny-random",
        "train.rollout_steps=1",
        "rollout.max_response_tokens=8",
        "data.eval_prompts=4",
        "algo.kl_placement=none",
        f"run.output_dir={tmp_path}",
        "run.name=cli",
    ]
    assert main(["train", "grpo", *overrides, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy:" in out and "summary:" in out
    run_dir = tmp_path / "cli"
    assert json.loads((run_dir / "run.json").read_text())["preset"] == "grpo"
    assert (run_dir / "final" / "config.json").exists()
    # --resume continues the same directory; a finished run has nothing left to do
    assert main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    assert main(["train", "grpo", f"run.output_dir={tmp_path}", "--resume", "auto", "--quiet"]) == 0
    assert f"reasonrl: {run_dir} is finished: all 1 steps" in capsys.readouterr().err  # auto found the newest grpo run
    assert (
        main(["eval", "--model", str(run_dir), "--dataset", "arithmetic", "--limit", "3", "--max-new-tokens", "4"]) == 0
    )


def write_zebra_rows(path, numbers):
    """Rows under other field names than eval's defaults: problem / solution."""
    rows = [{"problem": f"A zebra has {i} stripes. How many?", "solution": str(i)} for i in numbers]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def custom_task_run(tmp_path_factory):
    """A tiny run on a custom jsonl (other field names) scored by a reward function file: a run whose
    accuracy is the share of odd answers among the problems it evaluated."""
    root = tmp_path_factory.mktemp("custom")
    data, rewards = write_zebra_rows(root / "zoo.jsonl", range(40)), root / "parity.py"
    rewards.write_text(PARITY_REWARDS)
    overrides = [*TINY, "train.rollout_steps=1", f"run.output_dir={root}", "run.name=zoo", f"data.dataset={data}"]
    overrides += ["data.question_field=problem", "data.answer_field=solution"]
    overrides += [f"reward.functions=['{rewards}:odd_answer']"]
    assert main(["train", "grpo", *overrides, "--quiet"]) == 0
    return root / "zoo", rewards


def test_eval_of_a_run_directory_reproduces_its_own_evaluation(custom_task_run, tmp_path, capsys):
    run_dir, rewards = custom_task_run
    records = tmp_path / "answers.jsonl"
    assert main(["eval", "--model", str(run_dir), "--records", str(records)]) == 0
    result = json.loads(capsys.readouterr().out)
    summary = json.loads((run_dir / "summary.json").read_text())
    # its held-out zoo problems (data.eval_prompts of them), asked from its fields, scored by its function:
    # 5 of those 8 answers are odd, as the run's own evaluation found
    assert (result["dataset"], result["problems"]) == (str(run_dir.parent / "zoo.jsonl"), 8)
    assert result["reward_functions"] == [f"{rewards}:odd_answer"]
    assert result["greedy_pass@1"] == summary["accuracy_after"] == 0.625
    assert {json.loads(line)["data_source"] for line in records.read_text().splitlines()} == {"zoo"}


def test_eval_options_override_what_a_run_directory_records(custom_task_run, tmp_path, capsys):
    run_dir, rewards = custom_task_run
    odd = write_zebra_rows(tmp_path / "odd.jsonl", [1, 3, 5])
    argv = ["eval", "--model", str(run_dir), "--dataset", str(odd), "--max-new-tokens", "2"]
    assert main(argv) == 0  # every row of the file given, read with the run's fields, scored by its function
    result = json.loads(capsys.readouterr().out)
    assert (result["dataset"], result["problems"], result["greedy_pass@1"]) == (str(odd), 3, 1.0)
    assert main([*argv, f"reward.functions=['{rewards}:even_answer']"]) == 0
    assert json.loads(capsys.readouterr().out)["greedy_pass@1"] == 0.0
    assert main([*argv, "--question-field", "question"]) == 1
    assert "no field 'question' (fields present: problem, solution)" in capsys.readouterr().err


def test_eval_of_a_model_takes_reward_functions_as_train_does(tmp_path, capsys):
    data = tmp_path / "mixed.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1), "data_source": "ab"[i % 2]} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["eval", "--model", "tiny-random", "--dataset", str(data), "--max-new-tokens", "2"]
    assert main([*argv, "reward.functions=['tests.reward_functions:only_source_a']"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {source: m["greedy_pass@1"] for source, m in result["per_source"].items()} == {"a": 1.0, "b": 0.0}
    assert main([*argv, "data.dataset=gsm8k"]) == 2
    assert "eval takes reward.* settings only as KEY=VALUE (got data.dataset=gsm8k)" in capsys.readouterr().err


def test_train_command_refuses_a_bad_config_before_loading(capsys):
    assert main(["train", "dapo", "train.minibatch_sequences=48"]) == 2
    assert "does not divide" in capsys.readouterr().err


def test_eval_and_rm_train_options_default_to_their_settings():
    from reasonrl.cli import build_parser
    from reasonrl.jobs.evaluate import EvalSettings
    from reasonrl.jobs.reward_model import RewardModelRun

    parser, settings = build_parser(), EvalSettings()
    options = vars(parser.parse_args(["eval"]))
    assert (options["model"], options["dataset"], options["k"], options["template"]) == (
        "smollm2-135m",
        None,  # a run directory's own, else arithmetic
        1,
        None,  # a run directory's own, else answer_line
    )
    assert (options["fire"], options["fire_temperature"], options["fire_top_k"]) == (False, 30.0, 16)
    renamed = {"prompt_template": "template"}
    for name in ("model", "dataset", "k", "temperature", "top_p", "max_new_tokens", "limit", "prompt_template", "seed"):
        assert options[renamed.get(name, name)] == getattr(settings, name), name
    options, rm = vars(parser.parse_args(["rm", "train"])), RewardModelRun()
    names = ("kind", "model", "data", "out", "steps", "batch_pairs", "lr", "eval_pairs", "seed")
    for name in (*names, "max_prompt_tokens", "max_response_tokens"):
        assert options[name] == getattr(rm, name), name


def test_fire_sampling_parameters_come_from_the_fire_config():
    from reasonrl.config.rollout_schema import FireConfig
    from reasonrl.rollout.sampling import FireParams, fire_params

    assert fire_params(FireConfig()) is None  # off unless enabled
    assert fire_params(FireConfig(enabled=True, top_k=4, positions=(0, 1))) == FireParams(30.0, 4, (0, 1))
    assert FireParams() == FireParams(30.0, 16, (0,))  # the authors' implementation, as FireConfig's defaults


def test_eval_command_with_fire(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(2))
    )
    args = ["eval", "--model", "tiny-random", "--dataset", str(data), "--k", "2", "--max-new-tokens", "3", "--fire"]
    assert main([*args, "--fire-top-k", "4"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["fire"] is True and result["problems"] == 2


def test_pag_metrics_hand_computed():
    from reasonrl.algo.pag import VERDICT_CORRECT, VERDICT_UNPARSED, VERDICT_WRONG
    from reasonrl.jobs.eval_metrics import pag_metrics

    attempts = [
        [True],  # right, judged correct: no revision
        [False, True],  # wrong, judged wrong, revised to right
        [True, False],  # right, judged wrong (a verifier error), revised to wrong
        [False, False],  # wrong, verdict unparsed (revised at evaluation), still wrong
    ]
    verdicts = [[VERDICT_CORRECT], [VERDICT_WRONG], [VERDICT_WRONG], [VERDICT_UNPARSED]]
    metrics = pag_metrics(attempts, verdicts)
    assert metrics == {
        "acc@t1": 0.5,
        "acc@final": 0.5,
        "verifier_accuracy": 0.5,  # 2 of 4 verdicts match the truth of the attempt they judge
        "delta_i_to_c": 0.25,
        "delta_c_to_i": 0.25,
        "revision_rate": 0.75,
    }


def test_eval_with_the_pag_protocol_reports_its_metrics_next_to_the_usual_ones(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3))
    )
    args = ["eval", "--model", "tiny-random", "--dataset", str(data), "--max-new-tokens", "4", "--protocol", "pag"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert "greedy_pass@1" in result
    for key in ("acc@t1", "acc@final", "delta_i_to_c", "delta_c_to_i", "revision_rate"):
        assert 0.0 <= result[key] <= 1.0, key
    # tiny-random never writes a verdict: each answer is judged "unparsed", so evaluation revises it
    assert result["revision_rate"] == 1.0 and result["verifier_accuracy"] == 0.0


def test_eval_with_self_verify_best_of_k(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(2))
    )
    args = ["eval", "--model", "tiny-random", "--dataset", str(data), "--max-new-tokens", "4", "--k", "3"]
    assert main([*args, "--self-verify-bon"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.0 <= result["self_verify_bon@k"] <= result["pass@k"]  # it keeps one of the k answers


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a CUDA device")
def test_eval_on_cuda_without_a_gpu_says_so_before_loading(capsys):
    argv = ["eval", "--model", "tiny-random", "--limit", "1", "--max-new-tokens", "2", "--device", "cuda"]
    assert main(argv) != 0
    assert "sees no CUDA device" in capsys.readouterr().err


def even_reply(prompts, completions, **kwargs):
    """TRL shape, for an environment run: 1.0 when the episode's last reply has an even number of characters."""
    return [float(len(completion[-1]["content"]) % 2 == 0) for completion in completions]


def test_eval_of_an_environment_run_plays_its_environment(tmp_path, capsys):
    """``reasonrl eval RUN`` of an environment run plays the run's episodes (its environment, turns, tools and
    reward functions) as the run's own evaluation did, instead of one answer scored by the verifier."""
    rows = tmp_path / "wordle.jsonl"
    prompt = "Play Wordle, game {}. Use the tool `guess` to make a guess."
    rows.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": prompt.format(n)}], "game": n}) + "\n"
                            for n in range(40)))  # fmt: skip
    environment = "rollout.environment=tests.train.test_environments:WordleEnv"
    overrides = [*TINY, "train.rollout_steps=1", f"run.output_dir={tmp_path}", "run.name=wordle",
                 f"data.dataset={rows}", "rollout.multiturn=env", environment,
                 "reward.functions=[tests.test_eval:even_reply]", "rollout.max_prompt_tokens=2048",
                 "train.microbatch_tokens=4096", "rollout.max_turns=2"]  # fmt: skip
    assert main(["train", "grpo", *overrides, "--quiet"]) == 0
    capsys.readouterr()
    run_dir = tmp_path / "wordle"
    assert main(["eval", "--model", str(run_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert result["environment"] == "tests.train.test_environments:WordleEnv" and result["problems"] == 8
    assert result["greedy_pass@1"] == summary["accuracy_after"]
    assert result["turns_mean"] >= 1 and "tool_calls_mean" in result
    assert main(["eval", "--model", str(run_dir), "--k", "2"]) == 2  # an episode's eval is greedy
    assert "is an environment run: its evaluation plays one greedy episode per problem" in capsys.readouterr().err
