"""``dist.backend=ray``: one driver, rollout and reward workers, and a group of trainer workers.

The driver joins (or starts) the cluster, starts ``dist.rollout_workers`` rollout workers and
``dist.reward_workers`` scorers, then ``dist.trainer_workers`` trainer actors that form one
torch.distributed group and each run ``fit()`` as a data-parallel rank (the training backend
``reasonrl.training.backend.FSDP2Ranks``; one trainer worker: ``SingleProcess``), generating and scoring
through the shared workers.  A worker that dies stops the run with an error
naming it and the last checkpoint; running the same command again resumes from it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from reasonrl.config import Config
from reasonrl.config.plan import vllm_engine_options
from reasonrl.data.examples import Example
from reasonrl.dist.cluster import (
    Placement,
    WorkerHost,
    gather,
    import_ray,
    kill_workers,
    start_ray,
    start_workers,
    stop_ray,
)
from reasonrl.dist.cluster_errors import WorkerDiedError
from reasonrl.dist.engines import EngineSettings, RayRolloutEngines
from reasonrl.dist.scoring import RayScorer
from reasonrl.reward.verifier_protocol import RewardResult, Scorer, ScoringContext
from reasonrl.rollout.engine_protocol import Completion, RolloutEngine, SamplingParams

RUN_SECONDS = 10.0**9  # a training call has no time limit of its own; its workers' calls have


def run_scorer(cfg: Config) -> Scorer:
    """The scorer a reward worker builds: the run's reward router and reward functions, on the CPU."""
    from reasonrl.models.load import compute_dtype
    from reasonrl.training.run_inputs import build_scorer, preflight

    return build_scorer(cfg, compute_dtype(cfg.model.dtype), torch.device("cpu"), terms=preflight(cfg))


class SharedEngines(RolloutEngine):
    """The rollout workers as one trainer rank sees them: it generates through them, rank 0 alone sends
    them weights (``shared_by_ranks``), and stopping them is the driver's job."""

    shared_by_ranks = True  # type: ignore[assignment]

    def __init__(self, engines: RayRolloutEngines) -> None:
        self.engines = engines
        self.stop_token_ids = engines.stop_token_ids

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        return self.engines.generate(prompts, params)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.engines.load_weights(state_dict)


class SharedScorer:
    """The reward workers as one trainer rank sees them (closing them is the driver's job)."""

    def __init__(self, scorer: RayScorer) -> None:
        self.scorer = scorer

    def score_examples(
        self, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None = None
    ) -> list[RewardResult]:
        return self.scorer.score_examples(examples, responses, context)

    def close(self) -> None:
        pass


class TrainerHost(WorkerHost):
    """One trainer worker (a Ray actor): a data-parallel rank running ``fit()``."""

    def address(self) -> tuple[str, int]:
        """This node's address and a free port: where rank 0 hosts the process group's rendezvous."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address().strip("[]"), port

    def train(
        self,
        cfg: Config,
        run_dir: Path,
        preset: str,
        overrides: tuple[str, ...],
        workers: Any,
        rank: int,
        world: int,
        master: tuple[str, int],
    ) -> dict[str, Any]:
        """``fit()`` as rank ``rank`` of ``world`` (torch.distributed's env:// rendezvous at ``master``)."""
        from reasonrl.training.loop import fit

        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR=master[0], MASTER_PORT=str(master[1])
        )
        log_to_driver(rank)
        return fit(cfg, run_dir, preset=preset, overrides=overrides, show_progress=False, workers=workers)


def log_to_driver(rank: int) -> None:
    """A trainer worker's log as the command line's: the run's notices (a checkpoint saved, a run continued)
    from rank 0 and errors from every rank, as plain lines on the worker's stderr, which Ray passes on to
    the driver's."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("reasonrl")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.ERROR)
    logger.propagate = False


def follow_progress(calls: list[Any], metrics: Path, steps: int, show: bool | None, poll_seconds: float = 2.0) -> None:
    """The progress of a run whose trainers are Ray workers, as a run in one process shows it: the accuracy
    it starts from and the steps that rank 0 writes to ``metrics``, until one of ``calls`` (the trainers'
    ``train``) returns or fails, and what it wrote last."""
    import ray

    from reasonrl.training.record.metrics import ProgressDisplay, read_metrics

    shown, finished = 0, False
    with ProgressDisplay(steps, 0, enabled=show) as progress:
        while not finished:
            finished = bool(ray.wait(calls, num_returns=1, timeout=poll_seconds)[0])
            records = read_metrics(metrics)
            for record in records[shown:]:
                if record["step"] > 0:
                    progress.update(record["step"], record)
                elif "eval/accuracy" in record:
                    progress.accuracy_before(record["eval/accuracy"])
            shown = len(records)


def fit_on_ray(
    cfg: Config, run_dir: Path, *, preset: str, overrides: tuple[str, ...] = (), show_progress: bool | None = False
) -> dict[str, Any]:
    """Train ``cfg`` with Ray workers (``dist.*``); returns trainer rank 0's summary."""
    from reasonrl.training.record.checkpoint import latest_checkpoint
    from reasonrl.training.placement.parallel import RemoteWorkers

    from reasonrl.training.record.rundir import make_run_dir

    ray = import_ray()
    d = cfg.dist
    run_dir = run_dir.resolve()  # trainer workers on other nodes start in another working directory
    make_run_dir(run_dir)  # a directory that holds no run is refused before any worker loads a model
    if Path(cfg.model.name_or_path).exists():
        cfg = dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, name_or_path=str(Path(cfg.model.name_or_path).resolve()))
        )
    connected_here = not ray.is_initialized()  # a caller's connection (a notebook, a test) stays up
    start_ray(d.address)
    started: list[Any] = []
    try:
        # 1. the rollout workers serve the initial policy, the reward workers the run's scorer
        settings = EngineSettings(
            cfg.model.name_or_path, cfg.rollout.engine, cfg.model.dtype, vllm_options=vllm_engine_options(cfg)
        )
        engines = RayRolloutEngines(
            settings, d.rollout_workers, gpus_per_worker=d.gpus_per_rollout_worker, timeout_s=d.worker_timeout_seconds
        )
        started.append(engines)
        scorer = RayScorer(functools.partial(run_scorer, cfg), d.reward_workers, timeout_s=d.worker_timeout_seconds)
        started.append(scorer)
        # 2. the trainer group: rank 0 hosts the rendezvous, every rank runs fit() through the shared workers
        placement = Placement("trainer", d.trainer_workers, gpus=d.gpus_per_trainer_worker)
        trainers: list = []
        started.append((trainers, placement))
        trainers += start_workers(TrainerHost, (), placement, d.worker_timeout_seconds)
        first = trainers[0]
        master = gather([(first, first.actor.address.remote())], d.worker_timeout_seconds)[0]
        workers = RemoteWorkers(SharedEngines(engines), SharedScorer(scorer))
        calls = [
            (w, w.actor.train.remote(cfg, run_dir, preset, overrides, workers, rank, len(trainers), master))
            for rank, w in enumerate(trainers)
        ]
        # 3. follow the run (rank 0's metrics.jsonl) until a trainer returns; the first worker to die
        # (or to fail) stops it
        follow_progress([ref for _, ref in calls], run_dir / "metrics.jsonl", cfg.train.rollout_steps, show_progress)
        try:
            return gather(calls, RUN_SECONDS)[0]
        except WorkerDiedError as exc:
            checkpoint = latest_checkpoint(run_dir)
            raise exc.with_checkpoint(checkpoint or "none yet (a restart begins again)") from exc
    finally:
        for owned in reversed(started):
            if isinstance(owned, tuple):
                kill_workers(owned[0])
                owned[1].release()
            else:
                owned.close()
        if connected_here:
            stop_ray()
