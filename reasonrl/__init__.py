"""reasonrl: reinforcement learning for reasoning language models.

Importing the package is cheap: heavy engines (transformers, vLLM, Ray) are imported lazily by
the modules that need them.
"""

__version__ = "0.1.0"
