"""Process rewards for code (arXiv 2410.17621): the binary search, the lines of a response, and the
labelling run (scripted programs and completions, the real sandbox), including a killed run's resume."""

import json
import math
import random
from types import SimpleNamespace

import pytest

from reasonrl.data.code_tasks import code_reference
from reasonrl.data.examples import Example
from reasonrl.data.prompts import PromptEncoder
from reasonrl.jobs.prm_label import LabelStore, PRMLabelRun, label_programs, read_records, sample_programs
from reasonrl.models.load import load_tokenizer
from reasonrl.reward.code import CodeVerifier
from reasonrl.reward.prm import DeadLineSearch, first_dead_line, line_labels, response_lines, token_char_ends
from reasonrl.reward.scoring_pool import ScoringPool
from reasonrl.rollout.fake import FakeEngine


def test_first_dead_line_equals_exhaustive_labelling_within_its_call_budget():
    rng = random.Random(0)
    for _ in range(500):
        n_lines = rng.randint(0, 200)
        dead_from = rng.randint(1, n_lines + 1)  # n_lines + 1: every prefix alive
        calls = []

        def alive(line, n_lines=n_lines, dead_from=dead_from, calls=calls):
            assert 1 <= line <= n_lines
            calls.append(line)
            return line < dead_from

        exhaustive = next((line for line in range(1, n_lines + 1) if not alive(line)), None)
        calls.clear()
        assert first_dead_line(alive, n_lines) == exhaustive
        assert len(calls) <= (math.ceil(math.log2(n_lines)) + 1 if n_lines else 0)
        assert len(set(calls)) == len(calls)  # no prefix probed twice


def test_a_finished_search_refuses_more_answers():
    search = DeadLineSearch(1)
    search.tell(False)
    assert search.query is None and search.result == 1
    with pytest.raises(RuntimeError, match="nothing was asked"):
        search.tell(True)


def test_labels_are_one_before_the_first_dead_line_and_zero_from_it():
    assert line_labels(3, 5) == [1, 1, 0, 0, 0]
    assert line_labels(1, 2) == [0, 0]
    assert line_labels(None, 3) == [1, 1, 1]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")  # one token per byte: a line's end token is its newline's index


def test_lines_merge_blank_lines_mark_comments_and_end_at_the_newline_token(tokenizer):
    text = "\n\ndef f(x):\n    # double it\n\n\n    return 2 * x\n  \nprint(f(1))"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    lines = response_lines(text, token_char_ends(tokenizer, ids))
    assert [line.text for line in lines] == [
        "\n\ndef f(x):\n",  # leading blank lines join the first line
        "    # double it\n\n\n",  # blank lines join the line before
        "    return 2 * x\n  \n",
        "print(f(1))",  # the last line ends at the last token
    ]
    assert [line.neutral for line in lines] == [False, True, False, False]
    assert [line.end_token for line in lines] == [
        text.index(":\n") + 1,
        text.index("\n    return"),
        text.index("\nprint"),
        len(ids) - 1,
    ]
    assert response_lines("", []) == []


def test_only_new_code_lines_can_earn_dense_reward():
    text = "Here is it:\n```python\nimport os\nimport os\ndef f(x):\n    return x\n```\nDone.\u2028Really"
    lines = response_lines(text, list(range(1, len(text) + 1)))  # one token per character
    assert [(line.text.strip(), line.neutral) for line in lines] == [
        ("Here is it:", True),  # prose around the code
        ("```python", True),  # a fence line
        ("import os", False),
        ("import os", True),  # a repeat
        ("def f(x):", False),
        ("return x", False),
        ("```", True),
        ("Done.\u2028Really", True),  # only "\n" ends a line
    ]


@pytest.mark.parametrize(
    ("prefix", "completion", "kept"),
    [
        # inside a code block, a completion ends where the block does
        ("```python\ndef add(a, b):\n", "    return a + b\n```\nMore ```x```", "    return a + b\n```"),
        ("def add(a):\n", "    return a\ndef add(a, b):\n    return a + b\n", None),  # starts over: abandoned
        ("Let me think.\n", "def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a + b\n"),
    ],
)
def test_a_probe_completion_must_continue_its_prefix(prefix, completion, kept):
    from reasonrl.jobs.prm_label import continuation

    assert continuation(prefix, completion, "add") == kept


# --- the labelling run, on hand-written programs whose first bad line is known --------------------------

TESTS = "assert add(1, 2) == 3\nassert add(5, 5) == 10\n"
PROGRAMS = {
    # line 3 returns a wrong value: no completion can repair it
    "bad-3": "def add(a, b):\n    total = a + b\n    return total - 1\n",
    # line 1 already gets the signature wrong
    "bad-1": "def add(a):\n    return a\n",
    # the same, and its completions start over with a right definition: that does not revive line 1
    "restart": "def add(a):\n    return a\n",
    "good": "def add(a, b):\n    return a + b\n",
}


def scripted_engine(tokenizer, calls):
    """Programs by prompt; a completion of a prefix returns the right sum with what the prefix defined."""
    stop = tokenizer.eos_token_id

    def respond(prompt, rng):
        text = tokenizer.decode(prompt, skip_special_tokens=False)
        response = text.rsplit("<|im_start|>assistant\n", 1)[1]
        name = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
        if not response:
            reply = PROGRAMS[name]
        else:
            calls.append((name, response))
            reply = "    return total\n" if "total = a + b" in response else "    return a + b\n"
            if name == "restart":
                reply = "    return a\n\ndef add(a, b):\n    return a + b\n"
        return [*tokenizer(reply, add_special_tokens=False)["input_ids"], stop]

    return FakeEngine(respond, stop_token_ids=[stop])


def label_run(tmp_path, tokenizer, calls, fail_after=None):
    examples = [Example(name, name, code_reference(TESTS, "add"), task_type="code") for name in PROGRAMS]
    engine = scripted_engine(tokenizer, calls)
    if fail_after is not None:  # the run is killed during its probes
        generate = engine.generate

        def dying(prompts, params):
            if len(calls) >= fail_after:
                raise KeyboardInterrupt
            return generate(prompts, params)

        engine.generate = dying
    policy = SimpleNamespace(engine=engine, tokenizer=tokenizer, encoder=PromptEncoder(tokenizer, "plain", 512))
    settings = PRMLabelRun(completions=2, max_new_tokens=128, out=str(tmp_path / "labels.jsonl"))
    store = LabelStore(tmp_path / "labels.jsonl")
    with ScoringPool(CodeVerifier(), workers=1, timeout=20.0) as scorer:
        sample_programs(policy, scorer, examples, "initial", settings, store, lambda n: None)
        label_programs(policy, scorer, {e.id: e for e in examples}, "initial", settings, store, lambda n: None)
    return {row["key"].split("/")[1]: row for row in read_records(tmp_path / "labels.jsonl")}


def test_labelling_finds_the_first_bad_line_of_known_programs(tmp_path, tokenizer):
    calls = []
    rows = label_run(tmp_path, tokenizer, calls)
    assert rows["bad-3"]["labels"] == [1, 1, 0] and rows["bad-3"]["first_dead_line"] == 3
    assert rows["bad-1"]["labels"] == [0, 0] and rows["bad-1"]["first_dead_line"] == 1
    assert rows["restart"]["labels"] == [0, 0]
    assert rows["good"]["labels"] == [1, 1] and rows["good"]["passed"] and rows["good"]["completions"] == 0
    # a failing program's last prefix is known dead; the others cost K completions per probe, at most
    # ceil(log2 (L - 1)) + 1 probes, where exhaustive labelling spends K on each of its L - 1 prefixes
    assert rows["bad-3"]["completions"] == 2 * 1 and rows["bad-3"]["completions_exhaustive"] == 2 * 2
    assert rows["bad-1"]["completions"] == 2 * 1 and rows["bad-1"]["completions_exhaustive"] == 2 * 1
    assert rows["bad-3"]["sandbox_seconds"] > 0 and rows["bad-1"]["sandbox_seconds"] > 0
    assert rows["restart"]["sandbox_seconds"] == 0  # its completions abandon the prefix: nothing to run
    assert all(len(row["lines"]) == len(row["labels"]) for row in rows.values())


def test_a_killed_labelling_run_resumes_without_probing_a_prefix_twice(tmp_path, tokenizer):
    reference_calls = []
    expected = label_run(tmp_path / "whole", tokenizer, reference_calls)
    calls = []
    with pytest.raises(KeyboardInterrupt):
        label_run(tmp_path / "killed", tokenizer, calls, fail_after=2)
    with (tmp_path / "killed" / "labels.jsonl.progress").open("a") as handle:
        handle.write('{"kind": "probe", "key": "torn')  # killed mid-write
    probed_before = len(calls)
    resumed = label_run(tmp_path / "killed", tokenizer, calls)
    assert {k: r["labels"] for k, r in resumed.items()} == {k: r["labels"] for k, r in expected.items()}
    assert {k: r["completions"] for k, r in resumed.items()} == {k: r["completions"] for k, r in expected.items()}
    assert len(calls) == len(reference_calls)  # the resumed run spent only what the killed one had not
    assert probed_before > 0 and sorted(calls) == sorted(reference_calls)
    progress = (tmp_path / "killed" / "labels.jsonl.progress").read_text().splitlines()
    assert all(json.loads(line) for line in progress)  # the torn line was cut off


def test_prm_label_runs_end_to_end_on_a_real_model_and_reports_its_cost(tmp_path, capsys):
    from reasonrl.cli import main

    out = tmp_path / "labels.jsonl"
    argv = ["prm", "label", "--model", "tiny-random", "--dataset", "mbpp", "--limit", "2", "--progress",
            "--programs-per-prompt", "2", "--completions", "2", "--max-new-tokens", "24", "--out", str(out),
            "model.dtype=float32", "rollout.max_prompt_tokens=2048", "reward.workers=1"]  # fmt: skip
    assert main(argv) == 0
    rows = read_records(out)
    assert len(rows) == 4 and all(len(r["labels"]) == len(r["lines"]) for r in rows)
    err = capsys.readouterr().err
    assert "prm label initial sampling: 2/2 prompts" in err and "prm label initial labelling: 4/4 programs" in err
    assert main(argv) == 0  # a finished run started again labels nothing more
    assert len(read_records(out)) == 4


# --- the PRM ---------------------------------------------------------------------------------------------


def test_auc_is_the_chance_a_positive_outscores_a_negative():
    from reasonrl.reward.prm import binary_auc

    assert binary_auc([0.9, 0.8, 0.1], [1, 1, 0]) == 1.0
    assert binary_auc([0.1, 0.9], [1, 0]) == 0.0
    assert binary_auc([0.5, 0.5, 0.2, 0.7], [1, 0, 0, 1]) == (1 + 1 + 0.5 + 1) / 4  # a tie counts 1/2
    assert binary_auc([0.3, 0.4], [1, 1]) is None


def synthetic_rows(tokenizer, count, seed):
    """Programs of 4 lines; from the line that says `bad`, if any, every line is dead."""
    rng, rows = random.Random(seed), []
    for i in range(count):
        bad = rng.choice([None, 1, 2, 3, 4])
        texts = [("x = bad\n" if n == bad else f"y{n} = {rng.randint(0, 9)}\n") for n in range(1, 5)]
        ids = tokenizer("".join(texts), add_special_tokens=False)["input_ids"]
        lines = response_lines("".join(texts), token_char_ends(tokenizer, ids))
        prompt = tokenizer(f"<|im_start|>user\nprogram {i}<|im_end|>\n", add_special_tokens=False)["input_ids"]
        rows.append({"group": f"f{i}", "prompt_token_ids": prompt, "response_token_ids": ids,
                     "lines": [line.to_json() for line in lines], "labels": line_labels(bad, 4)})  # fmt: skip
    return rows


def test_prm_training_learns_line_labels_it_was_not_shown(tokenizer):
    import torch

    from reasonrl.models.value import value_model_from_policy
    from reasonrl.reward.prm import labelled_programs, prm_metrics, train_prm

    torch.manual_seed(0)
    train = labelled_programs(synthetic_rows(tokenizer, 48, 0), tokenizer.eos_token_id, 64, 64)
    held_out = labelled_programs(synthetic_rows(tokenizer, 24, 1), tokenizer.eos_token_id, 64, 64)
    model = value_model_from_policy("tiny-random")
    before = prm_metrics(model, held_out, torch.float32)
    history = train_prm(model, train, steps=60, batch_programs=8, lr=1e-3, head_lr=1e-2)
    after = prm_metrics(model, held_out, torch.float32)
    assert sum(h["loss"] for h in history[-10:]) < sum(h["loss"] for h in history[:10])
    assert after["mse"] < before["mse"] and after["auc"] > 0.9, (before, after)


def test_rm_train_prm_trains_on_the_labels_of_prm_label_and_saves_a_value_model(tmp_path, tokenizer):
    from reasonrl.cli import main
    from reasonrl.jobs.reward_model import split_groups
    from reasonrl.models.value import load_value_model

    data = tmp_path / "labels.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in synthetic_rows(tokenizer, 20, 2)))
    out = tmp_path / "prm"
    argv = ["rm", "train", "--kind", "prm", "--model", "tiny-random", "--data", str(data), "--out", str(out),
            "--steps", "3", "--batch-pairs", "4", "--max-prompt-tokens", "64",
            "--max-response-tokens", "64"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["held_out_programs"] == 4 and summary["train_programs"] == 16
    for side in ("held_out_before", "held_out_after"):
        assert set(summary[side]) == {"lines", "positive_fraction", "line_accuracy", "auc", "mse"}
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    assert load_value_model(out).head.weight.shape[0] == 1
    # programs of one prompt never straddle the split
    from reasonrl.reward.prm import labelled_programs

    programs = labelled_programs(synthetic_rows(tokenizer, 10, 3) * 2, tokenizer.eos_token_id, 64, 64)
    train, held_out = split_groups(programs, 0.2, 0)
    assert not {p.group for p in train} & {p.group for p in held_out} and len(held_out) == 4
