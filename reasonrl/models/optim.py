"""The optimiser and its step, shared by the actor, the critic and the reward models."""

from __future__ import annotations

import logging
import math

import torch
from torch.optim.adamw import adamw as adamw_step

log = logging.getLogger(__name__)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimiser should hold: all of them, or with LoRA the adapters (and a critic's head)."""
    return [p for p in model.parameters() if p.requires_grad]


def adamw(
    parameters: list[torch.nn.Parameter], lr: float, weight_decay: float, offload: bool = False
) -> torch.optim.Optimizer:
    """The AdamW of a trained model: torch's over fp32 weights; ``Fp32StateAdamW`` where torch's would keep
    the moments in the wrong place: beside bf16 weights (train.param_dtype) or on the device where
    ``offload`` asks for CPU memory (train.offload_optimizer)."""
    if not offload and all(p.dtype == torch.float32 for p in parameters):
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    return Fp32StateAdamW(parameters, lr=lr, weight_decay=weight_decay, state_device="cpu" if offload else None)


class Fp32StateAdamW(torch.optim.Optimizer):
    """AdamW with fp32 moments for weights stored in any dtype, the moments optionally in CPU memory.

    torch's AdamW keeps its moments in each weight's dtype and on its device (bf16 weights get bf16
    moments) and cannot step elsewhere; torchao's CPUOffloadOptimizer can, but torchao is no dependency
    of reasonrl, and neither does fp32 moments over bf16 weights.  This optimiser keeps ``exp_avg`` and
    ``exp_avg_sq`` in fp32 on ``state_device`` (None: beside each weight) and steps one weight at a time:
    the weight and its gradient are copied there in fp32, torch's own AdamW arithmetic
    (``torch.optim.adamw.adamw``) updates the copy, and the copy is written back, rounded to the weight's
    dtype.  There is no fp32 master copy: a bf16 weight keeps what bf16 can hold of each update.  An fp32
    weight already where its moments are is its own copy, so the step is torch's AdamW's, to the bit.
    Its state dict is torch AdamW's (``step``, ``exp_avg``, ``exp_avg_sq`` per weight): checkpoints of
    either load into the other."""

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

    def _placed(self, param: torch.Tensor, state: dict | None = None) -> dict:
        """``state`` (a weight's moments and step count) as this optimiser keeps it: the moments fp32 on its
        state device; zeros before the first step."""
        where = self.state_device or param.device
        if not state:
            zeros = torch.zeros_like(param, dtype=torch.float32, device=where)
            return {"step": torch.tensor(0.0), "exp_avg": zeros, "exp_avg_sq": zeros.clone()}
        moments = {k: state[k].to(where, torch.float32) for k in ("exp_avg", "exp_avg_sq")}
        return {"step": state["step"], **moments}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state.update(self._placed(param))
                where = state["exp_avg"].device
                weight = param.detach().to(where, torch.float32)
                grad = param.grad.to(where, torch.float32)
                adamw_step(
                    [weight],
                    [grad],
                    [state["exp_avg"]],
                    [state["exp_avg_sq"]],
                    [],
                    [state["step"]],
                    foreach=False,
                    amsgrad=False,
                    beta1=beta1,
                    beta2=beta2,
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=False,
                )
                if weight.dtype != param.dtype or weight.device != param.device:
                    param.copy_(weight)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, except that the moments stay fp32 where this optimiser keeps them: torch's would
        first cast them to each weight's dtype and device (losing bits, and filling the GPU with what
        offloading keeps off it)."""
        super().load_state_dict({**state_dict, "state": {}})  # the groups' settings only
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, param in zip(saved_ids, params, strict=True):
            if saved_id in state_dict["state"]:
                self.state[param] = self._placed(param, state_dict["state"][saved_id])


class NonFiniteWeightsError(RuntimeError):
    """A trained model's weights hold NaN or an infinity: nothing trained from there on means anything."""


def has_non_finite_weights(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s weights (this process's shards of them under FSDP2) is NaN or infinite."""
    local = [getattr(p, "_local_tensor", p).detach() for p in model.parameters()]
    return bool(local) and not bool(torch.stack([torch.isfinite(t).all() for t in local]).all())


def apply_gradients(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    grad_clip: float | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> float:
    """Clip and apply the accumulated gradients; returns the gradient norm.

    A non-finite norm (a NaN/inf loss) skips the step with a warning and leaves the weights as they were.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip or math.inf).item()
    if math.isfinite(grad_norm):
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    else:
        name = type(model).__name__
        log.warning("skipping an optimiser step of %s: the gradient norm is %s (NaN/inf loss)", name, grad_norm)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm
