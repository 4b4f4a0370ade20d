"""Whether a run hands the host memory it frees back to the OS after each step.

A CPU training step allocates and frees the same blocks again and again: each micro-batch's activations and their
gradients, the rollout's caches.  ``release_free_memory`` (glibc's ``malloc_trim``) after every step hands the heap's
free pages back to the OS, and the kernel maps and zeroes each of them again on its next touch; on a virtual machine
such a page fault costs more than the arithmetic done on the page.  A CPU run therefore keeps them
(``host_memory_kept``): the resident size stays where the step's peak put it, which is the peak the run reports
anyway, and the pages go back once, when the run ends.  Blocks above glibc's mmap threshold (at most 32 MiB: a
vocabulary-sized [V, d] or [chunk, V] tensor) are unmapped when freed whatever this does: those the LM head writes
it reuses itself (``reasonrl.models.logprob_head``).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

_kept = False  # inside host_memory_kept: release_free_memory does nothing


def _glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (which has ``malloc_trim``), else None."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere, and inside
    ``host_memory_kept``, whose run reuses them).

    Each step frees and reallocates hundreds of MB (KV caches, packed weights, activations); without
    trimming, glibc keeps the freed pages and the resident size creeps up step after step.
    """
    if not _kept and (libc := _glibc()) is not None:
        libc.malloc_trim(0)


@contextlib.contextmanager
def host_memory_kept(enabled: bool = True) -> Iterator[bool]:
    """While open (and ``enabled``: a run whose model computes on the CPU), ``release_free_memory`` does
    nothing, so the next step reuses the pages this one freed without faulting them in again; on exit the free
    pages go back to the OS.  Yields whether it is in force (nested: the outermost one decides)."""
    global _kept
    if not enabled or _kept:
        yield _kept
        return
    _kept = True
    try:
        yield True
    finally:
        _kept = False
        release_free_memory()
