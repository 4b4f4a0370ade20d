"""One rollout engine shared by the trainer's evaluation and an asynchronous run's producer thread, each
generating with its own policy version.

A run whose rollout engine is remote (``dist.backend=ray``: the Ray rollout workers) runs its producer as a
thread of the trainer's process: the workers generate and score, so the thread only sends them work and waits
(``reasonrl.training.rollouts.async_rollouts``).  The workers hold one version of the weights at a time, and two callers
use them: the producer samples each batch with the version it took when the batch began (with partial
rollouts, the newest at each window) and the trainer evaluates with its newest.

``EngineVersions`` keeps a CPU copy of each version still wanted (the producer's and the newest) and, under one
lock, loads into the engine the version a call asks for before the call generates: every token is sampled by
the version it is tagged with, however the two callers' calls interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from reasonrl.rollout.engine_protocol import Completion, EngineWrapper, RolloutEngine, SamplingParams

WAIT_SECONDS = 0.5  # how often a producer waiting for a version looks at its stop flag


class StopFlag:
    """A producer thread's stop flag (a producer process's is a shared ``Value``)."""

    value = 0


class ProducerStopped(Exception):
    """The run stopped the producer thread between two of its engine calls; the producer ends quietly."""


class EngineVersions:
    """The published policy versions and the engine that generates with them (the channel between the
    trainer and a producer thread, as ``SharedWeights`` is for a producer process)."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self.calls = threading.Lock()  # one engine call, with the weight load before it, at a time
        self.published = threading.Condition()  # guards the versions below
        self.weights: dict[int, dict[str, torch.Tensor]] = {}  # version -> its CPU copy
        self.newest: int | None = None  # None: nothing published yet (the engine has the weights loaded last)
        self.pinned: int | None = None  # the version the producer generates with
        self.loaded: int | None = None  # the version the engine holds (None: not a published one)
        self.stop = StopFlag()  # set when the run stops the producer: its next engine call raises ProducerStopped

    # --- the trainer's side ---

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """A copy of ``weights`` as ``version``, the newest; the copies no caller wants any more are dropped."""
        copy = {name: w.detach().to("cpu", copy=True) for name, w in weights.items()}
        with self.published:
            self.weights[version] = copy
            self.newest = version
            self.drop_unwanted()
            self.published.notify_all()

    # --- the producer's side (what ``produce`` asks of a channel) ---

    def newest_version(self) -> int:
        return -1 if self.newest is None else self.newest

    def wait_for_version(self, version: int, stop) -> bool:
        """Wait until ``version`` or a newer one is published; False if ``stop`` is set first."""
        with self.published:
            while self.newest_version() < version and not stop.value:
                self.published.wait(WAIT_SECONDS)
        return not stop.value

    def load_into(self, engine: Any = None) -> int:
        """Take the newest version for the producer's calls from now on (the engine loads it at the first
        of them); returns it."""
        with self.published:
            self.pinned = self.newest
            self.drop_unwanted()
            return self.newest_version()

    # --- both ---

    def generate(
        self, version: int | None, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        """``prompts`` sampled with ``version`` (None: the weights the engine holds, before any publish)."""
        with self.calls:
            if version is not None and version != self.loaded:
                with self.published:
                    weights = self.weights[version]
                self.engine.load_weights(weights)
                self.loaded = version
            return self.engine.generate(prompts, params)

    def drop_unwanted(self) -> None:
        for version in [v for v in self.weights if v not in (self.newest, self.pinned)]:
            del self.weights[version]


class ProducerEngine(EngineWrapper):
    """The engine as the producer thread's collector sees it: it generates with the producer's version."""

    def __init__(self, versions: EngineVersions) -> None:
        super().__init__(versions.engine)
        self.versions = versions

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        if self.versions.stop.value:  # a stopped producer makes no more calls, even mid-batch
            raise ProducerStopped
        return self.versions.generate(self.versions.pinned, prompts, params)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise RuntimeError("the producer's engine loads only published versions (EngineVersions.load_into)")


class EvaluationEngine(EngineWrapper):
    """The engine as the trainer sees it: it generates with the newest version.  Weights loaded before the
    producer starts go to the engine as they are; after that, publishing them is what loads them."""

    def __init__(self, versions: EngineVersions) -> None:
        super().__init__(versions.engine)
        self.versions = versions

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        return self.versions.generate(self.versions.newest, prompts, params)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        if self.versions.newest is None:
            with self.versions.calls:
                self.versions.engine.load_weights(state_dict)
