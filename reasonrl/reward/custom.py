"""Custom reward functions named on the command line, in TRL's or verl's calling convention.

``reward.functions=['my_pkg.rewards:score', 'path/to/file.py:other']`` with ``reward.weights``: each
function is another scorer, run in its own time-limited worker pool (``reward.workers`` processes), called as
the framework whose shape it has calls it:

- TRL's shape: ``score(prompts, completions, **kwargs) -> list[float | None]``, called once per batch (a
  generation pass, as TRL calls it once per generation batch; a reward that normalises over its batch keeps its
  meaning) with TRL's keywords (``trl_arguments``): ``prompts`` (strings, or a chat-format row's messages),
  ``completions`` (strings, or ``[{"role": "assistant", "content": ...}]`` for chat prompts), ``completion_ids``,
  ``trainer_state`` (its ``global_step`` and ``max_steps``), ``log_extra`` and ``log_metric`` (which keep
  nothing), and every column of the rows as lists, plus ``ground_truth`` (the reference answer) and
  ``data_source``; a function without ``**kwargs`` gets the ones it names.  ``None`` means "does not apply to
  this sample": the term is left out.  The call has ``reward.timeout_seconds`` per sample; one that raises or
  runs out of time costs that function's term for the batch, and a value that is no finite number its sample's.
  An environment run calls these functions itself, with the episodes (``training/rollouts/episode_rewards.py``).
- verl's shape, recognised by a parameter named ``solution_str``:
  ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict``, called per sample, as
  verl calls it (``reward.timeout_seconds`` per call); a dict gives its ``score`` (and, with ``acc``, its verdict).

How the terms combine: when ``reward.functions`` is given, a sample's score is the weighted sum
Σ wᵢ·fᵢ of the functions that returned a value; the built-in scorer (the reward router, or a verifier
given to ``fit``) counts only if it is listed, under the reserved name ``verifier``.  The sum takes
the place of the verifier's score: ``reward.correct_score`` / ``incorrect_score`` map it as usual.
A sample is correct (accuracy, dynamic sampling, the NLL term) by the first term that gives a
verdict, in the listed order: the ``verifier``, or a verl function whose dict has ``acc``; with
none, when its score is above 0.5 (the run says which it counts:
``training.record.report.accuracy_meaning``).  A failure scores 0 for the samples it costs, with
``info["error"]`` (counted in ``reward/error_fraction``, and per function in ``reward/fn/<name>/errors``); its
first failure is logged with the traceback from the function's own
frame down, later ones are only counted.  The run goes on, unless a function fails on at least
``reward.max_error_fraction`` of a step's samples (by default: on every one): then it stops.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.config.ranges import FLOAT32_MAX
from reasonrl.data.examples import Example
from reasonrl.errors import ReasonRLError
from reasonrl.reward.scoring_pool import ScoringPool
from reasonrl.reward.verifier_protocol import RewardResult, Scorer, ScoringContext, reward_number

log = logging.getLogger(__name__)

VERIFIER_TERM = "verifier"
"""The reserved entry of ``reward.functions`` that stands for the built-in scorer."""

_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}  # per process: (spec, search path) -> function


class RewardFunctionError(ReasonRLError, ValueError):
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

    @property
    def batched(self) -> bool:
        """Whether it is called once per batch (TRL's shape, as TRL calls it) rather than once per sample
        (verl's ``compute_score``, as verl calls it)."""
        return not is_verl_style(self.load())

    def __call__(self, response: str, reference: str, sample: dict[str, Any]) -> RewardResult:
        """Score one response with a verl-shaped function; ``sample`` is ``sample_payload(example)``.  Raises on
        a bad return value."""
        __tracebackhide__ = True  # a failure's logged traceback begins in the user's function
        fields = sample["fields"]
        ground_truth = (fields.get("reward_model") or {}).get("ground_truth", reference)
        value = self.load()(
            data_source=sample["data_source"],
            solution_str=response,
            ground_truth=ground_truth,
            extra_info=fields.get("extra_info"),
        )
        return self._result(value)

    def score_batch(
        self,
        responses: Sequence[str],
        references: Sequence[str],
        samples: Sequence[dict[str, Any]],
        context: ScoringContext | None = None,
        episodes: EpisodeRecords | None = None,
    ) -> list[RewardResult]:
        """Score a batch in one call of a TRL-shaped function, with TRL's keywords (``trl_arguments``); a
        coroutine it returns is run to its end.  Raises on a bad return value (one float or None per response)."""
        __tracebackhide__ = True  # a failure's logged traceback begins in the user's function
        function = self.load()
        arguments = trl_arguments(responses, references, samples, context, episodes)
        values = function(**accepted_arguments(function, arguments))
        if inspect.iscoroutine(values):  # an async reward function, as TRL allows
            values = asyncio.run(values)
        if not isinstance(values, list | tuple) or len(values) != len(responses):
            raise TypeError(
                f"returned {_shown(values)}; a TRL-style reward function returns a list with one float (or None) "
                f"per completion ({len(responses)} here)"
            )
        return [self._value_result(value) for value in values]

    def _value_result(self, value: Any) -> RewardResult:
        """One value of a batch's list as its result; a value that is no reward fails that response only."""
        try:
            return self._result(value)
        except TypeError as exc:
            return RewardResult(0.0, False, {"error": f"TypeError: {exc}"})

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


@dataclass(frozen=True)
class TrainerState:
    """What TRL's reward functions get as ``trainer_state``: where the run is (the fields of transformers'
    ``TrainerState`` a reward reads: its step and its last)."""

    global_step: int
    max_steps: int


@dataclass(frozen=True)
class EpisodeRecords:
    """What an environment run's reward functions get beyond a single-turn run's: each episode's environment
    instance (TRL's ``environments``) and its completion as the messages after the prompt (assistant turns and
    tool answers).  Live objects: such calls run in the process that plays the episodes."""

    environments: Sequence[Any]
    completions: Sequence[list[dict[str, Any]]]


def _no_log(*args: Any, **kwargs: Any) -> None:
    """TRL's ``log_extra`` and ``log_metric`` for a function that calls them: what it logs is not kept."""


def trl_arguments(
    responses: Sequence[str],
    references: Sequence[str],
    samples: Sequence[dict[str, Any]],
    context: ScoringContext | None = None,
    episodes: EpisodeRecords | None = None,
) -> dict[str, Any]:
    """The keywords TRL calls a reward function with, one entry per response: ``prompts``, ``completions`` (a
    chat prompt's as ``[{"role": "assistant", "content": ...}]``, an episode's as its messages),
    ``completion_ids``, ``trainer_state``, ``log_extra`` and ``log_metric`` (kept nowhere), ``environments``
    in an environment run, and every column of the rows (``ground_truth`` the reference, ``data_source``;
    None where a row lacks one)."""
    prompts = [sample["prompt"] for sample in samples]
    completions: list[Any] = (
        list(episodes.completions)
        if episodes is not None
        else [
            [{"role": "assistant", "content": r}] if isinstance(p, list) else r
            for p, r in zip(prompts, responses, strict=True)
        ]
    )
    context = context or ScoringContext()
    rows = [
        {"ground_truth": ref, "data_source": s["data_source"], **s["fields"]}
        for ref, s in zip(references, samples, strict=True)
    ]
    columns = {key: [row.get(key) for row in rows] for row in rows for key in row}
    arguments = {
        **{k: v for k, v in columns.items() if k not in TRL_KEYWORDS},
        "prompts": prompts,
        "completions": completions,
        "trainer_state": TrainerState(context.step, context.max_steps),
        "log_extra": _no_log,
        "log_metric": _no_log,
    }
    if context.completion_ids is not None:
        arguments["completion_ids"] = [list(ids) for ids in context.completion_ids]
    if episodes is not None:
        arguments["environments"] = list(episodes.environments)
    return arguments


TRL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")
"""What TRL passes a reward function besides a row's columns (a column of one of these names is not passed)."""


def accepted_arguments(function: Callable[..., Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` as ``function`` takes them: all of them with ``**kwargs`` (as TRL passes them), else those it
    names (so a ``f(prompts, completions, ground_truth)`` works too)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return arguments
    return {p.name: arguments[p.name] for p in parameters if p.name in arguments}


@dataclass(frozen=True)
class BatchedRewardFunction:
    """A TRL-shaped ``RewardFunction`` as a scoring pool's callable: one task scores a whole batch."""

    function: RewardFunction

    def __call__(
        self, responses: Sequence[str], references: Sequence[str], samples: Sequence[dict], context: ScoringContext
    ) -> list[RewardResult]:
        __tracebackhide__ = True
        return self.function.score_batch(responses, references, samples, context)


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
        self._refusals_logged: set[str] = set()

    def _pool(self, term: RewardTerm) -> ScoringPool:
        if term.name not in self._pools:
            assert term.function is not None
            label = f"reward function '{term.name}'"
            scorer = BatchedRewardFunction(term.function) if term.function.batched else term.function
            self._pools[term.name] = ScoringPool(scorer, self.workers, self.timeout, label=label)
        return self._pools[term.name]

    def _term_results(
        self, term: RewardTerm, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None
    ) -> list[RewardResult]:
        if term.function is None:
            return self.builtin.score_examples(examples, responses, context)
        samples = [sample_payload(e) for e in examples]
        references = [e.answer for e in examples]
        if not term.function.batched:  # verl's compute_score: one sample per call, as verl calls it
            return self._pool(term).score(list(zip(responses, references, samples, strict=True)))
        # TRL's shape: one call for the batch, as TRL calls it, within the time of one call per response
        task = (list(responses), references, samples, context or ScoringContext())
        (result,) = self._pool(term).score([task], timeout=self.timeout * max(1, len(responses)))
        if not isinstance(result, list):  # a failed call (logged by its pool) fails every response of it
            return [result] * len(responses)
        refused = next((r.info["error"] for r in result if "error" in r.info), None)
        if refused is not None and term.name not in self._refusals_logged:  # a value that is no reward: logged once
            self._refusals_logged.add(term.name)
            log.warning("reward function '%s' returned a value that is no reward (later ones are counted): %s",
                        term.name, refused)  # fmt: skip
        return result

    def score_examples(
        self, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None = None
    ) -> list[RewardResult]:
        """One combined result per response; ``info["terms"]`` holds each function's value (None: no value),
        ``info["term_errors"]`` the error of each function that failed on it."""
        per_term = [self._term_results(t, examples, responses, context) for t in self.terms]
        return [combined_result(self.terms, [results[i] for results in per_term]) for i in range(len(examples))]

    def close(self) -> None:
        """Stop the functions' pools and the built-in scorer."""
        for pool in self._pools.values():
            pool.close()
        self.builtin.close()


def combined_result(terms: Sequence[RewardTerm], results: Sequence[RewardResult]) -> RewardResult:
    """One response's result from its ``terms``' results (in their order): the weighted sum of their values, the
    verdict of the first term that gives one (``info["verdict_from"]``; None: none did, and the sum above
    0.5 stands for it)."""
    score, verdict, verdict_from = 0.0, None, None
    values: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    info: dict[str, Any] = {}
    for term, result in zip(terms, results, strict=True):
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
        if verdict is None and term_verdict is not None:
            verdict, verdict_from = term_verdict, term.name
    info.update({"source": "custom", "terms": values, "term_errors": errors, "verdict_from": verdict_from})
    if errors:
        info["error"] = "; ".join(f"{name}: {error}" for name, error in errors.items())
    return RewardResult(score, score > 0.5 if verdict is None else verdict, info)
