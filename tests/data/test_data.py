"""Tasks, loaders and the resumable training stream."""

import gzip
import json

import pytest

from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.loaders import DataError, Fields, load_examples
from reasonrl.data.prompts import user_message
from reasonrl.data.source import (
    DataSpec,
    TrainingStream,
    benchmark_examples,
    check_sources,
    eval_examples,
    training_examples,
)


def test_arithmetic_is_seeded_and_splits_are_disjoint():
    task = ArithmeticTask(digits=2, operations="+", seed=3)
    assert [task.train_example(i) for i in range(5)] == [ArithmeticTask(2, "+", 3).train_example(i) for i in range(5)]
    assert task.train_example(0) != ArithmeticTask(2, "+", 4).train_example(0)
    held_out = {frozenset(e.id.split(" + ")) for e in task.eval_examples(300)}
    trained = {frozenset(task.train_example(i).id.split(" + ")) for i in range(3000)}
    assert len(held_out) == 300 and not held_out & trained  # commuted twins count as the same problem
    assert task.eval_examples(50) == ArithmeticTask(2, "+", seed=99).eval_examples(50)  # independent of run seed


def test_arithmetic_answers_and_difficulty():
    example = ArithmeticTask(digits=3, operations="*").train_example(0)
    a, b = (int(x) for x in example.id.split(" * "))
    assert 100 <= a <= 999 and 100 <= b <= 999 and example.answer == str(a * b)
    assert example.question == f"What is {a} * {b}?"
    with pytest.raises(ValueError, match="'\\+-\\*'"):
        ArithmeticTask(operations="/")


def test_builtin_datasets():
    gsm = load_examples("gsm8k", "test")
    assert len(gsm) == 1319 and gsm[0].answer == "18" and gsm[0].question.startswith("Janet")
    assert len(load_examples("gsm8k", "train")) == 7473
    math = load_examples("math500", "test")
    assert len(math) == 500 and math[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    aime = load_examples("aime24", "test")
    assert len(aime) == 30 and aime[0].answer == "204"
    with pytest.raises(DataError, match="has no 'train' split"):
        load_examples("math500", "train")


def test_malformed_jsonl_fails_with_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": 2\n')
    with pytest.raises(DataError, match=rf"{path}:3: malformed JSON line"):
        load_examples(str(path))
    path.write_text('{"question": "a", "answer": "1"}\n{"query": "b", "answer": "2"}\n')
    with pytest.raises(DataError, match=rf"{path}:2: no field 'question' \(fields present: query, answer\)"):
        load_examples(str(path))
    path.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r":1: expected a JSON object"):
        load_examples(str(path))
    with pytest.raises(DataError, match="does not exist"):
        load_examples(str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"question": ' + "[" * 100_000 + "]" * 100_000 + ', "answer": "1"}', "JSON nested deeper than 64 levels"),
        ('{"question": "q", "answer": "1", "meta": ' + "[" * 65 + "]" * 65 + "}", "JSON nested deeper than 64 levels"),
        ('{"question": "q", "answer": ' + "9" * 5000 + "}", "unreadable JSON line"),
    ],
)
def test_hostile_json_rows_fail_with_file_and_line(tmp_path, line, error):
    path = tmp_path / "hostile.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n' + line + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: {error}"):
        load_examples(str(path))


def test_a_truncated_parquet_file_fails_naming_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": f"q{i}", "answer": str(i)} for i in range(50)]), path)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(DataError, match=rf"{path}: not a readable parquet file"):
        load_examples(str(path))


def test_field_mapping_gzip_and_parquet(tmp_path):
    rows = [{"q": f"What is {i}+1?", "a": i + 1} for i in range(10)]
    gz = tmp_path / "rows.jsonl.gz"
    with gzip.open(gz, "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows))
    examples = load_examples(str(gz), fields=Fields(question="q", answer="a"))
    assert [e.answer for e in examples] == [str(i + 1) for i in range(10)]
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    assert load_examples(str(parquet), fields=Fields(question="q", answer="a")) == [
        type(e)(id=f"rows:{i}", question=e.question, answer=e.answer, data_source="rows")
        for i, e in enumerate(examples)
    ]


def test_single_split_sources_hold_out_one_in_five(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(200)))
    spec = DataSpec(dataset=str(path))
    train = {e.id for e in training_examples(spec)}
    held = [e.id for e in eval_examples(spec, 1000)]
    assert train.isdisjoint(held) and len(train) + len(held) == 200 and len(held) == 40  # one of every five rows
    assert len(benchmark_examples(str(path), None)) == 200  # `reasonrl eval` uses every row
    # rows added at the end leave the hold-out of the rows before them as it was
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(300)))
    assert [e.id for e in eval_examples(spec, 1000)][:40] == held


def test_a_prompt_repeated_in_every_row_is_held_out_by_row(tmp_path):
    # TRL's environment examples train on `[prompt] * 1000`: rows, not texts, are held out
    path = tmp_path / "same.jsonl"
    row = {"prompt": [{"role": "user", "content": "Guess the number."}], "answer": "7"}
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(100)))
    spec = DataSpec(dataset=str(path))
    train, held = training_examples(spec), eval_examples(spec, 200)
    assert len(train) == 80 and len(held) == 20
    assert {e.id for e in train}.isdisjoint(e.id for e in held)
    assert [e.id for e in eval_examples(spec, 8)] == [e.id for e in held[:8]]


def test_gsm8k_trains_on_train_and_evaluates_on_test():
    spec = DataSpec(dataset="gsm8k")
    assert eval_examples(spec, 5) == load_examples("gsm8k", "test")[:5]
    assert len(training_examples(spec)) == 7473


def test_training_stream_resumes_exactly(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(30)))
    for spec in (DataSpec(), DataSpec(dataset=str(path))):
        whole = TrainingStream(spec, seed=5).take(40)  # crosses an epoch boundary for the file
        first = TrainingStream(spec, seed=5)
        head = first.take(17)
        resumed = TrainingStream(spec, seed=5)
        resumed.load_state_dict(first.state_dict())
        assert head + resumed.take(23) == whole


def test_prompt_templates_ask_for_a_parseable_answer():
    assert user_message("What is 2 + 2?", "answer_line").endswith("as 'Answer: <answer>'.")
    assert "\\boxed{}" in user_message("x", "boxed")


def test_a_misspelt_dataset_name_suggests_the_built_in_one_without_asking_a_hub(monkeypatch):
    import reasonrl.data.loaders as loaders

    asked = []
    monkeypatch.setattr(loaders, "_from_datasets", lambda name, split, fields: asked.append(name) or [])
    with pytest.raises(
        DataError, match=r"unknown dataset 'gsm8kk'; did you mean 'gsm8k'\? \(built-in: arithmetic, gsm8k"
    ):
        load_examples("gsm8kk")
    with pytest.raises(DataError, match="did you mean 'arithmetic'"):
        check_sources(DataSpec(dataset="arithmetc"))
    with pytest.raises(DataError, match="did you mean 'aime2024'"):
        check_sources(DataSpec(dataset="gsm8k+aime25"))  # each part of a mixture
    with pytest.raises(DataError, match=r"data file missing\.jsonl does not exist"):
        check_sources(DataSpec(dataset="arithmetic", eval_dataset="missing.jsonl"))
    assert asked == []
    check_sources(DataSpec(dataset="openai/gsm8k+aime24"))  # a hub id and an alias pass the check
    load_examples("openai/gsm8k")
    assert asked == ["openai/gsm8k"]  # only names that look like hub ids reach `datasets`
