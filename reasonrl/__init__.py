"""reasonrl: reinforcement learning for reasoning language models.

Importing the package is cheap: heavy engines (transformers, vLLM, Ray) are imported lazily by
the modules that need them.
"""

from reasonrl.version import __version__

__all__ = ["__version__"]
