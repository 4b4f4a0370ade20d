"""The error every model loader raises: a spec that cannot be resolved or loaded, with what to do about it."""

from reasonrl.errors import ReasonRLError


class ModelError(ReasonRLError, RuntimeError):
    """A model spec that cannot be resolved or loaded, with what to do about it."""
