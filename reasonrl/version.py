"""The package's version, in a module of its own: the command line reads it from here, so it works even
where the package's ``__init__`` does not run (``python -m reasonrl`` run from the directory that holds a
clone named ``reasonrl``, which Python then takes for a namespace package)."""

__version__ = "0.1.0"
