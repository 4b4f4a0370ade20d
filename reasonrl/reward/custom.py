"""Custom reward functions named on the command line, in TRL's or verl's calling convention.

``reward.functions=['my_pkg.rewards:score', 'path/to/file.py:other']`` with ``reward.weights``: each
function is another scorer, run in its own time-limited worker pool (``reward.workers`` processes,
``reward.timeout_seconds`` per call), one sample per call so that a failure costs one sample:

- TRL's shape: ``score(prompts, completions, **row_fields) -> list[float | None]``, called with
  one-element lists: the prompt (a string, or the chat messages of a chat-format row), the completion
  (a string, or ``[{"role": "assistant", "content": ...}]`` when the prompt is chat messages), and
  every other column of the row as a one-element list, plus ``ground_truth`` (the reference answer)
  and ``data_source``.  ``None`` means "does not apply to this sample": the term is left out.
- verl's shape, recognised by a parameter named ``solution_str``:
  ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict``; a dict
  gives its ``score`` (and, with ``acc``, its verdict).

How the terms combine: when ``reward.functions`` is given, a sample's score is the weighted sum
Σ wᵢ·fᵢ of the functions that returned a value; the built-in scorer (the reward router, or a verifier
given to ``fit``) counts only if it is listed, under the reserved name ``verifier``.  The sum takes
the place of the verifier's score: ``reward.correct_score`` / ``incorrect_score`` map it as usual.
A sample is correct (accuracy, dynamic sampling, the NLL term) by the first term that gives a
verdict, in the listed order: the ``verifier``, or a verl function whose dict has ``acc``; with
none, when its score is above 0.5.  A function that raises, hangs or kills its process scores 0
for that sample, with ``info["error"]`` (counted in ``reward/error_fraction``, and per function in
``reward/fn/<name>/errors``); its first failure is logged with the traceback from the function's own
frame down, later ones are only counted.  The run goes on, unless a function fails on at least
``reward.max_error_fraction`` of a step's calls (by default: on every call): then it stops.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.config.validate import FLOAT32_MAX
from reasonrl.data.examples import Example
from reasonrl.reward.scoring_pool import ScoringPool
from reasonrl.reward.verifier_protocol import RewardResult, Scorer, reward_number

VERIFIER_TERM = "verifier"
"""The reserved entry of ``reward.functions`` that stands for the built-in scorer."""

_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}  # per process: (spec, search path) -> function


class RewardFunctionError(ValueError):
    """A reward function that cannot be named, imported or found, with what to do about it."""


def _split_spec(spec: str) -> tuple[str, str]:
    target, sep, attribute = spec.rpartition(":")
    if not sep or not target.strip() or not attribute.strip():
        raise RewardFunctionError(
            f"reward.functions entry {spec!r} is not 'module:function' or 'path/to/file.py:function' "
            f"(or '{VERIFIER_TERM}' for the built-in scorer)"
        )
    return target.strip(), attribute.strip()


def _import_file(path: Path, kind: str):
    if not path.is_file():
        raise RewardFunctionError(f"{kind} file {path} does not exist")
    name = f"reasonrl_reward_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module  # so that pickling what it defines works in this process
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def _nearest(name: str, owner: Any) -> str:
    """The hint "; did you mean 'x'?" naming the public name of ``owner`` (a module, a class) nearest
    ``name``; "" when none is near."""
    guess = difflib.get_close_matches(name, [n for n in dir(owner) if not n.startswith("_")], n=1, cutoff=0.6)
    return f"; did you mean {guess[0]!r}?" if guess else ""


def load_named(spec: str, search_path: str, kind: str) -> Callable[..., Any]:
    """What ``spec`` names, ``module:attribute`` (a module importable from ``search_path`` too) or
    ``path/to/file.py:attribute``, the attribute maybe dotted: a function or a class of the user's (loading it
    runs their module; that is their choice, and nothing generated is ever loaded).  RewardFunctionError says
    why it cannot be loaded, calling it a ``kind`` ("reward function", "environment")."""
    target, attribute = _split_spec(spec)
    try:
        if target.endswith(".py"):
            module = _import_file(Path(target), kind)
        else:
            if search_path not in sys.path:
                sys.path.append(search_path)
            module = importlib.import_module(target)
    except RewardFunctionError:
        raise
    except Exception as exc:
        raise RewardFunctionError(
            f"{kind} {spec!r}: cannot import {target!r} ({type(exc).__name__}: {exc}); "
            "give a module importable from the current directory or a path/to/file.py"
        ) from None
    named: Any = module
    for part in attribute.split("."):
        if not hasattr(named, part):
            raise RewardFunctionError(f"{kind} {spec!r}: {target!r} has no {attribute!r}{_nearest(part, named)}")
        named = getattr(named, part)
    if not callable(named):
        raise RewardFunctionError(f"{kind} {spec!r} is not callable")
    return named


@dataclass(frozen=True)
class RewardFunction:
    """A user's reward function by reference, picklable: every scoring worker imports it once.

    ``spec`` is ``module:function`` (importable from the launch directory too, as with ``python -m``)
    or ``path/to/file.py:function``; the function part may be dotted (``module:Class.method``).
    """

    spec: str
    search_path: str
    """The directory a module name is also searched in (the current directory at launch)."""

    @staticmethod
    def named(spec: str) -> RewardFunction:
        """The function of a ``reward.functions`` entry, with file paths made absolute."""
        target, attribute = _split_spec(spec)
        if target.endswith(".py"):
            target = str(Path(target).expanduser().resolve())
        return RewardFunction(f"{target}:{attribute}", os.getcwd())

    @property
    def name(self) -> str:
        """How metrics and logs call it: the function's name."""
        return _split_spec(self.spec)[1].rsplit(".", 1)[-1]

    def load(self) -> Callable[..., Any]:
        """The function itself (imported once per process); RewardFunctionError says why it cannot be."""
        key = (self.spec, self.search_path)
        if key not in _LOADED:
            _LOADED[key] = load_named(self.spec, self.search_path, "reward function")
        return _LOADED[key]

    def __call__(self, response: str, reference: str, sample: dict[str, Any]) -> RewardResult:
        """Score one response; ``sample`` is ``sample_payload(example)``.  Raises on a bad return value."""
        __tracebackhide__ = True  # a failure's logged traceback begins in the user's function
        function = self.load()
        if is_verl_style(function):
            fields = sample["fields"]
            ground_truth = (fields.get("reward_model") or {}).get("ground_truth", reference)
            value = function(
                data_source=sample["data_source"],
                solution_str=response,
                ground_truth=ground_truth,
                extra_info=fields.get("extra_info"),
            )
            return self._result(value)
        prompt = sample["prompt"]
        completion: Any = [{"role": "assistant", "content": response}] if isinstance(prompt, list) else response
        columns = {"ground_truth": reference, "data_source": sample["data_source"], **sample["fields"]}
        kwargs = {k: [v] for k, v in columns.items() if k not in ("prompts", "completions")}
        values = function(prompts=[prompt], completions=[completion], **kwargs)
        if not isinstance(values, list | tuple) or len(values) != 1:
            raise TypeError(
                f"returned {_shown(values)}; a TRL-style reward function returns a list with one float "
                "(or None) per completion"
            )
        return self._result(values[0])

    def _result(self, value: Any) -> RewardResult:
        verdict = None
        if isinstance(value, dict):
            if "score" not in value:
                raise TypeError(f"returned a dict without 'score' (keys: {', '.join(map(str, value))})")
            verdict = bool(value["acc"]) if "acc" in value else None
            value = value["score"]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return RewardResult(0.0, False, {"value": None})
        try:
            number = reward_number(value)
        except TypeError:
            raise TypeError(
                f"returned {_shown(value)}; a reward is a finite number within float32's range (or None)"
            ) from None
        info: dict[str, Any] = {"value": number}
        if verdict is not None:
            info["verdict"] = verdict
        return RewardResult(number, bool(verdict), info)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"a {type(value).__name__}"


def is_verl_style(function: Callable[..., Any]) -> bool:
    """Whether a function follows verl's ``compute_score(data_source, solution_str, ground_truth, ...)``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return "solution_str" in parameters


def sample_payload(example: Example) -> dict[str, Any]:
    """What a reward function sees of an example besides the response and the reference."""
    prompt: Any = [dict(m) for m in example.messages] if example.messages else example.question
    return {"prompt": prompt, "data_source": example.data_source, "fields": example.fields}


@dataclass(frozen=True)
class RewardTerm:
    """One entry of ``reward.functions``: a user's function, or the built-in scorer (``function`` None)."""

    name: str
    weight: float
    function: RewardFunction | None


def reward_terms(functions: Sequence[str], weights: Sequence[float] = ()) -> list[RewardTerm]:
    """The terms of ``reward.functions`` / ``reward.weights`` (default weight 1), each function imported
    once here so that a bad name fails before anything heavy loads."""
    if weights and len(weights) != len(functions):
        raise RewardFunctionError(
            f"reward.weights has {len(weights)} entries for {len(functions)} reward.functions; give one per "
            "function, or none for weight 1 each"
        )
    terms = []
    for spec, weight in zip(functions, weights or [1.0] * len(functions), strict=True):
        if spec.strip() == VERIFIER_TERM:
            terms.append(RewardTerm(VERIFIER_TERM, float(weight), None))
            continue
        function = RewardFunction.named(spec)
        function.load()
        terms.append(RewardTerm(function.name, float(weight), function))
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise RewardFunctionError(f"reward.functions names {', '.join(repeated)} more than once; names must differ")
    return terms


class WeightedRewards:
    """The ``Scorer`` of a run with custom reward functions: Σ wᵢ·fᵢ per sample (see the module docstring)."""

    def __init__(self, terms: Sequence[RewardTerm], builtin: Scorer, *, workers: int = 2, timeout: float = 10.0):
        self.terms, self.builtin = list(terms), builtin
        self.workers, self.timeout = workers, timeout
        self._pools: dict[str, ScoringPool] = {}

    def _pool(self, term: RewardTerm) -> ScoringPool:
        if term.name not in self._pools:
            assert term.function is not None
            label = f"reward function '{term.name}'"
            self._pools[term.name] = ScoringPool(term.function, self.workers, self.timeout, label=label)
        return self._pools[term.name]

    def _term_results(self, term: RewardTerm, examples: Sequence[Example], responses: Sequence[str]):
        if term.function is None:
            return self.builtin.score_examples(examples, responses)
        calls = [(r, e.answer, sample_payload(e)) for e, r in zip(examples, responses, strict=True)]
        return self._pool(term).score(calls)

    def score_examples(self, examples: Sequence[Example], responses: Sequence[str]) -> list[RewardResult]:
        """One combined result per response; ``info["terms"]`` holds each function's value (None: no value),
        ``info["term_errors"]`` the error of each function that failed on it."""
        per_term = [self._term_results(t, examples, responses) for t in self.terms]
        return [self._combine([results[i] for results in per_term]) for i in range(len(examples))]

    def _combine(self, results: Sequence[RewardResult]) -> RewardResult:
        score, verdict = 0.0, None
        values: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        info: dict[str, Any] = {}
        for term, result in zip(self.terms, results, strict=True):
            if "error" in result.info:
                errors[term.name] = result.info["error"]
            if term.function is None:
                info.update({k: v for k, v in result.info.items() if k != "error"})  # extracted answer, ...
                value: float | None = result.score
                term_verdict: bool | None = result.correct
            else:
                value = result.info.get("value", result.score)  # an error result has no value: its score
                term_verdict = result.info.get("verdict")
            values[term.name] = value
            if value is not None and abs(score + term.weight * value) > FLOAT32_MAX:  # weighted past float32
                errors[term.name] = f"weighted, its reward {term.weight:g} × {value:g} takes the sum past float32"
                values[term.name] = None
            elif value is not None:
                score += term.weight * value
            if verdict is None:
                verdict = term_verdict
        info.update({"source": "custom", "terms": values, "term_errors": errors})
        if errors:
            info["error"] = "; ".join(f"{name}: {error}" for name, error in errors.items())
        return RewardResult(score, score > 0.5 if verdict is None else verdict, info)

    def close(self) -> None:
        """Stop the functions' pools and the built-in scorer."""
        for pool in self._pools.values():
            pool.close()
        self.builtin.close()
