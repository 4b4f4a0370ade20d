"""The root of every error reasonrl raises for its user, and the exit status each ends a command with."""


class ReasonRLError(Exception):
    """An error its user reads and acts on: the message says what went wrong and what to do.  ``reasonrl``
    prints it without a traceback and exits with ``exit_status``; a caller of the Python API catches this class.

    Every kind subclasses it next to the built-in error it always was (``ConfigError`` is still a ``ValueError``,
    ``DiskFullError`` an ``OSError``), so code that caught the built-in one still does."""

    exit_status: int = 1
    """The command's exit status: 1 = the run or job failed (bad data, a model that cannot load, a reward that
    keeps failing, a dead worker, ...); 2 = the settings or the command line are wrong (``ConfigError``)."""
