"""reasonrl: reinforcement learning for reasoning language models.

Importing the package is cheap: heavy engines (transformers, vLLM, Ray) are imported lazily by
the modules that need them.  ``reasonrl.train(...)`` trains from Python (``reasonrl.api.train``;
docs/python-api.md); ``reasonrl.train`` is also the training package, whose module object is callable.
"""

import types

from reasonrl import train as _training_package
from reasonrl.errors import ReasonRLError
from reasonrl.version import __version__


class _CallableTrainingPackage(types.ModuleType):
    """The ``reasonrl.train`` package, callable as ``reasonrl.api.train``: a package's attribute on its parent
    is the subpackage once any of its modules is imported, so the Python API's name must be the package itself
    (setting a module's ``__class__`` to a ``ModuleType`` subclass is Python's documented way to do that)."""

    def __call__(self, *args, **kwargs):
        """``reasonrl.api.train(*args, **kwargs)``: a run from Python (docs/python-api.md)."""
        from reasonrl.train.cpu_threads import sleeping_openmp_threads

        sleeping_openmp_threads()  # before reasonrl.api loads torch's OpenMP: on a busy machine idle threads sleep
        from reasonrl.api import train

        return train(*args, **kwargs)


_training_package.__class__ = _CallableTrainingPackage

__all__ = ["ReasonRLError", "__version__", "train"]
