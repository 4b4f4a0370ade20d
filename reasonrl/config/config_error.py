"""The error every configuration problem raises."""

from collections.abc import Sequence

from reasonrl.errors import ReasonRLError


class ConfigError(ReasonRLError, ValueError):
    """A configuration problem, with a message that says how to fix it."""

    exit_status = 2


def listing(problems: Sequence[str]) -> ConfigError:
    """One error that lists every problem found, a line each."""
    return ConfigError("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))
