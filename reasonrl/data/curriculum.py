"""Task-mix schedules: which task types a run samples at each step (Data-Scaling RLHF, arXiv 2503.22230 §4).

A schedule is a list of phases ``"STEP:type=weight,type=weight"`` or ``"STEP:natural"`` (the
dataset's own mix), each active from its start step until the next one.  The paper's
math/code-first curriculum is ``("0:math=1,code=1", "N:natural")``.  Sampling draws a task type
by the phase's weights, then takes the next example of that type from a seeded per-type shuffle,
so the realised fractions follow the schedule and the state is a handful of counters.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from reasonrl.data.examples import Example


class ScheduleError(ValueError):
    """A malformed task-mix schedule."""


@dataclass(frozen=True)
class MixPhase:
    """Weights of each task type from ``start_step`` on; None = the dataset's natural mix."""

    start_step: int
    weights: dict[str, float] | None


def parse_task_mix(entries: Sequence[str], task_types: Sequence[str]) -> list[MixPhase]:
    """Phases from ``"STEP:type=w,..."`` / ``"STEP:natural"`` strings, checked against the data's task types."""
    phases = []
    for entry in entries:
        start, _, spec = entry.partition(":")
        try:
            step = int(start)
        except ValueError:
            raise ScheduleError(
                f"data.task_mix entry {entry!r} must start with a step number, e.g. '0:math=1,code=1'"
            ) from None
        weights = None
        if spec.strip() != "natural":
            weights = {}
            for part in spec.split(","):
                name, _, value = part.partition("=")
                if name.strip() not in task_types:
                    raise ScheduleError(
                        f"data.task_mix: task type {name.strip()!r} is not in the data ({', '.join(task_types)})"
                    )
                weights[name.strip()] = float(value)
            if not weights or min(weights.values()) < 0 or sum(weights.values()) <= 0:
                raise ScheduleError(f"data.task_mix entry {entry!r} needs non-negative weights with a positive sum")
        phases.append(MixPhase(step, weights))
    if (
        not phases
        or phases[0].start_step != 0
        or [p.start_step for p in phases] != sorted({p.start_step for p in phases})
    ):
        raise ScheduleError("data.task_mix phases must start at step 0 and have increasing, distinct start steps")
    return phases


class TaskMixSampler:
    """Draws examples following the phase active at the current step; resumable from its counters."""

    def __init__(self, rows: Sequence[Example], phases: Sequence[MixPhase], seed: int) -> None:
        self.phases, self.seed = list(phases), seed
        self.by_type: dict[str, list[Example]] = {}
        for row in rows:
            self.by_type.setdefault(row.task_type, []).append(row)
        self.draws = 0
        self.taken = dict.fromkeys(self.by_type, 0)
        self._orders: dict[str, tuple[int, list[int]]] = {}

    def phase(self, step: int) -> MixPhase:
        """The phase active at ``step``."""
        return [p for p in self.phases if p.start_step <= step][-1]

    def weights(self, step: int) -> dict[str, float]:
        """Normalised task-type probabilities at ``step``."""
        phase = self.phase(step)
        raw = phase.weights or {t: float(len(rows)) for t, rows in self.by_type.items()}
        total = sum(raw.values())
        return {t: w / total for t, w in raw.items() if w > 0}

    def _order(self, task_type: str, epoch: int) -> list[int]:
        """The seeded shuffle of one task type's rows in one epoch (cached)."""
        if self._orders.get(task_type, (None,))[0] != epoch:
            order = list(range(len(self.by_type[task_type])))
            random.Random(f"mix:{self.seed}:{task_type}:{epoch}").shuffle(order)
            self._orders[task_type] = (epoch, order)
        return self._orders[task_type][1]

    def _next_of(self, task_type: str) -> Example:
        rows, position = self.by_type[task_type], self.taken[task_type]
        epoch, index = divmod(position, len(rows))
        self.taken[task_type] += 1
        return rows[self._order(task_type, epoch)[index]]

    def take(self, count: int, step: int) -> list[Example]:
        """The next ``count`` examples under the phase of ``step``."""
        weights = self.weights(step)
        types, probabilities = list(weights), list(weights.values())
        out = []
        for _ in range(count):
            task_type = random.Random(f"draw:{self.seed}:{self.draws}").choices(types, probabilities)[0]
            self.draws += 1
            out.append(self._next_of(task_type))
        return out

    def state_dict(self) -> dict:
        """Counters that fix every later draw."""
        return {"draws": self.draws, "taken": dict(self.taken)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from saved counters."""
        self.draws, self.taken = int(state["draws"]), {k: int(v) for k, v in state["taken"].items()}
