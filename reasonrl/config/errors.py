"""The error every configuration problem raises."""


class ConfigError(ValueError):
    """A configuration problem, with a message that says how to fix it."""
