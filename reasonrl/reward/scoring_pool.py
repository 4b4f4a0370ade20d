"""Run a verifier over many responses in worker processes, each call under a time limit.

A verifier that raises, hangs, or kills its process yields an error-marked result (score
``error_score``, not correct, ``info["error"]`` says what happened); the worker is replaced and the
run goes on.  A pool logs its first failure, with the traceback from the verifier's own code down,
and no later one: the training step counts them (and stops a run whose reward is broken).
Processes (not threads): math-verify uses signals, which only work on a process's main thread.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import signal
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, wait

from reasonrl.data.examples import Example
from reasonrl.reward.verifier_protocol import RewardResult, ScoringContext, Verifier

log = logging.getLogger(__name__)


def _worker(verifier: Verifier, conn: Connection) -> None:
    __tracebackhide__ = True  # read by _own_traceback: this frame only calls the verifier
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        task_id, *arguments = task
        try:
            result = verifier(*arguments)
            batch = isinstance(result, list) and all(isinstance(r, RewardResult) for r in result)  # a batch's call
            if not isinstance(result, RewardResult) and not batch:
                raise TypeError(f"verifier returned {type(result).__name__}, not RewardResult")
            conn.send((task_id, result, None))
        except Exception as exc:  # any verifier failure is reported, never fatal to the worker
            conn.send((task_id, None, (f"{type(exc).__name__}: {exc}", _own_traceback(exc))))


def _own_traceback(exc: Exception) -> str:
    """The traceback of a verifier's failure without the frames that only call it (those with a true
    ``__tracebackhide__`` local, pytest's convention): a user's function shows its own file and line."""
    shown = traceback.StackSummary.extract(
        (frame, line)
        for frame, line in traceback.walk_tb(exc.__traceback__)
        if not frame.f_locals.get("__tracebackhide__")
    )
    frames = shown.format()
    header = ["Traceback (most recent call last):\n"] if frames else []
    return "".join([*header, *frames, *traceback.format_exception_only(exc)]).rstrip("\n")


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT while starting a worker: the child inherits that, so a Ctrl-C at the terminal stops
    the trainer alone (which closes its workers) instead of printing a traceback per worker."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Worker:
    def __init__(self, verifier: Verifier, context: mp.context.BaseContext) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(verifier, child), daemon=True)
        with _sigint_ignored():
            self.process.start()
        child.close()
        self.task_id: int | None = None
        self.deadline = 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class ScoringPool:
    """``workers`` processes scoring (response, reference) pairs with a per-call ``timeout`` (seconds).

    ``label`` names the scorer in warnings.  A scorer may take more arguments than the pair: each
    tuple given to ``score`` is its arguments.
    """

    def __init__(
        self,
        verifier: Verifier,
        workers: int = 2,
        timeout: float = 10.0,
        error_score: float = 0.0,
        label: str = "reward function",
    ) -> None:
        self.verifier = verifier
        self.timeout = timeout
        self.error_score = error_score
        self.label = label
        self._failure_logged = False
        self._context = mp.get_context("spawn")
        self._workers = [_Worker(verifier, self._context) for _ in range(max(1, workers))]

    def _failed(self, task_id: int, reason: str, detail: str) -> RewardResult:
        """The error-marked result of a failed call; the pool's first failure is logged with ``detail`` (a
        traceback, or what happened), later ones only at debug level: the step's metrics count them."""
        if self._failure_logged:
            log.debug("%s failed on response %d: %s", self.label, task_id, reason)
        else:
            self._failure_logged = True
            log.warning(
                "%s failed on response %d (later failures are counted, not logged):\n%s",
                self.label, task_id, detail,
            )  # fmt: skip
        return RewardResult(self.error_score, False, {"error": reason})

    def score(self, pairs: Sequence[tuple], timeout: float | None = None) -> list[RewardResult]:
        """One result per (response, reference) pair (or other arguments tuple), in order; each call within
        ``timeout`` seconds (default: the pool's).  A scorer of whole batches returns a list of results per call."""
        timeout = self.timeout if timeout is None else timeout
        results: list[RewardResult | None] = [None] * len(pairs)
        pending = list(range(len(pairs)))[::-1]  # popped from the end, i.e. in order
        busy: dict[Connection, _Worker] = {}
        while pending or busy:
            for worker in self._workers:
                if worker.task_id is None and pending:
                    task_id = pending.pop()
                    worker.task_id, worker.deadline = task_id, time.monotonic() + timeout
                    worker.conn.send((task_id, *pairs[task_id]))
                    busy[worker.conn] = worker
            next_deadline = min(w.deadline for w in busy.values())
            for conn in wait(list(busy), timeout=max(0.0, next_deadline - time.monotonic())):
                worker = busy.pop(conn)
                try:
                    task_id, result, error = conn.recv()
                except (EOFError, OSError):
                    died = "the scoring process died"
                    task_id, result, error = worker.task_id, None, (died, died)
                    self._replace(worker)
                if error is not None:
                    result = self._failed(task_id, *error)
                results[task_id] = result
                worker.task_id = None
            now = time.monotonic()
            for conn, worker in list(busy.items()):
                if worker.task_id is not None and now >= worker.deadline:
                    seconds = f"{timeout:g}s"
                    failed = self._failed(worker.task_id, f"timeout after {seconds}", f"timed out after {seconds}")
                    results[worker.task_id] = failed
                    del busy[conn]
                    self._replace(worker)
        return results  # type: ignore[return-value]

    def score_examples(
        self, examples: Sequence[Example], responses: Sequence[str], context: ScoringContext | None = None
    ) -> list[RewardResult]:
        """Score each response against its example's reference answer (the ``Scorer`` protocol; a verifier reads
        no ``context``)."""
        return self.score([(response, e.answer) for e, response in zip(examples, responses, strict=True)])

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        index = self._workers.index(worker)
        self._workers[index] = _Worker(self.verifier, self._context)

    def close(self) -> None:
        """Stop the worker processes."""
        for worker in self._workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.kill()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
