"""Reward scoring on Ray workers, behind the Scorer protocol.

Each scoring worker is an actor that builds a scorer (a ScoringPool, the reward router...) from a
picklable factory on its own machine; ``RayScorer.score_examples`` gives each worker a contiguous
chunk of the (example, response) pairs, all at once, and returns the results in order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from reasonrl.data.examples import Example
from reasonrl.dist.cluster import Placement, WorkerHost, gather, kill_workers, start_workers
from reasonrl.dist.cluster_errors import WorkerDiedError
from reasonrl.reward.verifier_protocol import RewardResult, Scorer, ScoringContext

CLOSE_TIMEOUT_S = 30.0  # a worker's scorer gets this long to stop its processes before the actor is killed


class ScorerHost(WorkerHost):
    """One scoring worker (a Ray actor): builds its scorer in ``setup``, then serves it."""

    def __init__(self, factory: Callable[[], Scorer]) -> None:
        self.factory = factory
        self.scorer: Scorer | None = None

    def setup(self) -> None:
        self.scorer = self.factory()

    def score_examples(
        self, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None = None
    ) -> list[RewardResult]:
        if self.scorer is None:
            raise RuntimeError("the scoring worker has no scorer: call setup() first")
        return self.scorer.score_examples(examples, responses, context)

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None


def even_chunks(count: int, parts: int) -> list[range]:
    """``parts`` contiguous ranges covering ``range(count)``, their sizes differing by at most one."""
    cuts = [count * k // parts for k in range(parts + 1)]
    return [range(cuts[k], cuts[k + 1]) for k in range(parts)]


class RayScorer:
    """The Scorer protocol over ``workers`` Ray actors, each running ``factory()``'s scorer.

    ``factory`` must be picklable (a function, a class, a ``functools.partial``); it runs on the
    worker.  ``timeout_s`` bounds every wait: a worker that dies or stays silent longer raises
    WorkerDiedError naming it.  The object pickles, so trainer ranks running as Ray actors can share
    it; only the process that made it closes it.
    """

    def __init__(
        self,
        factory: Callable[[], Scorer],
        workers: int,
        *,
        gpus_per_worker: float = 0.0,
        cpus_per_worker: float = 0.0,
        timeout_s: float = 1800.0,
        placement_timeout_s: float = 300.0,
    ) -> None:
        self.timeout_s = timeout_s
        self.placement = Placement("scoring", workers, gpus_per_worker, cpus_per_worker, placement_timeout_s)
        try:
            self.workers = start_workers(ScorerHost, (factory,), self.placement, timeout_s, setup="setup")
        except BaseException:
            self.placement.release()
            raise

    def score_examples(
        self, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None = None
    ) -> list[RewardResult]:
        """One result per (example, response), in order: each worker scores a contiguous share."""
        if len(examples) != len(responses):
            raise ValueError(f"{len(examples)} examples but {len(responses)} responses")
        chunks = even_chunks(len(examples), len(self.workers))
        calls = [
            (
                worker,
                worker.actor.score_examples.remote(
                    [examples[i] for i in chunk],
                    [responses[i] for i in chunk],
                    None if context is None else context.rows(chunk),
                ),
            )
            for worker, chunk in zip(self.workers, chunks, strict=True)
            if len(chunk)
        ]
        return [result for part in gather(calls, self.timeout_s) for result in part]

    def close(self) -> None:
        """Let each worker's scorer stop its processes, then stop the workers."""
        with contextlib.suppress(WorkerDiedError):
            gather([(worker, worker.actor.close.remote()) for worker in self.workers], CLOSE_TIMEOUT_S)
        kill_workers(self.workers)
        self.workers = []
        self.placement.release()
