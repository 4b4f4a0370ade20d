"""Asynchronous rollouts (``rollout.max_staleness`` = k ≥ 1): a producer process generates and scores each
step's batch ahead of the trainer, from policy versions at most k updates older than the trainer's.

Versions: version v is the policy after v updates (v = 0: the initial weights). Step s trains on a batch
that a synchronous loop samples with version s − 1; here the producer may sample it with any version
v ≥ s − 1 − k, so the batch is s − 1 − v versions stale (0 ≤ staleness ≤ k). Before each batch the producer
waits until such a version is published (its idle time is ``perf/producer_idle_seconds``) and loads the
newest one; each of the batch's tokens is tagged with it (``RolloutBatch.policy_versions``).  With partial
rollouts (``rollout.partial_rollouts``) the producer generates in windows and loads the newest weights
between them too: a response then spans several versions, each token tagged with its own, so the batch's
tokens are at most s − 1 − v stale and some are fresher.

1. ``AsyncRollouts.collect(step)`` starts the producer at the first step it is asked for (after a resume:
   the checkpoint's step + 1, from the checkpoint's stream position and weights), then takes the batches
   in order from its queue.
2. ``PublishingEngine.load_weights`` (the loop's weight sync after each update) loads the trainer-side
   engine (evaluation reads it) and publishes the weights to shared memory without waiting for the producer.
3. The producer (``run_producer``, its own process, one thread by default) builds its own collector from
   the config (``build`` names a module-level function of the setup, which passes the engine it builds
   through ``ProducerPolicy.engine_for``; a verifier object given to ``fit`` is pickled across), and
   reports every batch with the stream position after it (and T-PPO's pool): the trainer keeps those of the
   last batch it trained on, so a checkpoint resumes with the prompts then in flight issued again, none
   trained twice or skipped.
4. A producer that fails sends its error; one that dies, or sends nothing for
   ``rollout.producer_timeout_seconds``, fails the run with a ``ProducerError`` naming the cause.
5. On a GPU machine with a GPU that no trainer rank uses, the producer generates on the first such GPU
   (``producer_gpu``); otherwise it shares rank 0's device.
6. Data parallelism (torchrun): rank 0 alone runs the producer, which generates the whole batch as one process
   would; rank 0 broadcasts each batch, or the error that ends the run, to every rank, so every rank holds
   the same batch (as a synchronous data-parallel run does) or raises the same error.
7. Remote engines (``dist.backend=ray``): the producer is a thread of the trainer's process (``produce``, the
   same loop), generating on the Ray rollout workers and scoring on the reward workers that evaluation uses
   too; ``EngineVersions`` (``reasonrl.train.engine_versions``) is then its channel, which loads into the
   workers the version each call samples with.  An error it raises reaches the trainer as itself.
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
from typing import Any

import torch
import torch.multiprocessing as torch_mp

from reasonrl.batch import RolloutBatch
from reasonrl.config import Config, resolve
from reasonrl.data.loaders import DataError
from reasonrl.data.source import TrainingStream
from reasonrl.errors import ReasonRLError
from reasonrl.rollout.engine_protocol import EngineWrapper, RolloutEngine
from reasonrl.rollout.tppo_pool import PartialRollouts, RolloutPool
from reasonrl.train.engine_versions import EngineVersions, ProducerStopped
from reasonrl.train.parallel import SINGLE_PROCESS, DataParallel
from reasonrl.train.rollout_stage import DynamicSamplingError, RewardFailureError, RolloutStage

log = logging.getLogger(__name__)
RAISED_AS_THEMSELVES = {error.__name__: error for error in (DataError, DynamicSamplingError, RewardFailureError)}
POLL_SECONDS = 0.5  # how often the waiting trainer checks that the producer is still there
WAKE_SECONDS = 0.02  # how often the waiting producer looks for a newer version
STOP_SECONDS = 10.0  # a stopped producer gets this long to exit before it is killed
# torchrun's description of a rank, which the producer (a process of its own, spawned by rank 0) drops
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_PORT")


class ProducerError(ReasonRLError, RuntimeError):
    """The rollout producer failed, died or went silent; the message says which and how to go on."""


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

    def __init__(self, weights: SharedWeights | EngineVersions, cfg: Config) -> None:
        self.weights, self.window_tokens = weights, resolve(cfg).partial_window_tokens
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
    build: Callable[[Config, dict, Any, ProducerPolicy], Any],
    cfg: Config,
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
    produce(build, cfg, verifier, first_step, collector_state, weights, send, stop)


def produce(
    build: Callable[[Config, dict, Any, ProducerPolicy], Any],
    cfg: Config,
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
        policy = ProducerPolicy(weights, cfg)
        collector = build(cfg, collector_state, verifier, policy)
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


def staleness_stats(staleness: torch.Tensor, bound: int) -> dict[str, float]:
    """Mean, max and histogram (0 … ``bound``) of the staleness of a batch's tokens (``staleness`` [N]: how
    many updates behind the trainer's previous version the policy that sampled each was)."""
    staleness = staleness.float() if len(staleness) else torch.zeros(1)
    histogram = {f"rollout/staleness_{j}_fraction": (staleness == j).float().mean().item() for j in range(bound + 1)}
    return {
        "rollout/staleness_mean": staleness.mean().item(),
        "rollout/staleness_max": staleness.max().item(),
        **histogram,
    }


def pickles(error: BaseException) -> bool:
    """Whether ``error`` survives a pickle round trip (a broadcast to the other ranks is one)."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return False
    return True


def as_bytes(result: ProducedBatch | ProducerFailure) -> bytes:
    """A result as plain pickle bytes: its tensors copied, not shared (torch's shared-memory handles would
    need the producer alive, and its descriptor server reachable, until the trainer reads them); a failure
    without its exception object, which may not pickle."""
    if isinstance(result, ProducerFailure):
        result = dataclasses.replace(result, error=None)
    return pickle.dumps(result)


class AsyncRollouts(RolloutStage):
    """The rollout stage of an asynchronous run: batches from the producer process, in step order.  Its state is
    the trainer's copy of the producer's (its stream's position, T-PPO's pool) as of the latest batch collected."""

    def __init__(
        self,
        cfg: Config,
        build: Callable[[Config, dict, Any, ProducerPolicy], Any],
        stream: TrainingStream,
        current_weights: Callable[[], Mapping[str, torch.Tensor]],
        verifier: Any = None,
        share_cores: bool = False,
        rollout_pool: RolloutPool | None = None,
        parallel: DataParallel = SINGLE_PROCESS,
        gpu: str | None = None,
        engine_versions: EngineVersions | None = None,
    ) -> None:
        self.cfg, self.build, self.stream, self.current_weights = cfg, build, stream, current_weights
        self.rollout_pool = rollout_pool  # T-PPO: the checkpointed copy of the producer's pool
        self.verifier = verifier  # the run's own verifier object (the Python API's), pickled to the producer
        self.parallel = parallel  # rank 0 runs the producer and broadcasts its batches
        self.gpu = gpu  # the producer's CUDA_VISIBLE_DEVICES (None: the trainer's)
        self.engine_versions = engine_versions  # remote engines: the producer is a thread, this its channel
        self.context = torch_mp.get_context("spawn")
        self.started = False
        self.process: Any = None  # the producer's process, or its thread
        self.weights: SharedWeights | EngineVersions | None = None  # rank 0's, once started
        self.last_step = 0  # the newest step collected: the version its update will publish
        self.share_cores = share_cores  # CPU: the trainer leaves the producer's threads their cores while it runs
        self.trainer_threads = torch.get_num_threads()  # restored when the producer stops

    def start(self, first_step: int) -> None:
        self.started = True
        current = self.current_weights()  # every rank: gathering a sharded model's weights is a collective
        if not self.parallel.is_main:
            return
        state = self.state_dict()
        if self.engine_versions is not None:
            self.start_thread(first_step, state, current)
            return
        self.weights = SharedWeights(current, first_step - 1, self.context)
        self.results = self.context.Queue()
        self.stop = self.context.Value("b", 0, lock=False)  # a flag, not an Event: nothing a killed producer can wedge
        arguments = (self.build, self.cfg, self.verifier, first_step, state, self.weights,
                     self.results, self.stop, self.gpu)  # fmt: skip
        self.process = self.context.Process(target=run_producer, args=arguments, name="reasonrl-rollout-producer")
        self.process.start()
        if self.gpu is not None:
            log.info("the rollout producer generates on GPU %s, apart from the trainer", self.gpu)
        if self.share_cores:
            torch.set_num_threads(max(1, self.trainer_threads - self.cfg.rollout.producer_threads))  # of those chosen

    def start_thread(self, first_step: int, state: dict, current: Mapping[str, torch.Tensor]) -> None:
        """The producer as a thread of this process, generating through ``engine_versions``."""
        self.weights = self.engine_versions
        self.weights.publish(current, first_step - 1)
        self.results = queue.Queue()
        self.stop = self.weights.stop
        self.stop.value = 0
        arguments = (self.build, self.cfg, self.verifier, first_step, state, self.weights,
                     self.results.put, self.stop)  # fmt: skip
        self.process = threading.Thread(target=produce, args=arguments, name="reasonrl-rollout-producer", daemon=True)
        self.process.start()

    def collect(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Step ``step``'s batch and its metrics: the producer's, with its staleness and the waits."""
        if not self.started:
            self.start(step)
        waited = time.perf_counter()
        produced = self.parallel.broadcast(self.next_outcome(step) if self.parallel.is_main else None)
        if isinstance(produced, Exception):  # every rank raises the error that ends the run
            raise produced
        self.load_state_dict(produced.collector_state)  # a checkpoint resumes after its prompts, with its pool
        self.last_step = step
        batch = produced.batch
        sampled = batch.response_mask  # [B, T] the tokens this batch's generation sampled (T-PPO: its window's)
        if batch.pool_window is not None:
            sampled = sampled & ~batch.pool_window.stale_mask
        return batch, {
            **produced.stats,
            **staleness_stats(step - 1 - batch.policy_versions[sampled], self.cfg.rollout.max_staleness),
            "perf/producer_idle_seconds": produced.idle_seconds,
            "perf/rollout_wait_seconds": time.perf_counter() - waited,
        }

    def state_dict(self) -> dict:
        state = {"stream": self.stream.state_dict()}
        return state if self.rollout_pool is None else {**state, "pool": self.rollout_pool.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        if self.rollout_pool is not None:
            self.rollout_pool.load_state_dict(state["pool"])

    def next_outcome(self, step: int) -> ProducedBatch | Exception:
        """Step ``step``'s batch, or the error that ends the run (rank 0 sends it to the other ranks)."""
        try:
            return self.next_result(step)
        except (ProducerError, *RAISED_AS_THEMSELVES.values()) as error:
            return error
        except Exception as error:  # a producer thread's own exception: every rank raises it too
            if self.parallel.world_size == 1:
                raise
            return error if pickles(error) else ProducerError(f"the rollout producer failed at step {step}: "
                                                               f"{type(error).__name__}: {error}")  # fmt: skip

    def next_result(self, step: int) -> ProducedBatch:
        deadline = time.monotonic() + self.cfg.rollout.producer_timeout_seconds
        while True:
            try:
                result = self.results.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise ProducerError(
                        f"the rollout producer {self.exit_description()} before step {step}'s batch; the run can "
                        "resume from its latest checkpoint (run the same command again)"
                    ) from None
                if time.monotonic() > deadline:
                    raise ProducerError(
                        f"the rollout producer sent no batch for step {step} in "
                        f"rollout.producer_timeout_seconds={self.cfg.rollout.producer_timeout_seconds:g}; it was "
                        "stopped (raise the timeout if generating one batch takes longer)"
                    ) from None
        if isinstance(result, bytes):
            result = pickle.loads(result)  # our own producer process's
        if isinstance(result, ProducerFailure):  # the run's own errors keep their kind and one-line message
            log.debug("the rollout producer's traceback:\n%s", result.trace)
            if result.error is not None:  # a producer thread's
                raise result.error
            if result.kind in RAISED_AS_THEMSELVES:
                raise RAISED_AS_THEMSELVES[result.kind](result.message)
            raise ProducerError(f"the rollout producer failed at step {result.step}: {result.kind}: {result.message}")
        if result.step != step:
            raise ProducerError(f"the rollout producer sent step {result.step}'s batch where step {step}'s was due")
        return result

    def exit_description(self) -> str:
        if isinstance(self.process, threading.Thread):
            return "(a thread of this process) ended"
        return f"(pid {self.process.pid}) died with exit code {self.process.exitcode}"

    def publish(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The trainer's weights after the update of the newest step collected (no wait for the producer)."""
        if self.weights is not None:  # before the producer starts it takes the weights as they are then
            self.weights.publish(weights, self.last_step)

    def close(self) -> None:
        """Stop the producer (it finishes no batch) and wait for it, killing it if it does not exit."""
        self.started = False
        if self.process is None:
            return
        self.stop.value = 1
        self.process.join(STOP_SECONDS)
        if isinstance(self.process, threading.Thread):  # a thread cannot be killed: one still in an engine call
            self.process = None  # ends when that call does (the worker timeout bounds it); no call follows it
            return
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.results.cancel_join_thread()
        self.process = None
        torch.set_num_threads(self.trainer_threads)


class PublishingEngine(EngineWrapper):
    """The trainer-side engine of an asynchronous run: ``load_weights`` loads ``engine`` (evaluation and
    value pretraining generate with it) and publishes the weights to the producer; the rest is ``engine``'s."""

    def __init__(self, engine: RolloutEngine, rollouts: AsyncRollouts) -> None:
        super().__init__(engine)
        self.rollouts = rollouts

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.engine.load_weights(state_dict)
        self.rollouts.publish(state_dict)
