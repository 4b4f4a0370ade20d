"""Read question/answer examples from the built-in datasets, local jsonl/parquet files, or `datasets`.

Malformed input fails with the file and line number; nothing is silently skipped.
"""

from __future__ import annotations

import difflib
import gzip
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from reasonrl.data.code_tasks import CodeTaskError, humaneval_example, mbpp_example
from reasonrl.data.examples import Example
from reasonrl.data.preferences import hh_prompt_example

HOLDOUT_BUCKETS = 5  # single-split sources hold out one row in five (by a stable hash) for evaluation


class DataError(ValueError):
    """Bad or missing data, with the file and line (or the field) at fault."""


@dataclass(frozen=True)
class Fields:
    """Where question and answer live in a row."""

    question: str = "question"
    answer: str = "answer"
    answer_after: str | None = None
    """If set, the reference answer is the text after the last occurrence of this marker (GSM8K: '#### ')."""


@dataclass(frozen=True)
class BuiltinDataset:
    files: dict[str, str]  # split -> file in reasonrl/data/builtin
    fields: Fields
    convert: Callable[[str, str, dict[str, Any], int], Example | None] | None = None
    """Rows that are not question/answer pairs (code tasks): (split, location, row, index) -> Example,
    or None for a row of another split of a shared file."""
    verifiable: bool = True
    """A program checks the answers (math, code); False for prompts only a judge can score."""


BUILTIN_DATASETS = {
    "gsm8k": BuiltinDataset(
        {"train": "gsm8k-train.jsonl.gz", "test": "gsm8k-test.jsonl.gz"}, Fields(answer_after="####")
    ),
    "math500": BuiltinDataset({"test": "math500-test.jsonl.gz"}, Fields(question="problem")),
    "aime2024": BuiltinDataset({"test": "aime2024-test.jsonl.gz"}, Fields(question="problem")),
    "humaneval": BuiltinDataset({"test": "humaneval-test.jsonl.gz"}, Fields(), humaneval_example),
    "mbpp": BuiltinDataset(
        dict.fromkeys(("train", "test", "validation", "prompt"), "mbpp.jsonl.gz"), Fields(), mbpp_example
    ),
    "hh-rlhf-harmless": BuiltinDataset(
        {"test": "hh-rlhf-harmless-test.jsonl.gz"}, Fields(), hh_prompt_example, verifiable=False
    ),
}
ALIASES = {"aime24": "aime2024", "math-500": "math500"}
GENERATED_TASKS = ("arithmetic",)  # built-in tasks generated on the fly (reasonrl.data.arithmetic), not files
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".gz")


def builtin_names(verifiable_only: bool = False) -> list[str]:
    """Every built-in dataset or task name (aliases excluded); ``verifiable_only``: those a program scores."""
    return [*GENERATED_TASKS, *(n for n, d in BUILTIN_DATASETS.items() if d.verifiable or not verifiable_only)]


def check_dataset_name(name: str) -> None:
    """Refuse, before anything loads, a name that is not built in, not an existing file and not a hub id.

    Only names that look like hub ids (``owner/name``) are left to `datasets`, so a misspelt built-in
    name fails at once with the nearest one instead of retrying a hub.
    """
    if ALIASES.get(name, name) in builtin_names() or Path(name).expanduser().exists():
        return
    if name.startswith((".", "/", "~")) or name.endswith(FILE_SUFFIXES):
        raise DataError(f"data file {name} does not exist")
    if "/" in name:
        return  # a `datasets` hub id
    guess = difflib.get_close_matches(name, [*builtin_names(), *ALIASES], n=1, cutoff=0.6)
    hint = f"did you mean '{ALIASES.get(guess[0], guess[0])}'? " if guess else ""
    raise DataError(
        f"unknown dataset '{name}'; {hint}(built-in: {', '.join(builtin_names())}; or a .jsonl/.parquet "
        "file, or a `datasets` hub id such as openai/gsm8k)"
    )


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def read_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, row) pairs of a .jsonl(.gz) or .parquet file; location is 'file:line'."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"reading {path} needs pyarrow: pip install 'reasonrl[data]'") from None
        for index, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}:row {index}", row
        return
    if not (name.endswith(".jsonl") or name.endswith(".jsonl.gz") or name.endswith(".json")):
        raise DataError(f"{path}: unsupported file type; give a .jsonl, .jsonl.gz or .parquet file")
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: malformed JSON line ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object per line, got {type(row).__name__}")
            yield f"{path}:{number}", row


def _example(location: str, row: dict[str, Any], fields: Fields, source: str, index: int) -> Example:
    for key in (fields.question, fields.answer):
        if key not in row:
            raise DataError(f"{location}: no field '{key}' (fields present: {', '.join(map(str, row)) or 'none'})")
    question, answer = row[fields.question], row[fields.answer]
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{location}: field '{fields.question}' must be a non-empty string")
    answer = str(answer).strip()
    if fields.answer_after is not None:
        if fields.answer_after not in answer:
            raise DataError(f"{location}: answer has no '{fields.answer_after}' marker before the final answer")
        answer = answer.rsplit(fields.answer_after, 1)[1].strip().replace(",", "")
    if not answer:
        raise DataError(f"{location}: empty answer in field '{fields.answer}'")
    task_type = str(row.get("task_type") or "math")
    return Example(id=f"{source}:{index}", question=question.strip(), answer=answer, task_type=task_type)


def _from_datasets(name: str, split: str, fields: Fields) -> list[Example]:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"'{name}' is not a built-in dataset or an existing file; loading it as a `datasets` name "
            "needs `pip install 'reasonrl[data]'`"
        ) from None
    try:
        table = datasets.load_dataset(name, split=split)
    except Exception as exc:  # the hub raises many types: missing name, no network, bad split
        raise DataError(f"could not load '{name}' (split {split}) with `datasets`: {exc}") from exc
    return [_example(f"{name}[{i}]", dict(row), fields, name, i) for i, row in enumerate(table)]


def load_examples(source: str, split: str = "train", fields: Fields | None = None) -> list[Example]:
    """All examples of one split of a built-in dataset, a local file (split ignored), or a `datasets` name."""
    name = ALIASES.get(source, source)
    if name in GENERATED_TASKS:
        raise DataError(f"'{name}' is a generated task, not a set of rows; give a dataset name or a .jsonl file")
    if name in BUILTIN_DATASETS:
        builtin = BUILTIN_DATASETS[name]
        if split not in builtin.files:
            raise DataError(f"built-in dataset '{name}' has no '{split}' split (it has {', '.join(builtin.files)})")
        path = Path(str(resources.files("reasonrl.data") / "builtin" / builtin.files[split]))
        if builtin.convert is not None:
            try:
                rows = [builtin.convert(split, loc, row, i) for i, (loc, row) in enumerate(read_rows(path))]
            except CodeTaskError as exc:
                raise DataError(str(exc)) from None
            return [row for row in rows if row is not None]
        return [_example(loc, row, builtin.fields, name, i) for i, (loc, row) in enumerate(read_rows(path))]
    fields = fields or Fields()
    path = Path(source).expanduser()
    if path.exists():
        examples = [_example(loc, row, fields, path.stem, i) for i, (loc, row) in enumerate(read_rows(path))]
        if not examples:
            raise DataError(f"{path} holds no examples")
        return examples
    check_dataset_name(source)
    return _from_datasets(source, split, fields)


def default_split(source: str) -> str:
    """The train split where a built-in dataset has one, else its only split (files are one split)."""
    builtin = BUILTIN_DATASETS.get(ALIASES.get(source, source))
    return "train" if builtin is None or "train" in builtin.files else next(iter(builtin.files))


def has_split(source: str, split: str) -> bool:
    """Whether a built-in dataset ships this split (files and `datasets` names are single-split here)."""
    name = ALIASES.get(source, source)
    return name in BUILTIN_DATASETS and split in BUILTIN_DATASETS[name].files


def in_holdout(example: Example) -> bool:
    """The stable one-in-five hold-out of single-split sources (by question text)."""
    digest = hashlib.sha256(example.question.encode()).hexdigest()
    return int(digest, 16) % HOLDOUT_BUCKETS == 0
