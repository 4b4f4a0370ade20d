"""Read question/answer examples from the built-in datasets, local jsonl/parquet files, or `datasets`.

Malformed input fails with the file and line number; nothing is silently skipped.
"""

from __future__ import annotations

import difflib
import gzip
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from reasonrl.data.code_tasks import humaneval_example, mbpp_example
from reasonrl.data.countdown import countdown_examples
from reasonrl.data.examples import Example, RowError
from reasonrl.data.functions import function_examples
from reasonrl.data.guess_number import guess_number_examples
from reasonrl.data.images import IMAGES_FIELD, ImageError, row_images
from reasonrl.data.preferences import hh_prompt_example
from reasonrl.data.visual_tasks import PROBLEMS as VISUAL_PROBLEMS
from reasonrl.data.visual_tasks import visual_examples
from reasonrl.errors import ReasonRLError
from reasonrl.hub_access import hub_unreachable

HOLDOUT_BUCKETS = 5  # single-split sources hold out one row in five (by its position) for evaluation


class DataError(ReasonRLError, ValueError):
    """Bad or missing data, with the file and line (or the field) at fault."""


@dataclass(frozen=True)
class Fields:
    """Where question and answer live in a row."""

    question: str = "question"
    answer: str = "answer"
    answer_after: str | None = None
    """If set, the reference answer is the text after the last occurrence of this marker (GSM8K: '#### ')."""
    named_by: Literal["config", "options"] = "config"
    """How the user names the fields, which a missing field's error tells them to set: the config's
    ``data.question_field`` (train and the data commands), or a command's ``--question-field`` (eval)."""
    answer_optional: bool = False
    """A row may lack the answer (its reference is then ""): an environment run, which the environment or the
    reward functions reward (TRL needs only a ``prompt``); the verifier refuses to score such a row."""

    def setting(self, kind: Literal["question", "answer"]) -> str:
        """The setting that names the field of ``kind``."""
        return f"--{kind}-field" if self.named_by == "options" else f"data.{kind}_field"


@dataclass(frozen=True)
class BuiltinDataset:
    files: dict[str, str | None]  # split -> file in reasonrl/data/builtin (None: ``generate`` makes the rows)
    fields: Fields
    convert: Callable[[str, str, dict[str, Any], int], Example | None] | None = None
    """Rows that are not question/answer pairs (code tasks): (split, location, row, index) -> Example,
    or None for a row of another split of a shared file."""
    verifiable: bool = True
    """A program checks the answers (math, code); False for prompts only a judge can score."""
    generate: Callable[[str], list[Example]] | None = None
    """A split's rows made in code (a generated, seeded task) instead of read from a file."""


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
    "functions": BuiltinDataset(dict.fromkeys(("train", "test")), Fields(), generate=function_examples),
    # the shipped environments' games (rollout.environment=countdown, guess_number)
    "countdown": BuiltinDataset(dict.fromkeys(("train", "test")), Fields(), generate=countdown_examples),
    "guess_number": BuiltinDataset(dict.fromkeys(("train", "test")), Fields(), generate=guess_number_examples),
    **{
        task: BuiltinDataset(dict.fromkeys(("train", "test")), Fields(), generate=partial(visual_examples, task))
        for task in VISUAL_PROBLEMS
    },
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


MAX_JSON_DEPTH = 64
"""Deepest nesting of lists and objects a data row may have: real rows nest a few levels (chat messages,
test cases); a row nested deeper would only exhaust the recursion of whatever reads it next."""


def _depth(value: Any) -> int:
    """How deeply lists and dicts nest in ``value`` (iterative: any depth is measured without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:  # deeper than the limit is enough to refuse
                stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def json_object(text: str, where: str) -> dict[str, Any]:
    """One JSON object of a data file (``where``: 'file:line'): malformed JSON, anything but an object, or
    nesting deeper than MAX_JSON_DEPTH is a DataError naming the place."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: malformed JSON line ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's digit limit
        raise DataError(f"{where}: unreadable JSON line ({exc})") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object per line, got {type(row).__name__}")
    if _depth(row) > MAX_JSON_DEPTH:
        raise DataError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return row


def read_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, row) pairs of a .jsonl(.gz) or .parquet file; location is 'file:line'."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"reading {path} needs pyarrow: pip install 'reasonrl[data]'") from None
        import pyarrow

        try:
            rows = pq.read_table(path).to_pylist()
        except (pyarrow.ArrowException, OSError) as exc:  # truncated, not parquet, unreadable
            raise DataError(f"{path}: not a readable parquet file ({' '.join(str(exc).split())[:200]})") from None
        for index, row in enumerate(rows):
            if _depth(row) > MAX_JSON_DEPTH:
                raise DataError(f"{path}:row {index}: nested deeper than {MAX_JSON_DEPTH} levels")
            yield f"{path}:row {index}", row
        return
    if not (name.endswith(".jsonl") or name.endswith(".jsonl.gz") or name.endswith(".json")):
        raise DataError(f"{path}: unsupported file type; give a .jsonl, .jsonl.gz or .parquet file")
    with _open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield f"{path}:{number}", json_object(line, f"{path}:{number}")


MISSING = object()
PROMPT_ROLES = ("system", "user", "assistant")  # a row's chat prompt holds no tool turn (nor the call it answers)
GSM8K_FINAL = re.compile(r"(?:^|\n)####[ \t]*([^\n]*\S)\s*$")
"""A GSM8K-style worked answer ("...\n#### 72"): the final answer follows the last '####'."""


def _lookup(row: dict[str, Any], key: str) -> Any:
    """``row[key]``, where a dotted key reaches into nested columns (``reward_model.ground_truth``)."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def _question(location: str, row: dict[str, Any], fields: Fields) -> tuple[str, str, tuple[dict[str, str], ...]]:
    """(column used, question text, chat messages): the question field, else a TRL/verl ``prompt`` column,
    which may be a list of chat messages."""
    key = fields.question
    value = _lookup(row, key)
    if value is MISSING and key == Fields.question and "prompt" in row:
        key, value = "prompt", row["prompt"]
    if value is MISSING:
        present = ", ".join(map(str, row)) or "none"
        raise DataError(
            f"{location}: no field '{fields.question}' (fields present: {present}); set {fields.setting('question')} "
            "to the field that holds the question"
        )
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{location}: field '{key}' must be a non-empty string or a list of chat messages")
        return key, value.strip(), ()
    messages = chat_messages(location, key, value)
    users = [m["content"] for m in messages if m["role"] == "user"]
    return key, (users[-1] if users else messages[-1]["content"]).strip(), messages


def chat_messages(location: str, key: str, value: Any) -> tuple[dict[str, str], ...]:
    """A chat-format prompt checked: a non-empty list of {role, content} string messages, each role one of
    PROMPT_ROLES, a system message only first (where it stands for the run's system prompt; a later one would be
    a system turn of the row's own making).  Of a message only its role and content are kept: nothing else of
    the row (a name, tool calls) reaches the chat template."""
    ok = isinstance(value, list | tuple) and bool(value)
    ok = ok and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    ok = ok and all(isinstance(m.get("content"), str) for m in value)
    if not ok:
        raise DataError(
            f"{location}: field '{key}' must be a non-empty string or a list of chat messages "
            '({"role": ..., "content": ...})'
        )
    for index, message in enumerate(value):
        role = message["role"]
        if role not in PROMPT_ROLES or (role == "system" and index > 0):
            raise DataError(
                f"{location}: message {index} of field '{key}' has the role {role!r:.80}; a chat prompt's roles are "
                "'system' (its first message only), 'user' and 'assistant'"
            )
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def _answer(location: str, row: dict[str, Any], fields: Fields) -> str:
    """The reference: the answer field, else verl's ``reward_model.ground_truth``."""
    value = _lookup(row, fields.answer)
    if value is MISSING and fields.answer == Fields.answer:
        value = _lookup(row, "reward_model.ground_truth")
    if value is MISSING and fields.answer_optional:
        return ""
    if value is MISSING:
        present = ", ".join(map(str, row)) or "none"
        raise DataError(
            f"{location}: no field '{fields.answer}' (fields present: {present}); set {fields.setting('answer')} "
            "to the field that holds the final answer"
        )
    answer = str(value).strip()
    if fields.answer_after is not None:
        if fields.answer_after not in answer:
            raise DataError(f"{location}: answer has no '{fields.answer_after}' marker before the final answer")
        answer = answer.rsplit(fields.answer_after, 1)[1].strip().replace(",", "")
    elif final := GSM8K_FINAL.search(answer):
        answer = final.group(1).replace(",", "")
    if not answer:
        raise DataError(f"{location}: empty answer in field '{fields.answer}'")
    return answer


def _example(
    location: str, row: dict[str, Any], fields: Fields, source: str, index: int, base_dir: Path | None = None
) -> Example:
    key, question, messages = _question(location, row, fields)
    answer = _answer(location, row, fields)
    task_type = str(row.get("task_type") or "math")
    extra = json.loads(json.dumps({k: v for k, v in row.items() if k not in (key, IMAGES_FIELD)}, default=str))
    try:  # a prompt's images: paths relative to the file's folder, base64, or image records
        images = row_images(row[IMAGES_FIELD], location, base_dir) if row.get(IMAGES_FIELD) else ()
    except ImageError as exc:
        raise DataError(str(exc)) from None
    return Example(
        id=f"{source}:{index}",
        question=question,
        answer=answer,
        task_type=task_type,
        messages=messages,
        data_source=str(row.get("data_source") or source),
        fields=extra,
        images=images,
    )


def _from_datasets(name: str, split: str, fields: Fields) -> list[Example]:
    """Rows of a `datasets` name; ``path:config`` picks a configuration (``openai/gsm8k:main``)."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"'{name}' is not a built-in dataset or an existing file; loading it as a `datasets` name "
            "needs `pip install 'reasonrl[data]'`"
        ) from None
    if unreachable := hub_unreachable():
        raise DataError(
            f"could not load '{name}': {unreachable}; without a network, set HF_HUB_OFFLINE=1 to load it from the "
            "`datasets` cache (if it was loaded before), or give a local .jsonl or .parquet file"
        )
    path, _, config = name.partition(":")
    try:
        table = datasets.load_dataset(path, config or None, split=split)
    except Exception as exc:  # the hub raises many types: missing name, no network, bad split or config
        raise DataError(f"could not load '{name}' (split {split}) with `datasets`: {exc}") from exc
    return examples_from_rows(name, table, fields)


def examples_from_rows(name: str, rows: Iterable[Mapping[str, Any]], fields: Fields) -> list[Example]:
    """The examples of rows held in memory (a `datasets` table, a list of dicts), each checked as a file's
    row is; an error names the row as ``name[index]``."""
    examples = []
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{name}[{index}]: expected a mapping of fields (a dict), got {type(row).__name__}")
        examples.append(_example(f"{name}[{index}]", dict(row), fields, name, index))
    if not examples:
        raise DataError(f"{name} holds no examples")
    return examples


def load_examples(source: str, split: str = "train", fields: Fields | None = None) -> list[Example]:
    """All examples of one split of a built-in dataset, a local file (split ignored), or a `datasets` name."""
    name = ALIASES.get(source, source)
    if name in GENERATED_TASKS:
        raise DataError(f"'{name}' is a generated task, not a set of rows; give a dataset name or a .jsonl file")
    if name in BUILTIN_DATASETS:
        builtin = BUILTIN_DATASETS[name]
        if split not in builtin.files:
            raise DataError(f"built-in dataset '{name}' has no '{split}' split (it has {', '.join(builtin.files)})")
        if builtin.generate is not None:
            return builtin.generate(split)
        path = Path(str(resources.files("reasonrl.data") / "builtin" / builtin.files[split]))
        if builtin.convert is not None:
            try:
                rows = [builtin.convert(split, loc, row, i) for i, (loc, row) in enumerate(read_rows(path))]
            except RowError as exc:
                raise DataError(str(exc)) from None
            return [replace(row, data_source=row.data_source or name) for row in rows if row is not None]
        return [_example(loc, row, builtin.fields, name, i) for i, (loc, row) in enumerate(read_rows(path))]
    fields = fields or Fields()
    path = Path(source).expanduser()
    if path.exists():
        rows = enumerate(read_rows(path))
        examples = [_example(loc, row, fields, path.stem, i, path.parent) for i, (loc, row) in rows]
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


def in_holdout(index: int) -> bool:
    """Whether row ``index`` (its position in its source) is in the stable one-in-five hold-out of a single-split
    source: of each block of HOLDOUT_BUCKETS consecutive rows, the one a hash of the block's number picks.  By
    row, not by text: a source that repeats one prompt (TRL's ``[prompt] * 1000``) is split as any other, and
    rows added at the end leave the hold-out of the rows before them as it was."""
    block, place = divmod(index, HOLDOUT_BUCKETS)
    digest = hashlib.sha256(f"reasonrl-holdout:{block}".encode()).hexdigest()
    return int(digest, 16) % HOLDOUT_BUCKETS == place


def read_records(path: Path) -> list[dict]:
    """The JSON lines of an append-only file; a torn last line (a run killed mid-write) is cut off."""
    if not path.exists():
        return []
    text = path.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        path.write_text(text)
    lines = enumerate(text.splitlines(), start=1)
    return [json_object(line, f"{path}:{number}") for number, line in lines if line.strip()]


def append_record(path: Path, record: dict) -> None:
    """Append one JSON line and flush it (a kill loses at most the line being written)."""
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
