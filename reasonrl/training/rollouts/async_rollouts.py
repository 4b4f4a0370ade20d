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
3. The producer (``reasonrl.training.rollouts.producer``) runs through a ``ProducerTransport``: its own process
   (``ProducerProcess``, on a GPU no trainer rank uses where there is one), or under ``dist.backend=ray`` a thread
   of the trainer's process on the remote engines (``ProducerThread``).  It reports every batch with the stream
   position after it (and T-PPO's pool): the trainer keeps those of the last batch it trained on, so a checkpoint
   resumes with the prompts then in flight issued again, none trained twice or skipped.
4. A producer that fails sends its error; one that dies, or sends nothing for
   ``rollout.producer_timeout_seconds``, fails the run with a ``ProducerError`` naming the cause.
5. Data parallelism (torchrun): rank 0 alone runs the producer, which generates the whole batch as one process
   would; rank 0 broadcasts each batch, or the error that ends the run, to every rank, so every rank holds
   the same batch (as a synchronous data-parallel run does) or raises the same error.
"""

from __future__ import annotations

import logging
import pickle
import queue
import time
from collections.abc import Callable, Mapping

import torch

from reasonrl.batch import RolloutBatch
from reasonrl.config import Config, Plan
from reasonrl.data.loaders import DataError
from reasonrl.data.source import TrainingStream
from reasonrl.errors import ReasonRLError
from reasonrl.rollout.engine_protocol import EngineWrapper, RolloutEngine
from reasonrl.rollout.tppo_pool import RolloutPool
from reasonrl.training.placement.parallel import SINGLE_PROCESS, DataParallel
from reasonrl.training.rollouts.producer import ProducedBatch, ProducerFailure, ProducerTransport
from reasonrl.training.rollouts.rollout_stage import DynamicSamplingError, RewardFailureError, RolloutStage

log = logging.getLogger(__name__)
RAISED_AS_THEMSELVES = {error.__name__: error for error in (DataError, DynamicSamplingError, RewardFailureError)}
POLL_SECONDS = 0.5  # how often the waiting trainer checks that the producer is still there


class ProducerError(ReasonRLError, RuntimeError):
    """The rollout producer failed, died or went silent; the message says which and how to go on."""


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


class AsyncRollouts(RolloutStage):
    """The rollout stage of an asynchronous run: batches from the producer process, in step order.  Its state is
    the trainer's copy of the producer's (its stream's position, T-PPO's pool) as of the latest batch collected."""

    def __init__(
        self,
        cfg: Config,
        plan: Plan,
        transport: ProducerTransport,
        stream: TrainingStream,
        current_weights: Callable[[], Mapping[str, torch.Tensor]],
        rollout_pool: RolloutPool | None = None,
        parallel: DataParallel = SINGLE_PROCESS,
    ) -> None:
        self.cfg, self.plan, self.transport = cfg, plan, transport
        self.stream, self.current_weights = stream, current_weights
        self.rollout_pool = rollout_pool  # T-PPO: the checkpointed copy of the producer's pool
        self.parallel = parallel  # rank 0 runs the producer and broadcasts its batches
        self.started = False
        self.last_step = 0  # the newest step collected: the version its update will publish

    def start(self, first_step: int) -> None:
        self.started = True
        current = self.current_weights()  # every rank: gathering a sharded model's weights is a collective
        if self.parallel.is_main:
            self.transport.start(self.cfg, self.plan, first_step, self.state_dict(), current)

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
                result = self.transport.receive(POLL_SECONDS)
                break
            except queue.Empty:
                if not self.transport.alive():
                    raise ProducerError(
                        f"the rollout producer {self.transport.ended()} before step {step}'s batch; the run can "
                        "resume from its latest checkpoint (run the same command again)"
                    ) from None
                if time.monotonic() > deadline:
                    raise ProducerError(
                        f"the rollout producer sent no batch for step {step} in "
                        f"rollout.producer_timeout_seconds={self.cfg.rollout.producer_timeout_seconds:g}; it was "
                        "stopped (raise the timeout if generating one batch takes longer)"
                    ) from None
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

    def publish(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The trainer's weights after the update of the newest step collected (no wait for the producer)."""
        self.transport.publish(weights, self.last_step)

    def close(self) -> None:
        """Stop the producer (it finishes no batch) and wait for it."""
        self.started = False
        self.transport.stop()


class PublishingEngine(EngineWrapper):
    """The trainer-side engine of an asynchronous run: ``load_weights`` loads ``engine`` (evaluation and
    value pretraining generate with it) and publishes the weights to the producer; the rest is ``engine``'s."""

    def __init__(self, engine: RolloutEngine, rollouts: AsyncRollouts) -> None:
        super().__init__(engine)
        self.rollouts = rollouts

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.engine.load_weights(state_dict)
        self.rollouts.publish(state_dict)
