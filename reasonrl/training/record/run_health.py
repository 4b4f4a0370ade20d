"""The checks that stop a run instead of letting it train on nothing or on the wrong weights.

Peers log these numbers and train on; a reasonrl run says it at once, and stops where it cannot recover
(``RunHealthError``, one line; docs/metrics.md, "Runs that stop"):

1. **The engine serves the trainer's weights.**  After each weight update, the engine's log-probs of the
   tokens it sampled with the newest weights are compared with the trainer's own (``engine_gap``).  A mean
   gap above ``ENGINE_GAP_FACTOR`` × the run's first measured gap and above ``ENGINE_GAP_FLOOR`` means the
   update did not reach the engine (a known failure of sleep modes and LoRA adapters): the run stops,
   naming the engine.
2. **No learning signal.**  A batch whose every advantage is zero takes no update (``rl_step``); a run whose
   responses all got one reward for ``train.constant_reward_stop_steps`` steps in a row stops.
3. **A mismatch that grows.**  A gap above ``ENGINE_GAP_WARNING`` warns once with its likely causes.
4. **A loss that is NaN.**  ``NON_FINITE_GRADIENT_STEPS`` steps in a row whose policy gradient was NaN or
   infinite stop the run (one such step is skipped, as a bad batch; weights an update left NaN stop it at once:
   ``reasonrl.training.update.step.refuse_non_finite_weights``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from reasonrl.algo.masked import masked_mean
from reasonrl.batch import RolloutBatch
from reasonrl.errors import ReasonRLError

log = logging.getLogger(__name__)

ENGINE_GAP_FACTOR = 10.0
"""How many times the first step's engine-vs-trainer gap a later gap may reach before the run stops."""
ENGINE_GAP_FLOOR = 0.05
"""The smallest mean |Δ log-prob| per token that stops a run: below it a gap is float rounding (a bf16
engine against an fp32 trainer measures 0.02–0.04; docs/benchmarks.md)."""
ENGINE_GAP_WARNING = 0.1
"""A mean |Δ log-prob| per token above which the run warns once (what bf16 rounding explains is well below)."""
NON_FINITE_GRADIENT_STEPS = 3
"""Rollout steps in a row whose policy gradient was NaN or infinite (each such optimiser step skipped) that stop
a run: one is a bad batch; three are a loss that no longer means anything (weights that overflow its forward)."""


class RunHealthError(ReasonRLError, RuntimeError):
    """A run that would train on nothing or on weights other than its own: stopped, with the reason."""


def engine_gap(batch: RolloutBatch, step: int) -> float | None:
    """Mean |engine log-prob − trainer log-prob| over the tokens the engine sampled with the trainer's
    current weights (version ``step`` − 1: in an asynchronous run older versions' tokens are left out, and
    T-PPO's earlier windows'); None without such tokens or without the trainer's log-probs."""
    if batch.old_logprobs is None:
        return None
    mask = batch.response_mask.bool()
    if batch.pool_window is not None:
        mask = mask & ~batch.pool_window.stale_mask
    if batch.policy_versions is not None:
        mask = mask & (batch.policy_versions == step - 1)
    if not mask.any():
        return None
    return masked_mean((batch.old_logprobs - batch.rollout_logprobs).abs(), mask).item()


@dataclass
class RunHealth:
    """What the checks remember of the run so far (in this process: a resumed run measures afresh)."""

    engine: str
    """The rollout engine as the error names it (rollout.engine, auto resolved)."""
    constant_reward_stop_steps: int
    """train.constant_reward_stop_steps (0: never stop for it)."""
    first_gap: float | None = None
    warned_gap: bool = False
    constant_steps: list[int] = field(default_factory=list)
    non_finite_steps: list[int] = field(default_factory=list)

    def check_engine(self, step: int, gap: float | None) -> None:
        """Stop (RunHealthError) when the engine's log-probs left the trainer's far behind; warn once when the
        gap is larger than rounding explains.  The first gap measured is the run's own baseline."""
        if gap is None or not math.isfinite(gap):
            return
        if self.first_gap is None:
            self.first_gap = gap
        elif gap > max(ENGINE_GAP_FACTOR * self.first_gap, ENGINE_GAP_FLOOR):
            raise RunHealthError(
                f"the rollout engine ({self.engine}) does not serve the trainer's weights: at step {step} its "
                f"log-probs differ from the trainer's by {gap:.3g} per token, {gap / max(self.first_gap, 1e-12):.0f}× "
                f"the first step's {self.first_gap:.2g}, so the last weight update did not reach it (an engine "
                "woken from sleep, or a LoRA adapter, that kept the old weights); the run stopped rather than "
                "train on another policy's samples"
            )
        if gap > ENGINE_GAP_WARNING and not self.warned_gap:
            self.warned_gap = True
            log.warning(
                "rollout/logprob_abs_diff is %.3g per token at step %d, above %g: the engine's log-probs and the "
                "trainer's disagree more than bf16 rounding explains (0.02-0.04). Likely causes: the engine runs "
                "another precision, attention kernel or chat template than the trainer; it reports log-probs of a "
                "processed distribution (top-k/top-p); or it holds weights other than the trainer's. Training "
                "goes on (the PPO ratio uses the trainer's own log-probs); algo.rollout_correction=tis corrects "
                "for the difference",
                gap,
                step,
                ENGINE_GAP_WARNING,
            )

    def check_rewards(self, step: int, rewards: torch.Tensor) -> None:
        """Stop (RunHealthError) when every response of ``constant_reward_stop_steps`` consecutive steps got
        one and the same reward (``rewards``: this step's, over the responses that have one)."""
        constant = len(rewards) > 0 and bool(rewards.min() == rewards.max())
        self.constant_steps = [*self.constant_steps, step] if constant else []
        limit = self.constant_reward_stop_steps
        if limit and len(self.constant_steps) >= limit:
            raise RunHealthError(
                f"every response got the same reward ({rewards[0].item():g}) for {limit} steps in a row (steps "
                f"{self.constant_steps[0]}-{step}): nothing is learnt from such batches. Usually the model never "
                "solves the task (make it easier, or start from a stronger model) or a reward function returns "
                "the same value whatever the response (try it on a few responses); "
                "train.constant_reward_stop_steps=0 trains on"
            )

    def check_gradients(self, step: int, grad_norm: float | None) -> None:
        """Stop (RunHealthError) when the policy's gradient was NaN or infinite in ``NON_FINITE_GRADIENT_STEPS``
        consecutive steps (``grad_norm``: the step's mean norm; None when it took no update)."""
        if grad_norm is None:
            return
        self.non_finite_steps = [*self.non_finite_steps, step] if not math.isfinite(grad_norm) else []
        if len(self.non_finite_steps) >= NON_FINITE_GRADIENT_STEPS:
            first = self.non_finite_steps[0]
            raise RunHealthError(
                f"the policy's gradient was NaN or infinite in steps {first}-{step} (their optimiser steps were "
                "skipped): its loss no longer means anything, usually weights a too large train.lr pushed past what "
                "the forward pass can compute; the run stopped (its last checkpoint is from before)"
            )
