"""Rollout engines as Ray actors, behind the RolloutEngine protocol.

Each rollout worker is an actor that loads the model and builds one of reasonrl's engines (fast,
hf, vllm) on its own machine, from picklable settings.  ``RayRolloutEngines.generate`` gives each
worker a contiguous share of the batch, never splitting a group, with ``first_index`` set to the
share's offset: every prompt samples from its own seeded stream, so the K workers together sample
exactly what one engine would for the whole batch.  ``load_weights`` puts the state dict in Ray's
object store once; every worker reads it from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from reasonrl.dist.cluster import Placement, WorkerHost, gather, kill_workers, start_workers
from reasonrl.rollout.engine_protocol import Completion, RolloutEngine, SamplingParams, share_params
from reasonrl.rollout.shards import split_at_group_boundaries


@dataclass(frozen=True)
class EngineSettings:
    """How a rollout worker builds its engine; resolved on the worker's machine."""

    model: str
    """Model spec (a name, a directory, a run directory...) as ``model.name_or_path``; it must be
    readable on every node (a shared filesystem or the same path everywhere)."""

    engine: str = "auto"
    """fast, hf, vllm or auto (as ``rollout.engine``)."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The engine's compute dtype (as ``model.dtype``); auto is decided by the worker's hardware."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the worker's model lives; auto = the GPU Ray gave the worker, else the CPU."""

    attention: str | None = None
    """transformers' attention kernel for the worker's model (hf engine); None = its default."""

    vllm_options: Mapping[str, Any] = field(default_factory=dict)
    """rollout.vllm settings, for the vllm engine only."""

    options: Mapping[str, Any] = field(default_factory=dict)
    """More engine keyword options (e.g. max_batch_sequences)."""


class EngineHost(WorkerHost):
    """One rollout worker (a Ray actor): builds its engine in ``setup``, then serves it."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.engine: RolloutEngine | None = None

    def setup(self) -> None:
        """Load the model and build the engine, the same way the single-process trainer does."""
        from reasonrl.models.load import compute_dtype, load_model, load_tokenizer, resolve_device
        from reasonrl.rollout import build_engine

        s = self.settings
        device = resolve_device(s.device)
        tokenizer = load_tokenizer(s.model)
        model = load_model(s.model, torch.float32, s.attention, device)
        dtype = compute_dtype(s.dtype)
        self.engine = build_engine(s.engine, model, tokenizer, s.vllm_options, dtype=dtype, **s.options)

    def stop_token_ids(self) -> frozenset[int]:
        return self._engine.stop_token_ids

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        return self._engine.generate(prompts, params)

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Any) -> None:
        """Load a state dict, given as it is or as a Ray ObjectRef of it."""
        import ray

        if isinstance(weights, ray.ObjectRef):
            weights = ray.get(weights)
        self._engine.load_weights(weights)

    @property
    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError("the rollout worker has no engine: call setup() first")
        return self.engine


class RayRolloutEngines(RolloutEngine):
    """The RolloutEngine protocol over ``workers`` Ray actors, each serving its own engine.

    ``gpus_per_worker`` > 0 reserves a placement group bundle per worker (see ``Placement``) with
    ``cpus_per_worker`` CPUs (None: 1 with GPUs, else 0);
    ``timeout_s`` bounds every wait on the workers (start-up, one generate, one weight load): a
    worker that dies or stays silent longer raises WorkerDiedError naming it.

    The object pickles (Ray actor handles inside), so trainer ranks running as Ray actors can share
    it: each sends its own share of the prompts, and rank 0 alone sends weights (``shared_by_ranks``).
    Only the process that made it closes it.
    """

    shared_by_ranks = True
    """One set of engines serves every trainer rank: only rank 0 sends it weights."""

    def __init__(
        self,
        settings: EngineSettings,
        workers: int,
        *,
        gpus_per_worker: float = 0.0,
        cpus_per_worker: float | None = None,
        timeout_s: float = 1800.0,
        placement_timeout_s: float = 300.0,
    ) -> None:
        if cpus_per_worker is None:
            cpus_per_worker = 1.0 if gpus_per_worker > 0 else 0.0
        if gpus_per_worker == 0 and settings.device == "cuda":
            raise ValueError("rollout workers on cuda need GPUs from Ray: set dist.gpus_per_rollout_worker > 0")
        if gpus_per_worker == 0 and settings.device == "auto":
            settings = dataclasses.replace(settings, device="cpu")  # no GPU was given to the worker
        self.timeout_s = timeout_s
        self.placement = Placement("rollout", workers, gpus_per_worker, cpus_per_worker, placement_timeout_s)
        try:
            self.workers = start_workers(EngineHost, (settings,), self.placement, timeout_s, setup="setup")
        except BaseException:
            self.placement.release()
            raise
        first = self.workers[0]
        self.stop_token_ids: frozenset[int] = gather([(first, first.actor.stop_token_ids.remote())], timeout_s)[0]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in prompt order: each worker generates its share, all at once."""
        shares = split_at_group_boundaries(prompts, len(self.workers))
        calls = [
            (
                worker,
                worker.actor.generate.remote(
                    [list(prompts[i]) for i in share],
                    share_params(params, share.start, share.stop),
                ),
            )
            for worker, share in zip(self.workers, shares, strict=True)
            if len(share)
        ]
        return [completion for part in gather(calls, self.timeout_s) for completion in part]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Send the trainer's weights to every worker: put in the object store once (from CPU memory)
        and read by each worker; returns when all have loaded them."""
        import ray

        weights = ray.put({name: tensor.detach().cpu() for name, tensor in state_dict.items()})
        gather([(worker, worker.actor.load_weights.remote(weights)) for worker in self.workers], self.timeout_s)

    def close(self) -> None:
        """Stop the workers and give their resources back."""
        kill_workers(self.workers)
        self.workers = []
        self.placement.release()

    def __enter__(self) -> RayRolloutEngines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
