"""The error every model loader raises: a spec that cannot be resolved or loaded, with what to do about it."""


class ModelError(RuntimeError):
    """A model spec that cannot be resolved or loaded, with what to do about it."""
