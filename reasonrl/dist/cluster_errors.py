"""What goes wrong on a Ray cluster, as errors with messages that say what to do (no ray import here)."""

from __future__ import annotations

from pathlib import Path

from reasonrl.errors import ReasonRLError


class ClusterError(ReasonRLError, RuntimeError):
    """The Ray cluster cannot be reached, or cannot host the workers asked for."""


class WorkerDiedError(ReasonRLError, RuntimeError):
    """A Ray worker (a rollout engine or a scorer) died or stopped answering; the run cannot go on.

    The message names the worker: its role, index, actor id and node.  A restarted worker would have
    lost its model and weights, so the run stops; the training loop adds the checkpoint to resume
    from with ``with_checkpoint``.
    """

    def __init__(self, message: str, checkpoint: str | None = None) -> None:
        super().__init__(message, checkpoint)
        self.message = message
        self.checkpoint = checkpoint
        """The last checkpoint of the run, to resume from (None: not known here)."""

    def with_checkpoint(self, path: str | Path) -> WorkerDiedError:
        """The same error, saying which checkpoint to resume from: ``raise exc.with_checkpoint(path) from exc``."""
        return WorkerDiedError(self.message, str(path))

    def __str__(self) -> str:
        if self.checkpoint is None:
            return self.message
        return f"{self.message}; the last checkpoint is {self.checkpoint}"
