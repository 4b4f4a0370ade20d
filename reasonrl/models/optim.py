"""The optimiser step shared by the actor, the critic and the reward models."""

from __future__ import annotations

import logging
import math

import torch

log = logging.getLogger(__name__)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimiser should hold: all of them, or with LoRA the adapters (and a critic's head)."""
    return [p for p in model.parameters() if p.requires_grad]


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
