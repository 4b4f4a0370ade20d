"""Ctrl-C during training keeps the work: the first saves the checkpoint of the last finished step, a
second stops at once, saving nothing.

A step changes nothing a checkpoint holds until its update begins: the rollout only reads the policy,
and what it moves (the data position, T-PPO's pool, the RNG states) is noted when the step begins.  So
a first Ctrl-C before the update abandons the step and the step before is saved from what was noted;
one during the update lets the step finish (its evaluation and metrics too), and that step is saved.

Only one process on its main thread takes part.  torchrun's ranks would have to save their shards
together, but a Ctrl-C reaches them at different points of a step (one in a collective, another not),
so they, and Ray's trainer workers, stop at once as before, keeping the last periodic checkpoint.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

UPDATE_PHASE = "update"  # the phase ``rl_step`` and ``train_step`` announce when the weights begin to change
AGAIN = "Ctrl-C again stops at once, saving nothing"


class CtrlC:
    """``with CtrlC(enabled) as ctrl_c:`` around the steps.  Each step notes its resume state, calls
    ``begin_step``, passes its phases through ``watch``; on a KeyboardInterrupt, saves the step before
    from what it noted if ``abandons()``; at its end saves itself if ``end_step()``, then stops; and calls
    ``saving`` before each save.  Not ``enabled`` (or off the main thread, or where SIGINT is ignored or
    has a handler other than Python's own) it changes nothing: Ctrl-C stops at once."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = (
            enabled
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        self.requested = False  # a first Ctrl-C came: save, then stop
        self.aborted = False  # a second came: stop at once
        self.deferred = True  # the state is changing (an update, between steps): a first Ctrl-C waits
        self.step = 0

    def __enter__(self) -> CtrlC:
        if self.enabled:
            signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self.enabled:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.requested and kind is None:  # came after the last step's check: its checkpoint is saved
            raise KeyboardInterrupt

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.requested:
            self.aborted = True
            raise KeyboardInterrupt
        self.requested = True
        if not self.deferred:
            raise KeyboardInterrupt
        log.warning("Ctrl-C: finishing step %d, then saving its checkpoint (%s)", self.step, AGAIN)

    def begin_step(self, step: int) -> None:
        """``step`` begins, its resume state noted: a first Ctrl-C from here to its update abandons it."""
        self.step, self.deferred = step, False
        if self.requested:  # came while the state was being noted
            raise KeyboardInterrupt

    def watch(self, phase: Callable[[str], None]) -> Callable[[str], None]:
        """``phase`` (the progress display's) that also notes where the step's update begins."""

        def told(name: str) -> None:
            if name == UPDATE_PHASE:
                self.deferred = True
            phase(name)

        return told

    def abandons(self) -> bool:
        """Whether the KeyboardInterrupt being handled abandons the step before its update: the state
        noted when it began is the last finished step's, and may be saved."""
        return self.enabled and not self.deferred and not self.aborted

    def end_step(self) -> bool:
        """The step is finished; whether a first Ctrl-C came during it (save it, then ``stop``)."""
        self.deferred = True
        return self.requested

    def saving(self, step: int) -> None:
        """The checkpoint of ``step`` is about to be written: after a Ctrl-C, say so."""
        if self.requested:
            log.warning("Ctrl-C: saving the checkpoint of step %d, then stopping (%s)", step, AGAIN)
