"""The hybrid reward router (Data-Scaling RLHF, arXiv 2503.22230 §3).

Each sample's ``task_type`` picks exactly one reward source:

| task_type    | source            | what scores it                                                        |
|--------------|-------------------|-----------------------------------------------------------------------|
| `math`       | `math`            | the math verifier (RTV)                                               |
| `code`       | `code`            | the code verifier: tests in the sandbox (RTV)                         |
| `reference`  | `genrm_reference` | GenRM against the example's ground-truth answer                       |
| `open`       | `genrm_bon`       | GenRM against the example's best-of-N reference (in its answer field) |
| `preference` | `bt`              | the Bradley-Terry reward model, σ(score)                              |
| `grounding`  | `grounding`       | the answered box's IoU with the reference box ≥ 0.5 (visual tasks)    |
| `pointing`   | `pointing`        | the answered point inside the reference box (visual tasks)            |
| `countdown`  | `countdown`       | the answer's expression reaches the puzzle's target with its numbers  |

``reward.routes`` overrides entries (``task_type=source``), but a verifiable task (math, code, grounding, pointing,
countdown) can only be routed to a verifier: verifiable tasks never reach a learned judge.  Every source
reports a score in [0, 1] (verifiers: 1/0 or the pass fraction; GenRM: the position-debiased win
probability, 0.5 = parity; BT: σ(score)), so one scale reaches the advantage stage; a model
source calls a response correct when its score is above 0.5.  Verifiers run in their own
time-limited worker pools; the judges run batched in the trainer process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from reasonrl.config.routes import (  # the routing table and its rules are configuration
    VERIFIER_SOURCES,
    RoutingError,
    resolve_routes,
)
from reasonrl.data.examples import Example
from reasonrl.reward.scoring_pool import ScoringPool
from reasonrl.reward.verifier_protocol import RewardResult, ScoringContext, Verifier

if TYPE_CHECKING:
    import torch

    from reasonrl.config.schema import RewardConfig


def route(task_type: str, routes: Mapping[str, str]) -> str:
    """The one source of a task type."""
    try:
        return routes[task_type]
    except KeyError:
        raise RoutingError(
            f"no reward source for task_type {task_type!r}; known task types: {', '.join(routes)} "
            "(add one with reward.routes=['{task_type}=SOURCE'])"
        ) from None


class RewardRouter:
    """Scores (example, response) pairs by routing each to its source; sources load on first use.

    ``verifiers`` maps a verifier source to the verifier it runs; ``models`` maps a model source to a
    zero-argument factory of the scorer (loaded lazily: a math-only run never loads a judge).
    """

    def __init__(
        self,
        routes: Mapping[str, str],
        verifiers: Mapping[str, Verifier],
        models: Mapping[str, Callable[[], object]],
        *,
        workers: int = 2,
        timeout: float = 10.0,
    ) -> None:
        self.routes, self._verifiers, self._model_factories = dict(routes), dict(verifiers), dict(models)
        self.workers, self.timeout = workers, timeout
        self._pools: dict[str, ScoringPool] = {}
        self._models: dict[str, object] = {}

    def _pool(self, source: str) -> ScoringPool:
        if source not in self._pools:
            if source not in self._verifiers:
                raise RoutingError(f"reward source {source!r} has no verifier configured")
            self._pools[source] = ScoringPool(self._verifiers[source], self.workers, self.timeout)
        return self._pools[source]

    def _model(self, source: str):
        if source not in self._models:
            if source not in self._model_factories:
                raise RoutingError(f"reward source {source!r} needs a model (reward.judge_model / reward.reward_model)")
            self._models[source] = self._model_factories[source]()
        return self._models[source]

    def score_examples(
        self, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None = None
    ) -> list[RewardResult]:
        """One result per response, each tagged with ``info["source"]`` (verifiers and judges read no ``context``)."""
        sources = [route(e.task_type, self.routes) for e in examples]
        results: list[RewardResult | None] = [None] * len(examples)
        for source in dict.fromkeys(sources):
            rows = [i for i, s in enumerate(sources) if s == source]
            if source in VERIFIER_SOURCES:
                scored = self._pool(source).score([(responses[i], examples[i].answer) for i in rows])
                scored = [RewardResult(r.score, r.correct, {**r.info, "source": source}) for r in scored]
            else:
                scores = self._model_scores(source, [examples[i] for i in rows], [responses[i] for i in rows])
                scored = [RewardResult(s, s > 0.5, {"source": source}) for s in scores]
                self._check_against_verifier_answer([examples[i] for i in rows], [responses[i] for i in rows], scored)
            for i, result in zip(rows, scored, strict=True):
                results[i] = result
        return results  # type: ignore[return-value]

    def _check_against_verifier_answer(
        self, examples: Sequence[Example], responses: Sequence[str], results: Sequence[RewardResult]
    ) -> None:
        """Where a judged example's row carries a ``verifier_answer``, the math verifier's verdict on it goes
        to ``info["verifier_correct"]``: never the reward, but the measure of how far a learned reward has
        been hacked (Data-Scaling RLHF §5: the gap between the judge's reward and the true accuracy)."""
        rows = [i for i, e in enumerate(examples) if e.fields.get("verifier_answer") is not None]
        if not rows:
            return
        checked = self._pool("math").score([(responses[i], str(examples[i].fields["verifier_answer"])) for i in rows])
        for i, verdict in zip(rows, checked, strict=True):
            results[i].info["verifier_correct"] = bool(verdict.correct)

    def _model_scores(self, source: str, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        scorer = self._model(source)
        if source == "bt":  # the conversation as `rm train` saw it: chat messages, not flattened text
            prompts = [[dict(m) for m in e.messages] or [{"role": "user", "content": e.question}] for e in examples]
            return [1.0 / (1.0 + math.exp(-s)) for s in scorer.score(prompts, responses)]
        questions = [e.question for e in examples]
        return scorer.score(questions, responses, [e.answer for e in examples])  # GenRM vs the reference

    def close(self) -> None:
        """Stop the verifier pools."""
        for pool in self._pools.values():
            pool.close()


def program_verifiers() -> dict[str, Verifier]:
    """The verifier of each verifier source (math, code, grounding, pointing, countdown): what scores verifiable
    tasks."""
    from reasonrl.reward.code import CodeVerifier
    from reasonrl.reward.countdown_verifier import CountdownVerifier
    from reasonrl.reward.math import MathVerifier
    from reasonrl.reward.visual_verifiers import GroundingVerifier, PointingVerifier

    verifiers = {"math": MathVerifier(), "code": CodeVerifier(), "grounding": GroundingVerifier()}
    return verifiers | {"pointing": PointingVerifier(), "countdown": CountdownVerifier()}


def build_router(
    reward: RewardConfig, policy_model: str, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> RewardRouter:
    """The hybrid reward router of a run's ``reward`` settings: verifiers for math and code, judges loaded on
    ``device`` on first use (GenRM: ``reward.judge_model``, else the policy ``policy_model`` judges)."""
    from reasonrl.config import ConfigError

    judge: list = []

    def genrm():  # one judge serves both GenRM sources
        if not judge:
            from reasonrl.reward.genrm import GenRM

            judge.append(GenRM.from_model(reward.judge_model or policy_model, dtype, device))
        return judge[0]

    def bradley_terry():
        from reasonrl.reward.bt import RewardModel

        if not reward.reward_model:
            raise ConfigError("task_type 'preference' is routed to the bt source: set reward.reward_model=DIR")
        return RewardModel.load(reward.reward_model, compute_dtype=dtype, device=device)

    return RewardRouter(
        resolve_routes(reward.routes),
        program_verifiers(),
        {"genrm_reference": genrm, "genrm_bon": genrm, "bt": bradley_terry},
        workers=reward.workers,
        timeout=reward.timeout_seconds,
    )
