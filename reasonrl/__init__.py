"""reasonrl: reinforcement learning for reasoning language models.

Importing the package is cheap: heavy engines (transformers, vLLM, Ray) are imported lazily by
the modules that need them.  ``reasonrl.train(...)`` trains from Python (``reasonrl.api.train``;
docs/python-api.md); the training code itself is the ``reasonrl.training`` package.
"""

from reasonrl.errors import ReasonRLError
from reasonrl.version import __version__


def train(*args, **kwargs):
    """A run from Python, as ``reasonrl train`` runs one: ``reasonrl.api.train`` (docs/python-api.md)."""
    from reasonrl.training.placement.cpu_threads import sleeping_openmp_threads

    sleeping_openmp_threads()  # before reasonrl.api loads torch's OpenMP: on a busy machine idle threads sleep
    from reasonrl.api import train as api_train

    return api_train(*args, **kwargs)


__all__ = ["ReasonRLError", "__version__", "train"]
