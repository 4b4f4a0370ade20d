"""The rollout producer of an asynchronous run (``rollout.max_staleness`` ≥ 1): what runs apart from the trainer,
and the two ways it runs (``ProducerTransport``).

1. ``produce`` makes batches ``first_step``, ``first_step`` + 1, … in order, each after waiting until a version at
   most ``rollout.max_staleness`` behind is published, from the collector ``build`` makes from the config (the
   setup passes the engine it builds through ``ProducerPolicy.engine_for``; a verifier object given to ``fit`` is
   pickled across), and sends each with the stream position after it (and T-PPO's pool).
2. ``ProducerProcess``: ``produce`` in a process of its own (``run_producer``: one thread by default, no Ctrl-C,
   no torchrun rank, on a GPU no trainer rank uses where the machine has one, ``producer_gpu``); the weights
   travel through shared CPU memory (``SharedWeights``), the batches as pickled bytes on a queue.
3. ``ProducerThread`` (``dist.backend=ray``): ``produce`` in a thread of the trainer's process, generating on the
   Ray rollout workers and scoring on the reward workers that evaluation uses too; ``EngineVersions``
   (``reasonrl.training.rollouts.engine_versions``) is its channel, which loads into the workers the version each call
   samples with.  An error it raises reaches the trainer as itself.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.multiprocessing as torch_mp

from reasonrl.batch import RolloutBatch
from reasonrl.config import Config, Plan
from reasonrl.rollout.engine_protocol import RolloutEngine
from reasonrl.rollout.tppo_pool import PartialRollouts
from reasonrl.training.rollouts.engine_versions import EngineVersions, ProducerStopped

log = logging.getLogger(__name__)
WAKE_SECONDS = 0.02  # how often the waiting producer looks for a newer version
STOP_SECONDS = 10.0  # a stopped producer gets this long to exit before it is killed
# torchrun's description of a rank, which the producer (a process of its own, spawned by rank 0) drops
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_PORT")
BuildCollector = Callable[[Config, Plan, dict, Any, "ProducerPolicy"], Any]
"""Builds the producer's collector (a RolloutStage) from the config, the stream's state, the run's verifier and the
producer's policy: a module-level function, which a process pickles by name."""


@dataclass(frozen=True)
class ProducedBatch:
    """One step's batch as the producer made it."""

    step: int
    batch: RolloutBatch  # its policy_versions: the policy version that sampled each token
    stats: dict[str, float]
    collector_state: dict  # after this batch: the prompt stream's position ("stream"), T-PPO's pool ("pool")
    idle_seconds: float  # how long the producer waited for a fresh enough version before generating it


@dataclass(frozen=True)
class ProducerFailure:
    """An exception the producer raised, as text (its type may not exist in the trainer's process)."""

    step: int
    kind: str
    message: str
    trace: str
    error: BaseException | None = None  # the exception itself: a thread's (a process's is dropped: it may not pickle)


class SharedWeights:
    """The policy's weights in shared CPU memory with the version they are: written by the trainer, read
    by the producer.  No lock: a killed producer must never leave the trainer waiting.  A sequence number,
    odd while the trainer writes, tells the reader to retry a read that overlapped a write (a seqlock)."""

    def __init__(self, weights: Mapping[str, torch.Tensor], version: int, context) -> None:
        self.tensors = {name: w.detach().to("cpu", copy=True).share_memory_() for name, w in weights.items()}
        self.sequence = context.Value("q", 0, lock=False)
        self.version = context.Value("q", version, lock=False)
        self.trainer_pid = os.getpid()

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.sequence.value += 1  # odd: being written
        for name, tensor in self.tensors.items():
            tensor.copy_(weights[name])
        self.version.value = version
        self.sequence.value += 1

    def newest_version(self) -> int:
        return int(self.version.value)

    def wait_for_version(self, version: int, stop) -> bool:
        """Wait until weights of at least ``version`` are published; False if stopped first (``stop`` set,
        or the trainer's process gone)."""
        while self.newest_version() < version:
            if stop.value or os.getppid() != self.trainer_pid:
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


class ProducerPolicy:
    """The producer's view of the policy: its engine and the version of the weights it holds."""

    def __init__(self, weights: SharedWeights | EngineVersions, plan: Plan) -> None:
        self.weights, self.window_tokens = weights, plan.partial_window_tokens
        self.engine: RolloutEngine | None = None
        self.partial: PartialRollouts | None = None
        self.loaded: int | None = None

    def engine_for(self, engine: RolloutEngine) -> RolloutEngine:
        """What the producer's collector generates with: ``engine``, or with partial rollouts ``engine``
        generating in windows that load the newest weights between them."""
        self.engine = engine
        if self.window_tokens is None:
            return engine
        self.partial = PartialRollouts(engine, self.window_tokens, self.newest)
        return self.partial

    def newest(self) -> int:
        """Load the newest published weights when they are newer than the engine's; their version."""
        if self.weights.newest_version() != self.loaded:
            self.loaded = self.weights.load_into(self.engine)
        return self.loaded

    def window_stats(self) -> dict[str, float]:
        """Partial rollouts: the tokens prefilled again to continue responses since the last call."""
        if self.partial is None:
            return {}
        tokens, self.partial.reprefill_tokens = self.partial.reprefill_tokens, 0
        return {"rollout/reprefill_tokens": float(tokens)}


def run_producer(
    build: BuildCollector,
    cfg: Config,
    plan: Plan,
    verifier: Any,
    first_step: int,
    collector_state: dict,
    weights: SharedWeights,
    results,
    stop,
    gpu: str | None = None,
) -> None:
    """The producer process: ``produce`` with the process's own settings (no Ctrl-C, no torchrun rank, its GPU
    and threads), each result pickled onto ``results``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's: it saves, then stops this process
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    if gpu is not None:  # before anything initialises CUDA in this process: "cuda" is then that GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    torch.set_num_threads(cfg.rollout.producer_threads)
    send = lambda result: results.put(as_bytes(result))  # noqa: E731
    produce(build, cfg, plan, verifier, first_step, collector_state, weights, send, stop)


def produce(
    build: BuildCollector,
    cfg: Config,
    plan: Plan,
    verifier: Any,
    first_step: int,
    collector_state: dict,
    weights: SharedWeights | EngineVersions,
    send: Callable[[ProducedBatch | ProducerFailure], None],
    stop,
) -> None:
    """The producer: batches ``first_step``, ``first_step`` + 1, … up to the run's last step, each from a version
    at most ``rollout.max_staleness`` behind, sent in order; ends when ``stop`` is set or the trainer's process
    is gone, or with its error sent."""
    step = first_step
    try:
        policy = ProducerPolicy(weights, plan)
        collector = build(cfg, plan, collector_state, verifier, policy)
        for step in range(first_step, cfg.train.rollout_steps + 1):
            waited = time.perf_counter()
            if not weights.wait_for_version(step - 1 - cfg.rollout.max_staleness, stop):  # 1. fresh enough
                return
            idle = time.perf_counter() - waited
            version = policy.newest()  # 2. the newest weights, between engine calls
            batch, stats = collector.collect(step)  # 3. generate and score, as the synchronous loop does
            if batch.policy_versions is None:  # 4. every token tagged (partial rollouts tag their own)
                batch.policy_versions = torch.where(batch.response_mask, version, -1)  # [B, T]
            stats = {**stats, **policy.window_stats()}
            send(ProducedBatch(step, batch, stats, collector.state_dict(), idle))
    except ProducerStopped:  # a producer thread stopped mid-batch: the trainer wants nothing more
        return
    except BaseException as exc:  # everything goes to the trainer, which raises it
        trace = traceback.format_exc(limit=8)
        send(ProducerFailure(step, type(exc).__name__, str(exc), trace, exc))


def producer_gpu(visible: str | None, count: int, trainer_gpus: int) -> str | None:
    """The producer's CUDA_VISIBLE_DEVICES: the first of this machine's ``count`` visible GPUs (``visible``:
    the trainer's CUDA_VISIBLE_DEVICES, None = all) that none of its ``trainer_gpus`` ranks uses (they take
    the first ones, one each, as torchrun's LOCAL_RANK places them); None when every GPU trains."""
    if count <= trainer_gpus:
        return None
    ids = [i.strip() for i in visible.split(",")] if visible else [str(i) for i in range(count)]
    return ids[trainer_gpus]


def as_bytes(result: ProducedBatch | ProducerFailure) -> bytes:
    """A result as plain pickle bytes: its tensors copied, not shared (torch's shared-memory handles would
    need the producer alive, and its descriptor server reachable, until the trainer reads them); a failure
    without its exception object, which may not pickle."""
    if isinstance(result, ProducerFailure):
        result = dataclasses.replace(result, error=None)
    return pickle.dumps(result)


class ProducerTransport(Protocol):
    """How rank 0 runs the producer and talks to it: ``ProducerProcess`` or ``ProducerThread``."""

    def start(self, cfg: Config, plan: Plan, first_step: int, state: dict, current: Mapping[str, torch.Tensor]) -> None:
        """Start ``produce`` at ``first_step`` from the stream's ``state``, with the weights ``current`` as
        version ``first_step`` − 1."""
        ...

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Hand the producer the weights of ``version`` (no wait for it; nothing before it starts)."""
        ...

    def receive(self, timeout: float) -> ProducedBatch | ProducerFailure:
        """The producer's next result; ``queue.Empty`` after ``timeout`` seconds without one."""
        ...

    def alive(self) -> bool:
        """Whether the producer still runs."""
        ...

    def ended(self) -> str:
        """How the producer ended, for the error that says so."""
        ...

    def stop(self) -> None:
        """Stop the producer (it finishes no batch) and wait for it, killing it if it does not exit."""
        ...


class ProducerProcess(ProducerTransport):
    """The producer in a process of its own: the weights in shared CPU memory, the batches pickled on a queue.
    On the CPU (``share_cores``) the trainer leaves the producer's threads their cores while it runs."""

    def __init__(self, build: BuildCollector, verifier: Any = None, gpu: str | None = None, share_cores=False) -> None:
        self.build, self.verifier = build, verifier  # the run's own verifier object (the Python API's), pickled
        self.gpu = gpu  # the producer's CUDA_VISIBLE_DEVICES (None: the trainer's)
        self.share_cores, self.trainer_threads = share_cores, torch.get_num_threads()  # restored when it stops
        self.context = torch_mp.get_context("spawn")
        self.process: Any = None
        self.weights: SharedWeights | None = None

    def start(self, cfg: Config, plan: Plan, first_step: int, state: dict, current: Mapping[str, torch.Tensor]) -> None:
        self.weights = SharedWeights(current, first_step - 1, self.context)
        self.results = self.context.Queue()
        self.stop_flag = self.context.Value("b", 0, lock=False)  # a flag, not an Event: nothing a kill can wedge
        arguments = (self.build, cfg, plan, self.verifier, first_step, state, self.weights,
                     self.results, self.stop_flag, self.gpu)  # fmt: skip
        self.process = self.context.Process(target=run_producer, args=arguments, name="reasonrl-rollout-producer")
        self.process.start()
        if self.gpu is not None:
            log.info("the rollout producer generates on GPU %s, apart from the trainer", self.gpu)
        if self.share_cores:
            torch.set_num_threads(max(1, self.trainer_threads - cfg.rollout.producer_threads))  # of those chosen

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        if self.weights is not None:
            self.weights.publish(weights, version)

    def receive(self, timeout: float) -> ProducedBatch | ProducerFailure:
        return pickle.loads(self.results.get(timeout=timeout))

    def alive(self) -> bool:
        return self.process.is_alive()

    def ended(self) -> str:
        return f"(pid {self.process.pid}) died with exit code {self.process.exitcode}"

    def stop(self) -> None:
        if self.process is None:
            return
        self.stop_flag.value = 1
        self.process.join(STOP_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.results.cancel_join_thread()
        self.process = None
        torch.set_num_threads(self.trainer_threads)


class ProducerThread(ProducerTransport):
    """The producer as a thread of the trainer's process, generating through the remote engines' ``versions``
    (rank 0's; None on the other ranks, which run no producer)."""

    def __init__(self, build: BuildCollector, versions: EngineVersions | None, verifier: Any = None) -> None:
        self.build, self.versions, self.verifier = build, versions, verifier
        self.thread: threading.Thread | None = None
        self.results: queue.Queue = queue.Queue()

    def start(self, cfg: Config, plan: Plan, first_step: int, state: dict, current: Mapping[str, torch.Tensor]) -> None:
        self.versions.publish(current, first_step - 1)
        self.results = queue.Queue()
        self.versions.stop.value = 0
        arguments = (self.build, cfg, plan, self.verifier, first_step, state, self.versions, self.results.put,
                     self.versions.stop)  # fmt: skip
        self.thread = threading.Thread(target=produce, args=arguments, name="reasonrl-rollout-producer", daemon=True)
        self.thread.start()

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        if self.thread is not None:
            self.versions.publish(weights, version)

    def receive(self, timeout: float) -> ProducedBatch | ProducerFailure:
        return self.results.get(timeout=timeout)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def ended(self) -> str:
        return "(a thread of this process) ended"

    def stop(self) -> None:
        if self.thread is None:
            return
        self.versions.stop.value = 1
        self.thread.join(STOP_SECONDS)  # a thread cannot be killed: one still in an engine call ends when that
        self.thread = None  # call does (the worker timeout bounds it); no call follows it
