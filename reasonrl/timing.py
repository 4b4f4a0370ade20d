"""Stage timing and the progress a long command shows.

``with timed(metrics, "perf/update_seconds"): ...`` adds the block's wall time to that metric (verl's
``marked_timer``), so a stage's name is its metric key.

``Progress`` is the one progress display of every long command (train, eval, rm, prm, data, vlm): what
it is doing (its stage and phase), items done of total, the caller's numbers (accuracy so far, loss),
tokens/s and the time left, all on stderr, so stdout keeps the command's JSON. Where stderr is a
terminal it is a bar redrawn in place; elsewhere (a pipe, a log file) it says nothing unless asked
(``--progress``), and then writes plain lines, at most one every ``LINE_SECONDS`` and one at the end of
each stage, so a log stays readable.  An item may bring its own line (a training step's), which is kept
instead: on a terminal above the bar, so the scrollback has one line per item.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Literal, TypeVar

T = TypeVar("T")
LINE_SECONDS = 10.0  # plain progress lines (stderr not a terminal) come at most this often within a stage


@contextmanager
def timed(metrics: dict, key: str) -> Iterator[None]:
    """Add the wall-clock seconds the block takes to ``metrics[key]`` (from 0 when absent), so a stage
    run several times in a step (a generation pass) adds up."""
    start = perf_counter()
    try:
        yield
    finally:
        metrics[key] = metrics.get(key, 0.0) + perf_counter() - start


@functools.cache
def stderr_console() -> Any:
    """The rich console on stderr that the progress display and log messages share, so they do not garble."""
    from rich.console import Console

    return Console(stderr=True)


def progress_mode(show: bool | None) -> Literal["live", "lines", "off"]:
    """How progress shows on stderr. ``show``: True (``--progress``), None (neither flag), False
    (``--quiet``). A terminal (or notebook) gets the live bar unless ``show`` is False; elsewhere plain
    lines only when asked (True), else nothing."""
    if show is False:
        return "off"
    console = stderr_console()
    if console.is_terminal or console.is_jupyter:
        return "live"
    return "lines" if show else "off"


def clock(seconds: float | None) -> str:
    """``H:MM:SS``; ``-:--:--`` for an unknown time."""
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


@dataclass
class ProgressState:
    """What a progress display shows of the running stage; the times are ``perf_counter`` seconds."""

    label: str
    phase: str = ""
    total: int = 0
    done: int = 0
    done_before: int = 0  # items finished when the stage began (a resumed run's): no part of the pace
    unit: str = ""
    status: str = ""  # the caller's numbers: "acc 0.42", "loss 0.31"
    tokens: int = 0  # generated in this stage
    started: float = 0.0

    def left(self, now: float) -> str:
        """The time left at the stage's pace so far."""
        paced = self.done - self.done_before
        seconds = (now - self.started) / paced * (self.total - self.done) if paced > 0 else None
        return f"left {clock(seconds)}"

    def rate(self, now: float) -> str:
        """Tokens per second over the stage (empty where the caller counts no tokens)."""
        elapsed = now - self.started
        return f"{self.tokens / elapsed:.0f} tok/s" if self.tokens and elapsed > 0 else ""

    def line(self, now: float) -> str:
        """The plain line, e.g. ``eval greedy: 64/200 problems  acc 0.42  812 tok/s  elapsed 0:01:19  left 0:02:48``."""
        count = f"{self.done}/{self.total} {self.unit}".rstrip()
        parts = [f"{self.label} {self.phase}".rstrip() + f": {count}", self.status, self.rate(now)]
        return "  ".join(p for p in [*parts, f"elapsed {clock(now - self.started)}", self.left(now)] if p)


def _live_bar(label: str) -> Any:
    """rich's progress bar on the shared console: label, bar, done/total, elapsed, time left and phase on
    one line, the status and rate on the next, so both fit 80 columns."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    class TwoLineBar(RichProgress):
        status = ""

        def get_renderables(self):
            yield self.make_tasks_table(self.tasks)
            if self.status:
                yield Text(self.status, no_wrap=True, overflow="ellipsis")

    columns = (
        TextColumn(f"[bold]{label}[/bold]"), BarColumn(bar_width=16), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[left]}"), TextColumn("{task.fields[phase]}"),
    )  # fmt: skip
    return TwoLineBar(*columns, console=stderr_console(), redirect_stdout=False)  # stdout stays the command's


class Progress:
    """The progress of a long command on stderr (see the module's docstring): ``with Progress("eval",
    show) as progress:``, then ``progress.stage("greedy", 200, "problems")`` for each pass and
    ``progress.advance(n, tokens=..., status="acc 0.42")`` as items finish."""

    def __init__(self, label: str, show: bool | None = None, line_seconds: float = LINE_SECONDS) -> None:
        self.mode = progress_mode(show)
        self.state = ProgressState(label, started=perf_counter())
        self.bar = _live_bar(label)
        self.task = self.bar.add_task(label, total=None, left=self.state.left(self.state.started), phase="")
        self.line_seconds, self.last_line = line_seconds, -math.inf

    def __enter__(self) -> Progress:
        if self.mode == "live":
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.mode == "live":
            self.bar.stop()

    def stage(self, name: str, total: int, unit: str = "", done: int = 0) -> None:
        """Begin a pass over ``total`` items, with its own count and clock; ``done`` of them were finished
        before (a resumed run's).  On a terminal the pass before stays on screen as a line above the bar."""
        if self.mode == "live" and self.state.total:
            self.log(self.state.line(perf_counter()))
        self.state = dataclasses.replace(
            self.state, phase=name, total=total, done=done, done_before=done, unit=unit, status="", tokens=0,
            started=perf_counter(),
        )  # fmt: skip
        self.bar.reset(self.task, total=total, completed=done)
        self._redraw()

    def phase(self, name: str) -> None:
        """Show what the running item is doing (``step 3: update``), the count unchanged."""
        self.state.phase = name
        self._redraw()

    def advance(self, count: int = 1, *, tokens: int = 0, status: str | None = None) -> None:
        """``count`` more items finished (see ``update``)."""
        self.update(self.state.done + count, tokens=tokens, status=status)

    def update(self, done: int, *, tokens: int = 0, status: str | None = None, line: str | None = None) -> None:
        """``done`` items of the stage finished, ``tokens`` more generated; ``status``: the caller's numbers.
        ``line``: the finished item's own line (a training step's), kept in place of the periodic one: above
        the bar on a terminal, a plain line elsewhere."""
        self.state.done, self.state.tokens = done, self.state.tokens + tokens
        self.state.status = self.state.status if status is None else status
        now = self._redraw()
        if line is not None:
            self.last_line = now
            self.log(line)
        elif self.mode == "lines" and (done >= self.state.total or now - self.last_line >= self.line_seconds):
            self.last_line = now
            self.log(self.state.line(now))

    def measure(self, name: str, total: int, unit: str, work: Callable[[], T]) -> T:
        """``work()`` shown as a stage of ``total`` items that finish together (a held-out measurement)."""
        self.stage(name, total, unit)
        result = work()
        self.advance(total)
        return result

    def log(self, message: str) -> None:
        """Print a line on stderr (above the live bar); nothing when progress is off."""
        if self.mode != "off":
            stderr_console().print(message, soft_wrap=True, markup=False, highlight=False)

    def _redraw(self) -> float:
        now = perf_counter()
        self.bar.status = "  ".join(p for p in (self.state.status, self.state.rate(now)) if p)
        self.bar.update(self.task, completed=self.state.done, left=self.state.left(now), phase=self.state.phase)
        return now
