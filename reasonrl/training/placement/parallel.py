"""Data parallelism: the group of processes a trainer runs in, and what each rank does of the work.

One process is rank 0 of a group of 1, and every collective below is then the identity, so the
single-process path runs the same code.  Under ``torchrun`` (docs/distributed.md) every rank holds
the same rollout batch: the prompts are generated in shares (``ShardedEngine``: whole groups per rank,
each prompt sampling from its own seeded stream), and the completions gathered, so everything
computed over the whole batch (group statistics, whitening, DAPO's informative-group count and
refill, KL controller updates, metrics) is computed identically on every rank.  The forward and
backward passes are split: each rank takes its share of every mini-batch's rows, the loss
denominators are counted over the whole mini-batch, and FSDP2 sums the ranks' gradients, so the
gradient equals the single-process one (docs/algorithms.md, Conventions 5).

FSDP2 issues collectives in every forward and backward of a sharded module, so all ranks must run
the same number of them: ``lockstep`` pads a rank's micro-batches with loss-free ones.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from reasonrl.batch import RolloutBatch
from reasonrl.config import Config, ConfigError
from reasonrl.data.examples import Example
from reasonrl.reward.verifier_protocol import RewardResult, Scorer, ScoringContext
from reasonrl.rollout.engine_protocol import Completion, EngineWrapper, RolloutEngine, SamplingParams, share_params
from reasonrl.rollout.shards import split_at_group_boundaries


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group (``world_size`` 1: a single process)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes metrics, plots, the summary, the export and the run record."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """More than one process: collectives run."""
        return self.world_size > 1

    def share(self, count: int) -> range:
        """This rank's contiguous share of ``count`` rows (sizes differ by at most one)."""
        base, extra = divmod(count, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))

    def sum_(self, tensor: Tensor) -> Tensor:
        """All-reduce ``tensor`` in place (sum over ranks); returns it."""
        if self.active:
            dist.all_reduce(tensor)
        return tensor

    def sum_metrics(self, values: Mapping[str, float]) -> dict[str, float]:
        """Each metric summed over ranks (the same keys on every rank, in any order)."""
        if not self.active:
            return dict(values)
        keys = sorted(values)
        total = self.sum_(torch.tensor([values[k] for k in keys], dtype=torch.float64))
        return dict(zip(keys, total.tolist(), strict=True))

    def max(self, value: int) -> int:
        """The largest ``value`` over ranks."""
        if not self.active:
            return value
        out = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return int(out)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order."""
        if not self.active:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` (picklable) on every rank."""
        if not self.active:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def row_groups(
        self, batch: RolloutBatch, token_budget: int, packed: bool = True, share_prompts: bool = False,
        lanes: bool = True,
    ) -> list[list[int]]:  # fmt: skip
        """Rows of ``batch`` this rank computes in forward-only passes (old log-probs, values), grouped in
        micro-batches of at most ``token_budget`` tokens (``RolloutBatch.micro_batch_rows``), then padded
        with empty groups to the busiest rank's count (a rank runs a forward for those too, and keeps
        nothing of it)."""
        if not self.active:
            return batch.micro_batch_rows(token_budget, packed, share_prompts, lanes)
        mine = list(self.share(len(batch)))
        share = batch.select(mine) if mine else None
        local = share.micro_batch_rows(token_budget, packed, share_prompts, lanes) if share else []
        groups = [[mine[i] for i in g] for g in local]
        return groups + [[] for _ in range(self.max(len(groups)) - len(groups))]

    def lockstep(
        self, micro_batches: list[RolloutBatch], template: RolloutBatch, device: torch.device
    ) -> list[RolloutBatch]:
        """``micro_batches`` padded with loss-free copies of one ``template`` row (on ``device``) up to the
        largest count over ranks: every rank then runs as many forwards and backwards as the others."""
        missing = self.max(len(micro_batches)) - len(micro_batches)
        if not missing:
            return micro_batches
        return micro_batches + [template.select([0]).without_loss().to(device)] * missing


SINGLE_PROCESS = DataParallel()
"""One process: rank 0 of 1."""


def init_from_environment(timeout_minutes: float = 60.0) -> DataParallel:
    """Join the process group ``torchrun`` describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR, …):
    gloo for CPU tensors, NCCL for CUDA ones.  Without those variables: one process."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return DataParallel()
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return DataParallel(dist.get_rank(), dist.get_world_size())


def join_data_parallel(cfg: Config) -> DataParallel:
    """The data-parallel group of a run: the one torchrun (or a Ray trainer group) launched this process
    in, else a single process.  A mismatch between the launch and ``dist.backend`` is a ConfigError."""
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    backend = cfg.dist.backend
    if backend == "torch" and "RANK" not in os.environ:
        raise ConfigError(
            "dist.backend=torch trains data-parallel processes that torchrun starts: "
            "torchrun --standalone --nproc-per-node N -m reasonrl train PRESET [KEY=VALUE ...]"
        )
    if launched and backend == "none":
        raise ConfigError(
            f"this process is one of {os.environ['WORLD_SIZE']} that torchrun started, but dist.backend=none; "
            "set dist.backend=torch (or auto) to train them data-parallel, or run one process"
        )
    return init_from_environment(collective_timeout_seconds(cfg) / 60) if launched else SINGLE_PROCESS


def collective_timeout_seconds(cfg: Config) -> float:
    """How long a rank waits in a collective: dist.worker_timeout_seconds, or three times that in an
    asynchronous Ray run, where the other ranks wait while rank 0's evaluation waits for the producer's engine
    call, loads its weights into the rollout workers and generates (each bounded by the worker timeout)."""
    shared_workers = cfg.dist.backend == "ray" and cfg.rollout.max_staleness > 0
    return cfg.dist.worker_timeout_seconds * (3 if shared_workers else 1)


class ShardedEngine(EngineWrapper):
    """A rollout engine whose calls are split over the ranks: each generates its share of the prompts
    (whole groups of identical prompts on one rank, sampled with their batch-wide indices) and every
    rank gets all the completions, in order.  With one rank it is the engine itself."""

    def __init__(self, engine: RolloutEngine, parallel: DataParallel) -> None:
        super().__init__(engine)
        self.parallel = parallel

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        shares = split_at_group_boundaries(prompts, self.parallel.world_size)
        mine = shares[self.parallel.rank]
        local = self.engine.generate([prompts[i] for i in mine], share_params(params, mine.start, mine.stop))
        return [c for part in self.parallel.gather(local) for c in part]

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        """Every rank's own engine loads the weights; an engine the ranks share (remote rollout workers)
        gets them from rank 0 alone."""
        if not self.engine.shared_by_ranks or self.parallel.is_main:
            self.engine.load_weights(state_dict)
        self.parallel.barrier()


class RankZeroEngine(EngineWrapper):
    """An engine that rank 0 alone calls, for every rank: it generates all the prompts and broadcasts the
    completions, and it alone loads weights.  For engines whose weights only rank 0 knows: the rollout
    workers of an asynchronous Ray run, which rank 0's producer shares.  With one rank it is the engine."""

    shared_by_ranks = True  # type: ignore[assignment]

    def __init__(self, engine: RolloutEngine, parallel: DataParallel) -> None:
        super().__init__(engine)
        self.parallel = parallel

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        return self.parallel.broadcast(self.engine.generate(prompts, params) if self.parallel.is_main else None)

    def load_weights(self, state_dict: Mapping[str, Tensor]) -> None:
        if self.parallel.is_main:
            self.engine.load_weights(state_dict)


def shard_module(
    module: torch.nn.Module,
    parallel: DataParallel,
    compute_dtype: torch.dtype = torch.float32,
    offload_optimizer: bool = False,
) -> None:
    """Shard ``module`` over the ranks with FSDP2 (``fully_shard``): each transformer block (the classes a
    Hugging Face model lists in ``_no_split_modules``) is its own unit, ``module`` the root that holds
    the rest (embeddings, final norm, LM head, value head: tied embeddings stay in one unit).

    With a bf16 ``compute_dtype`` the weights are all-gathered in bf16 and gradients reduced in fp32
    (``MixedPrecisionPolicy``), whatever dtype the shards are stored in (train.param_dtype).  With
    ``offload_optimizer`` on a GPU the shards of the weights, their gradients and so AdamW's moments live
    in CPU memory, where the optimiser steps (``CPUOffloadPolicy``); on a CPU device they are there already.

    Gradients are reduced as a sum, not a mean: every rank's loss already carries the whole mini-batch's
    denominators, so the sum is the single-process gradient (and gloo's reduce-scatter has averaged
    wrongly: pytorch issue #162338)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    device_type = next(module.parameters()).device.type
    bf16 = compute_dtype == torch.bfloat16
    options = {
        "mesh": init_device_mesh(device_type, (parallel.world_size,)),
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy(),
        "offload_policy": CPUOffloadPolicy() if offload_optimizer and device_type != "cpu" else OffloadPolicy(),
    }
    blocks = {name for sub in module.modules() for name in getattr(sub, "_no_split_modules", None) or ()}
    for sub in list(module.modules()):
        if type(sub).__name__ in blocks:
            fully_shard(sub, **options)
    fully_shard(module, **options)
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.set_gradient_divide_factor(1.0)
            sub.set_force_sum_reduction_for_comms(True)


def reduce_gradients_after(module: torch.nn.Module, last: bool) -> None:
    """Gradient accumulation over a mini-batch's micro-batches: a module sharded by ``shard_module``
    reduces its gradients over the ranks only in the backward of the ``last`` one (one reduce-scatter
    per mini-batch, not one per micro-batch); a plain module is left alone."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(last)


def full_state_dict(module: torch.nn.Module, rank0_only: bool = False) -> dict[str, Tensor]:
    """The whole (unsharded) state dict of a module sharded by ``shard_module`` (a collective: every rank
    calls it): on every rank, or with ``rank0_only`` in rank 0's CPU memory (the others get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    return get_model_state_dict(module, options=options)


class ShardedScorer:
    """A scorer whose calls are split over the ranks: each scores its share of the responses (code tests,
    judges) and every rank gets all the results, in order.  Scorers are deterministic, so the
    results are those of one process scoring everything."""

    def __init__(self, scorer: Scorer, parallel: DataParallel) -> None:
        self.scorer, self.parallel = scorer, parallel

    def score_examples(
        self, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None = None
    ) -> list[RewardResult]:
        mine = self.parallel.share(len(responses))
        local = self.scorer.score_examples(
            [examples[i] for i in mine], [responses[i] for i in mine], None if context is None else context.rows(mine)
        )
        return [result for part in self.parallel.gather(local) for result in part]

    def close(self) -> None:
        self.scorer.close()


@dataclasses.dataclass(frozen=True)
class RemoteWorkers:
    """Rollout engines and scorers that run elsewhere (Ray actors, ``reasonrl.dist``) and that a trainer
    rank uses instead of building its own: the config describes them (``dist.*``), so they are not the
    user's custom objects of a run's record."""

    engine: RolloutEngine
    """Generates for every rank; set ``shared_by_ranks = True`` on it so that rank 0 alone sends it weights."""

    scorer: Scorer
    """Scores for every rank (each rank sends it its share of the responses)."""
