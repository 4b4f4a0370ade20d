"""The training backend: where this process holds the models it trains, chosen once per run.

``SingleProcess`` holds the whole models; ``FSDP2Ranks`` is one rank of a data-parallel group
(``reasonrl.training.placement.parallel``): one of torchrun's processes, or one of the trainer workers of
``dist.backend=ray``, which run this same loop inside Ray actors.  Its policy, reference and critic are
sharded with FSDP2, its rollouts and scores split over the ranks.  Setup places what it builds through
the backend; the loop gathers the engine's weights, saves and restores checkpoints and exports through
it, and never asks which one it has.  Each backend carries its group (``parallel``), whose shares of
rows and sums of metrics place every forward and backward pass (a group of one: the identity).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reasonrl.config import ConfigError
from reasonrl.models.lora import merged_state_dict
from reasonrl.models.value import HEAD_FILE, ValueModel
from reasonrl.reward.verifier_protocol import Scorer
from reasonrl.rollout.engine_protocol import RolloutEngine
from reasonrl.training.placement.parallel import (
    SINGLE_PROCESS,
    DataParallel,
    ShardedEngine,
    ShardedScorer,
    full_state_dict,
    shard_module,
)
from reasonrl.training.record.checkpoint import (
    STATE_FILE,
    ShardedParts,
    export_model,
    latest_checkpoint,
    load_checkpoint,
    load_sharded_checkpoint,
    load_value_weights,
    save_checkpoint,
    save_gathered_value_model,
    save_sharded_checkpoint,
)
from reasonrl.training.update.critic import CriticUpdater
from reasonrl.training.update.step import PolicyUpdater


@dataclass(frozen=True)
class TrainedModels:
    """What a run trains and its checkpoints hold: the policy with its optimiser and LR schedule
    (``PolicyUpdater``), and the critic with its optimiser (None without one)."""

    policy: PolicyUpdater
    critic: CriticUpdater | None

    def sharded_parts(self) -> ShardedParts:
        """The modules with their optimisers, by the names a data-parallel checkpoint's shards use."""
        parts = {"policy": (self.policy.policy, self.policy.optimizer)}
        if self.critic is not None:
            parts["critic"] = (self.critic.model, self.critic.optimizer)
        return parts

    def critic_state(self) -> tuple[ValueModel, torch.optim.Optimizer] | None:
        """What a single-process checkpoint saves of the critic (None without one)."""
        return (self.critic.model, self.critic.optimizer) if self.critic is not None else None


class TrainingBackend(ABC):
    """Where the trained models live and how their weights move: placed while setup builds them, then
    gathered for the rollout engine, checkpointed, restored and exported."""

    saves_when_interrupted: bool
    """Whether Ctrl-C may save a checkpoint before the run stops (a save every rank must join cannot)."""

    def __init__(self, parallel: DataParallel) -> None:
        self.parallel = parallel

    @abstractmethod
    def place(
        self, module: torch.nn.Module, compute_dtype: torch.dtype = torch.float32, offload_optimizer: bool = False
    ) -> None:
        """Put a freshly built model where this backend trains it, before its optimiser is made: its forward
        passes run in ``compute_dtype``; ``offload_optimizer`` (train.offload_optimizer) when it trains."""

    @abstractmethod
    def share_engine(self, engine: RolloutEngine) -> RolloutEngine:
        """The rollout engine as this process generates through it."""

    @abstractmethod
    def share_scorer(self, scorer: Scorer) -> Scorer:
        """The scorer as this process scores through it."""

    @abstractmethod
    def check_resumable(self, run_dir: Path) -> None:
        """A ConfigError saying how to resume, before anything loads, when the run's latest checkpoint
        was written by the other backend."""

    @abstractmethod
    def engine_weights(self, model: torch.nn.Module, engine: RolloutEngine) -> dict[str, torch.Tensor]:
        """The policy's weights as ``engine`` serves them (LoRA merged)."""

    @abstractmethod
    def save_checkpoint(
        self, run_dir: Path, step: int, trained: TrainedModels, state: dict[str, Any], keep: int, tokenizer: Any
    ) -> None:
        """The checkpoint of ``step`` (``state`` in its state.json), keeping the ``keep`` newest."""

    @abstractmethod
    def load_checkpoint(self, path: Path, trained: TrainedModels) -> dict[str, Any]:
        """Restore the models, optimisers, LR schedule and RNG states of ``path``; returns its state.json."""

    @abstractmethod
    def save_critic(self, critic: ValueModel, directory: Path) -> None:
        """The critic as a ``ValueModel`` directory (``critic.path`` loads it)."""

    @abstractmethod
    def load_pretrained_critic(self, critic: ValueModel, directory: Path) -> bool:
        """Load value pretraining's saved critic into ``critic`` if this backend continues from it."""

    def sync_engine(self, model: torch.nn.Module, engine: RolloutEngine) -> None:
        """Send the policy's current weights to the engine (every rank calls it)."""
        engine.load_weights(self.engine_weights(model, engine))

    def export(self, run_dir: Path) -> Path:
        """The final policy, ``run_dir/final``: the last step's checkpoint's, hard-linked by rank 0
        (``export_model``); every rank returns once it is there."""
        final = run_dir / "final"
        if self.parallel.is_main:
            export_model(latest_checkpoint(run_dir), final)  # the last step's: every run saves it
        self.parallel.barrier()
        return final


def checkpoint_writers(run_dir: Path) -> tuple[Path, int] | None:
    """The run's latest checkpoint and how many data-parallel processes wrote it (None: no checkpoint)."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return None
    return checkpoint, json.loads((checkpoint / STATE_FILE).read_text()).get("world_size", 1)


class SingleProcess(TrainingBackend):
    """The whole models in this process (also a Ray run's one trainer worker)."""

    saves_when_interrupted = True

    def __init__(self) -> None:
        super().__init__(SINGLE_PROCESS)

    def place(
        self, module: torch.nn.Module, compute_dtype: torch.dtype = torch.float32, offload_optimizer: bool = False
    ) -> None:
        """Nothing to do: the model stays whole where it was loaded (its optimiser offloads its own state)."""

    def share_engine(self, engine: RolloutEngine) -> RolloutEngine:
        return engine

    def share_scorer(self, scorer: Scorer) -> Scorer:
        return scorer

    def check_resumable(self, run_dir: Path) -> None:
        found = checkpoint_writers(run_dir)
        if found is not None and found[1] > 1:
            checkpoint, writers = found
            raise ConfigError(
                f"{checkpoint} was written by {writers} data-parallel processes; resume it under torchrun: "
                f"torchrun --standalone --nproc-per-node {writers} -m reasonrl train --resume {run_dir}"
            )

    def engine_weights(self, model: torch.nn.Module, engine: RolloutEngine) -> dict[str, torch.Tensor]:
        return merged_state_dict(model)

    def save_checkpoint(
        self, run_dir: Path, step: int, trained: TrainedModels, state: dict[str, Any], keep: int, tokenizer: Any
    ) -> None:
        policy = trained.policy
        save_checkpoint(
            run_dir,
            step,
            policy.model,
            policy.optimizer,
            policy.scheduler,
            state,
            keep,
            trained.critic_state(),
            tokenizer=tokenizer,
        )

    def load_checkpoint(self, path: Path, trained: TrainedModels) -> dict[str, Any]:
        policy = trained.policy
        return load_checkpoint(path, policy.model, policy.optimizer, policy.scheduler, trained.critic_state())

    def save_critic(self, critic: ValueModel, directory: Path) -> None:
        critic.save(directory)

    def load_pretrained_critic(self, critic: ValueModel, directory: Path) -> bool:
        if not (directory / HEAD_FILE).exists():
            return False
        load_value_weights(critic, directory)
        return True


class FSDP2Ranks(TrainingBackend):
    """One rank of a data-parallel group: the models sharded with FSDP2, each rank generating and
    scoring its share of every call, checkpoints written as shards by every rank."""

    saves_when_interrupted = False  # torchrun's and Ray's ranks stop at once

    def place(
        self, module: torch.nn.Module, compute_dtype: torch.dtype = torch.float32, offload_optimizer: bool = False
    ) -> None:
        shard_module(module, self.parallel, compute_dtype, offload_optimizer)

    def share_engine(self, engine: RolloutEngine) -> RolloutEngine:
        return ShardedEngine(engine, self.parallel)

    def share_scorer(self, scorer: Scorer) -> Scorer:
        return ShardedScorer(scorer, self.parallel)

    def check_resumable(self, run_dir: Path) -> None:
        found = checkpoint_writers(run_dir)
        if found is not None and found[1] == 1:
            raise ConfigError(
                f"{found[0]} was written by one process; resume it without torchrun: reasonrl train --resume {run_dir}"
            )

    def engine_weights(self, model: torch.nn.Module, engine: RolloutEngine) -> dict[str, torch.Tensor]:
        """Gathered from every rank's shards (a collective); remote rollout workers that the ranks share
        get them from rank 0 alone, so only rank 0 gathers them, in its CPU memory."""
        return full_state_dict(model, rank0_only=engine.shared_by_ranks)

    def save_checkpoint(
        self, run_dir: Path, step: int, trained: TrainedModels, state: dict[str, Any], keep: int, tokenizer: Any
    ) -> None:
        save_sharded_checkpoint(
            run_dir, step, trained.sharded_parts(), trained.policy.scheduler, state, keep, self.parallel, tokenizer
        )

    def load_checkpoint(self, path: Path, trained: TrainedModels) -> dict[str, Any]:
        return load_sharded_checkpoint(path, trained.sharded_parts(), trained.policy.scheduler)

    def save_critic(self, critic: ValueModel, directory: Path) -> None:
        save_gathered_value_model(critic, directory, self.parallel)

    def load_pretrained_critic(self, critic: ValueModel, directory: Path) -> bool:
        """Never: a restart before the first checkpoint pretrains again."""
        return False


def training_backend(parallel: DataParallel) -> TrainingBackend:
    """The backend of a process in ``parallel`` (``join_data_parallel``): FSDP2 ranks when the group has
    more than one process, else the whole models in this one."""
    return FSDP2Ranks(parallel) if parallel.active else SingleProcess()
