"""Asynchronous rollouts (``rollout.max_staleness`` = k ≥ 1): a producer process generates and scores each
step's batch ahead of the trainer, from policy versions at most k updates older than the trainer's.

Versions: version v is the policy after v updates (v = 0: the initial weights). Step s trains on a batch
that a synchronous loop samples with version s − 1; here the producer may sample it with any version
v ≥ s − 1 − k, so the batch is s − 1 − v versions stale (0 ≤ staleness ≤ k). Before each batch the producer
waits until such a version is published (its idle time is ``perf/producer_idle_seconds``) and loads the
newest one; each of the batch's tokens is tagged with it (``RolloutBatch.policy_versions``).

1. ``AsyncRollouts.collect(step)`` starts the producer at the first step it is asked for (after a resume:
   the checkpoint's step + 1, from the checkpoint's stream position and weights), then takes the batches
   in order from its queue.
2. ``PublishingEngine.load_weights`` (the loop's weight sync after each update) loads the trainer-side
   engine (evaluation reads it) and publishes the weights to shared memory without waiting for the producer.
3. The producer (``run_producer``, its own process, one thread by default) builds its own collector from
   the config (``build`` names a module-level function of the setup; a verifier object given to ``fit`` is
   pickled across), and
   reports every batch with the stream position after it: the trainer keeps the position of the last batch
   it trained on, so a checkpoint resumes with the prompts then in flight issued again, none trained twice
   or skipped.
4. A producer that fails sends its error; one that dies, or sends nothing for
   ``rollout.producer_timeout_seconds``, fails the run with a ``ProducerError`` naming the cause.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as torch_mp

from reasonrl.batch import RolloutBatch
from reasonrl.config import Config
from reasonrl.data.loaders import DataError
from reasonrl.data.source import TrainingStream
from reasonrl.rollout.engine_protocol import RolloutEngine
from reasonrl.train.rollout_stage import DynamicSamplingError, RewardFailureError

log = logging.getLogger(__name__)
RAISED_AS_THEMSELVES = {error.__name__: error for error in (DataError, DynamicSamplingError, RewardFailureError)}
POLL_SECONDS = 0.5  # how often the waiting trainer checks that the producer is still there
WAKE_SECONDS = 0.02  # how often the waiting producer looks for a newer version
STOP_SECONDS = 10.0  # a stopped producer gets this long to exit before it is killed


class ProducerError(RuntimeError):
    """The rollout producer failed, died or went silent; the message says which and how to go on."""


@dataclass(frozen=True)
class ProducedBatch:
    """One step's batch as the producer made it."""

    step: int
    version: int  # the policy version that sampled every token of the batch
    batch: RolloutBatch
    stats: dict[str, float]
    stream_state: dict  # the prompt stream's position after this batch's prompts
    idle_seconds: float  # how long the producer waited for a fresh enough version before generating it


@dataclass(frozen=True)
class ProducerFailure:
    """An exception the producer raised, as text (its type may not exist in the trainer's process)."""

    step: int
    kind: str
    message: str
    trace: str


class SharedWeights:
    """The policy's weights in shared CPU memory with the version they are: written by the trainer, read
    by the producer.  No lock: a killed producer must never leave the trainer waiting.  A sequence number,
    odd while the trainer writes, tells the reader to retry a read that overlapped a write (a seqlock)."""

    def __init__(self, weights: Mapping[str, torch.Tensor], version: int, context) -> None:
        self.tensors = {name: w.detach().to("cpu", copy=True).share_memory_() for name, w in weights.items()}
        self.sequence = context.Value("q", 0, lock=False)
        self.version = context.Value("q", version, lock=False)

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.sequence.value += 1  # odd: being written
        for name, tensor in self.tensors.items():
            tensor.copy_(weights[name])
        self.version.value = version
        self.sequence.value += 1

    def newest_version(self) -> int:
        return int(self.version.value)

    def wait_for_version(self, version: int, stop, parent_pid: int) -> bool:
        """Wait until weights of at least ``version`` are published; False if stopped first (``stop`` set,
        or the trainer's process gone)."""
        while self.newest_version() < version:
            if stop.value or os.getppid() != parent_pid:
                return False
            time.sleep(WAKE_SECONDS)
        return not stop.value

    def load_into(self, engine: RolloutEngine) -> int:
        """Load the newest weights into ``engine`` (which copies them); returns their version."""
        while True:
            before = self.sequence.value
            if before % 2 == 0:
                version = int(self.version.value)
                engine.load_weights(self.tensors)
                if self.sequence.value == before:  # no write began meanwhile: a whole version
                    return version
            time.sleep(WAKE_SECONDS)


def run_producer(
    build: Callable[[Config, dict, Any], Any],
    cfg: Config,
    verifier: Any,
    first_step: int,
    stream_state: dict,
    weights: SharedWeights,
    results,
    stop,
    parent_pid: int,
) -> None:
    """The producer process: batches ``first_step``, ``first_step`` + 1, … up to the run's last step, each
    from a version at most ``rollout.max_staleness`` behind, onto ``results``; ends when ``stop`` is set or
    the trainer's process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's: it saves, then stops this process
    torch.set_num_threads(cfg.rollout.producer_threads)
    step = first_step
    try:
        collector = build(cfg, stream_state, verifier)
        loaded = None
        for step in range(first_step, cfg.train.rollout_steps + 1):
            waited = time.perf_counter()
            if not weights.wait_for_version(step - 1 - cfg.rollout.max_staleness, stop, parent_pid):  # 1. fresh enough
                return
            idle = time.perf_counter() - waited
            if weights.newest_version() != loaded:  # 2. the newest weights, between engine calls
                loaded = weights.load_into(collector.engine)
            batch, stats = collector.collect(step)  # 3. generate and score, as the synchronous loop does
            batch.policy_versions = torch.where(batch.response_mask, loaded, -1)  # [B, T]
            results.put(as_bytes(ProducedBatch(step, loaded, batch, stats, collector.stream.state_dict(), idle)))
    except BaseException as exc:  # everything goes to the trainer, which raises it
        results.put(as_bytes(ProducerFailure(step, type(exc).__name__, str(exc), traceback.format_exc(limit=8))))


def as_bytes(result: ProducedBatch | ProducerFailure) -> bytes:
    """A result as plain pickle bytes: its tensors copied, not shared (torch's shared-memory handles would
    need the producer alive, and its descriptor server reachable, until the trainer reads them)."""
    return pickle.dumps(result)


class AsyncRollouts:
    """The rollout stage of an asynchronous run: batches from the producer process, in step order."""

    def __init__(
        self,
        cfg: Config,
        build: Callable[[Config, dict, Any], Any],
        stream: TrainingStream,
        current_weights: Callable[[], Mapping[str, torch.Tensor]],
        verifier: Any = None,
        share_cores: bool = False,
    ) -> None:
        self.cfg, self.build, self.stream, self.current_weights = cfg, build, stream, current_weights
        self.verifier = verifier  # the run's own verifier object (the Python API's), pickled to the producer
        self.context = torch_mp.get_context("spawn")
        self.process = None
        self.weights: SharedWeights | None = None
        self.last_step = 0  # the newest step collected: the version its update will publish
        self.share_cores = share_cores  # CPU: the trainer leaves the producer's threads their cores while it runs
        self.trainer_threads = torch.get_num_threads()  # restored when the producer stops

    def start(self, first_step: int) -> None:
        self.weights = SharedWeights(self.current_weights(), first_step - 1, self.context)
        self.results = self.context.Queue()
        self.stop = self.context.Value("b", 0, lock=False)  # a flag, not an Event: nothing a killed producer can wedge
        arguments = (self.build, self.cfg, self.verifier, first_step, self.stream.state_dict(), self.weights,
                     self.results, self.stop, os.getpid())  # fmt: skip
        self.process = self.context.Process(target=run_producer, args=arguments, name="reasonrl-rollout-producer")
        self.process.start()
        if self.share_cores:
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - self.cfg.rollout.producer_threads))

    def collect(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Step ``step``'s batch and its metrics: the producer's, with its staleness and the waits."""
        if self.process is None:
            self.start(step)
        waited = time.perf_counter()
        produced = self.next_result(step)
        staleness = step - 1 - produced.version
        self.stream.load_state_dict(produced.stream_state)  # a checkpoint after this step resumes after its prompts
        self.last_step = step
        k = self.cfg.rollout.max_staleness
        return produced.batch, {
            **produced.stats,
            "rollout/staleness_mean": float(staleness),
            "rollout/staleness_max": float(staleness),
            **{f"rollout/staleness_{j}_fraction": float(staleness == j) for j in range(k + 1)},
            "perf/producer_idle_seconds": produced.idle_seconds,
            "perf/rollout_wait_seconds": time.perf_counter() - waited,
        }

    def next_result(self, step: int) -> ProducedBatch:
        deadline = time.monotonic() + self.cfg.rollout.producer_timeout_seconds
        while True:
            try:
                result = pickle.loads(self.results.get(timeout=POLL_SECONDS))  # our own producer's bytes
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise ProducerError(
                        f"the rollout producer (pid {self.process.pid}) died with exit code {self.process.exitcode} "
                        f"before step {step}'s batch; the run can resume from its latest checkpoint (run the same "
                        "command again)"
                    ) from None
                if time.monotonic() > deadline:
                    raise ProducerError(
                        f"the rollout producer sent no batch for step {step} in "
                        f"rollout.producer_timeout_seconds={self.cfg.rollout.producer_timeout_seconds:g}; it was "
                        "stopped (raise the timeout if generating one batch takes longer)"
                    ) from None
        if isinstance(result, ProducerFailure):  # the run's own errors keep their kind and one-line message
            log.debug("the rollout producer's traceback:\n%s", result.trace)
            if result.kind in RAISED_AS_THEMSELVES:
                raise RAISED_AS_THEMSELVES[result.kind](result.message)
            raise ProducerError(f"the rollout producer failed at step {result.step}: {result.kind}: {result.message}")
        if result.step != step:
            raise ProducerError(f"the rollout producer sent step {result.step}'s batch where step {step}'s was due")
        return result

    def publish(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The trainer's weights after the update of the newest step collected (no wait for the producer)."""
        if self.weights is not None:  # before the producer starts it takes the weights as they are then
            self.weights.publish(weights, self.last_step)

    def close(self) -> None:
        """Stop the producer (it finishes no batch) and wait for it, killing it if it does not exit."""
        if self.process is None:
            return
        self.stop.value = 1
        self.process.join(STOP_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.results.cancel_join_thread()
        self.process = None
        torch.set_num_threads(self.trainer_threads)


class PublishingEngine:
    """The trainer-side engine of an asynchronous run: ``load_weights`` loads ``engine`` (evaluation and
    value pretraining generate with it) and publishes the weights to the producer; the rest is ``engine``'s."""

    def __init__(self, engine: RolloutEngine, rollouts: AsyncRollouts) -> None:
        self.engine, self.rollouts = engine, rollouts

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.engine.load_weights(state_dict)
        self.rollouts.publish(state_dict)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)
