"""The optimiser and its step, shared by the actor, the critic and the reward models."""

from __future__ import annotations

import logging
import math

import torch
from torch.optim.adamw import adamw as adamw_step

from reasonrl.errors import ReasonRLError

log = logging.getLogger(__name__)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimiser should hold: all of them, or with LoRA the adapters (and a critic's head)."""
    return [p for p in model.parameters() if p.requires_grad]


def adamw(
    parameters: list[torch.nn.Parameter], lr: float, weight_decay: float, offload: bool = False
) -> torch.optim.Optimizer:
    """The AdamW of a trained model: torch's over fp32 weights (its fused kernel, on a GPU or the CPU: one kernel over
    every weight, 0.05 s against 0.33 s per step for the 135M model on 2 cores); ``MasterWeightAdamW``
    where torch's would keep the moments in the wrong place or lose the updates: beside bf16 weights
    (train.param_dtype, which keeps an fp32 master copy) or on the device where ``offload`` asks for CPU memory
    (train.offload_optimizer)."""
    if not offload and all(p.dtype == torch.float32 for p in parameters):
        fused = bool(parameters) and all(p.device.type in ("cuda", "cpu") for p in parameters)
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, fused=fused or None)
    return MasterWeightAdamW(parameters, lr=lr, weight_decay=weight_decay, state_device="cpu" if offload else None)


DITHER_SEED = 0  # the seed of dithered_master's offsets (any fixed value: they are below the weights' precision)


def dithered_master(weight: torch.Tensor, where: torch.device, generator: torch.Generator) -> torch.Tensor:
    """An fp32 master for a weight stored in bf16 or fp16, whose fp32 value is not known: the weight plus an offset
    drawn uniformly from its rounding cell (the fp32 values that round to it), so that the master rounds back to the
    weight exactly and lies anywhere in the cell, as the master of a weight that was trained in fp32 would; an fp32
    weight is its own master.

    Why: a master equal to its weight sits at the middle of its cell, so every update smaller than half a cell (at RL
    learning rates nearly all: an AdamW step of 1e-6 against half a cell of 6e-5 at a weight of 0.02) rounds back to
    the same stored weight, for every element at once, until the master has drifted half a cell: the bf16 weights the
    forward passes and the engine use hardly move for tens of steps.  The main job measured it (docs/benchmarks.md,
    "bf16 end to end"): its first optimiser step changed 0.6% of the bf16 weights, by 1.4e-8 on average, where the
    fp32 run's moved every weight by 2.3e-6.  From uniformly placed masters, a step of δ moves a fraction δ / cell of
    the elements by one cell: the fp32 step, in expectation.  The offsets are below the weight's precision: nothing
    the checkpoint knew is changed."""
    value = weight.detach().to(where)
    if value.dtype == torch.float32:
        return value.clone()
    up = torch.nextafter(value, torch.full_like(value, math.inf)).float() - value.float()  # the cell above
    down = value.float() - torch.nextafter(value, torch.full_like(value, -math.inf)).float()  # and below
    share = (torch.rand(value.shape, generator=generator, device=where) - 0.5) * (1 - 2**-10)  # (−½, ½), ties kept out
    return value.float() + share * torch.where(share >= 0, up, down)


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW over an fp32 master copy of each weight, with fp32 moments, all on ``state_device`` (None: beside each
    weight; "cpu": train.offload_optimizer).

    A weight stored in bf16 (train.param_dtype) keeps 8 significant bits: at RL learning rates (1e-6 on weights of
    about 0.02) nearly every update is below half its last bit and would round away.  Here the update lands on the
    fp32 master (``master``, in the state dict beside ``exp_avg`` and ``exp_avg_sq``), and the stored weight is the
    master rounded to its dtype, so what is learnt is the fp32 run's (tests/train/test_memory_options.py).  One step
    runs torch's own AdamW arithmetic (``torch.optim.adamw.adamw``) over every weight of a group at once (its fused
    kernel for masters in CPU memory, ``foreach`` on a GPU): gradients are copied to the state device (from a GPU:
    into pinned buffers, asynchronously), the masters stepped together, and written back.  An fp32 weight already
    where its state is is its own master (no copy), and its step is torch's AdamW's to the bit.  Its state dict is
    torch AdamW's plus ``master`` where a weight has one: checkpoints of torch's load into it.  A master made from a
    bf16 weight (the first step, or such a checkpoint) is ``dithered_master``'s: the weight plus a uniform offset
    within its rounding cell, drawn from ``DITHER_SEED``."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        state_device: torch.device | str | None = None,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.state_device = torch.device(state_device) if state_device is not None else None
        self.dither: dict[torch.device, torch.Generator] = {}
        """One generator per state device for ``dithered_master``'s offsets, seeded with ``DITHER_SEED``: the same
        masters in every run from the same weights."""
        self.accumulated: dict[torch.Tensor, torch.Tensor] = {}
        """Each bf16 weight's gradient summed in fp32 over the micro-batches since the last step, where its state is
        (beside it, or in CPU memory with ``state_device="cpu"``: offloading keeps them off the GPU too, at the cost
        of a copy to the host per micro-batch).  Not for FSDP2's shards (DTensors), whose micro-batches FSDP2 itself
        sums in its fp32 reduce dtype."""
        for group in self.param_groups:
            for param in group["params"]:
                sharded = hasattr(param, "_local_tensor")  # a DTensor
                if param.dtype != torch.float32 and param.requires_grad and not sharded:
                    param.register_post_accumulate_grad_hook(self._accumulate_in_fp32)

    def _accumulate_in_fp32(self, param: torch.Tensor) -> None:
        """Move the gradient a backward pass just left on a bf16 weight into its fp32 sum (``accumulated``), as
        FSDP2 sums the micro-batches' gradients in its reduce dtype: added in bf16, each micro-batch after the
        first would round the sum to 8 significant bits."""
        if param.grad is None:  # another hook took it
            return
        where = self.state_device or param.device
        total = self.accumulated.get(param)
        if total is None:
            self.accumulated[param] = param.grad.to(where, torch.float32)
        else:
            total.add_(param.grad.to(where))
        param.grad = None

    def gradients(self) -> list[torch.Tensor]:
        """The fp32 sums of the bf16 weights' gradients (``accumulated``), for clipping before ``step``."""
        return list(self.accumulated.values())

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.accumulated.clear()

    def _owns_master(self, param: torch.Tensor) -> bool:
        """Whether ``param`` needs a master copy: a weight not in fp32, or not where its state is."""
        where = self.state_device or param.device
        return param.dtype != torch.float32 or param.device != where

    def _placed(self, param: torch.Tensor, state: dict | None = None) -> dict:
        """``state`` (a weight's master, moments and step count) as this optimiser keeps it: fp32 on its state
        device; from the weight itself (and zero moments) before the first step."""
        where = self.state_device or param.device
        state = state or {}
        placed: dict = {"step": state.get("step", torch.tensor(0.0))}
        for key in ("exp_avg", "exp_avg_sq"):
            placed[key] = (
                state[key].to(where, torch.float32)
                if key in state
                else torch.zeros_like(param, dtype=torch.float32, device=where)
            )
        if self._owns_master(param):
            master = state.get("master")
            if master is None:
                generator = self.dither.get(where) or torch.Generator(where).manual_seed(DITHER_SEED)
                self.dither[where] = generator
                master = dithered_master(param, where, generator)
            placed["master"] = master.to(where, torch.float32).clone()
        return placed

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None or p in self.accumulated]
            if not params:
                continue
            states = []
            for param in params:
                if not self.state[param]:
                    self.state[param].update(self._placed(param))
                states.append(self.state[param])
            masters = [s.get("master", p) for p, s in zip(params, states, strict=True)]
            grads = [self._state_gradient(p, s) for p, s in zip(params, states, strict=True)]
            beta1, beta2 = group["betas"]
            adamw_step(
                masters,
                grads,
                [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states],
                [],
                [s["step"] for s in states],
                # on the CPU torch's fused kernel, as ``adamw`` gives fp32 weights there: the same step to the bit
                fused=all(m.device.type == "cpu" for m in masters) or None,
                foreach=all(m.device == masters[0].device for m in masters) and masters[0].device.type != "cpu",
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
            )
            for param, master in zip(params, masters, strict=True):
                if master is not param:
                    param.copy_(master, non_blocking=True)  # the weight: the master rounded to its dtype
        return loss

    def _state_gradient(self, param: torch.Tensor, state: dict) -> torch.Tensor:
        """``param``'s gradient where its state is, in fp32 (from a GPU into a pinned buffer kept in the state)."""
        where = state["exp_avg"].device
        grad = self.accumulated.get(param, param.grad)
        if grad.device == where:
            return grad if grad.dtype == torch.float32 else grad.float()
        if where.type == "cpu" and grad.device.type == "cuda":
            buffer = state.get("grad_buffer")
            if buffer is None or buffer.shape != grad.shape:
                buffer = state["grad_buffer"] = torch.empty(grad.shape, dtype=torch.float32, pin_memory=True)
            buffer.copy_(grad, non_blocking=True)
            torch.cuda.current_stream(grad.device).synchronize()
            return buffer
        return grad.to(where, torch.float32)

    def state_dict(self) -> dict:
        """torch AdamW's state dict, with each weight's ``master`` (a pinned gradient buffer is not state)."""
        saved = super().state_dict()
        saved["state"] = {k: {n: v for n, v in s.items() if n != "grad_buffer"} for k, s in saved["state"].items()}
        return saved

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, except that the master and the moments stay fp32 where this optimiser keeps them: torch's
        would first cast them to each weight's dtype and device (losing the master's bits, and filling the GPU
        with what offloading keeps off it).  A state without a master (torch AdamW's) starts it from the weight."""
        super().load_state_dict({**state_dict, "state": {}})  # the groups' settings only
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, param in zip(saved_ids, params, strict=True):
            if saved_id in state_dict["state"]:
                self.state[param] = self._placed(param, state_dict["state"][saved_id])


class NonFiniteWeightsError(ReasonRLError, RuntimeError):
    """A trained model's weights hold NaN or an infinity: nothing trained from there on means anything."""


def has_non_finite_weights(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s weights (this process's shards of them under FSDP2) is NaN or infinite (or so
    large that their fp32 sum overflows).  One sum per weight: NaN and infinities reach it, and it reads each
    weight once (0.03 s for the 135M model on 2 cores, where ``isfinite`` per weight took 0.3 s)."""
    local = [getattr(p, "_local_tensor", p).detach() for p in model.parameters()]
    return bool(local) and not bool(torch.stack([t.sum(dtype=torch.float32) for t in local]).sum().isfinite())


def apply_gradients(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    grad_clip: float | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> float:
    """Clip and apply the accumulated gradients; returns the gradient norm.

    A non-finite norm (a NaN/inf loss) skips the step with a warning and leaves the weights as they were.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if isinstance(optimizer, MasterWeightAdamW):  # bf16 weights' gradients, summed in fp32
        grads += optimizer.gradients()
    grad_norm = clip_gradients(grads, grad_clip)
    if math.isfinite(grad_norm):
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    else:
        name = type(model).__name__
        log.warning("skipping an optimiser step of %s: the gradient norm is %s (NaN/inf loss)", name, grad_norm)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def clip_gradients(grads: list[torch.Tensor], max_norm: float | None) -> float:
    """Scale ``grads`` in place so that their global L2 norm is at most ``max_norm`` (None: no clipping); returns
    the norm before.  torch's ``clip_grad_norm_`` arithmetic (the factor max_norm / (norm + 1e-6), at most 1) on
    gradient tensors rather than on parameters: the fp32 sums of bf16 weights' gradients are no parameter's
    ``.grad``."""
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    norm = total.item()
    if max_norm is not None and math.isfinite(norm):
        factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(factor.to(grad.device))
    return norm
