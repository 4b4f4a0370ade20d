"""Large freed host blocks kept for reuse on a CPU run, instead of handed back to the operating system.

glibc's malloc serves every block above its mmap threshold (128 KiB to 32 MiB, adjusted as it goes) with a fresh
mapping and unmaps it on free. A CPU training step allocates such blocks by the hundred: the embedded model's
update makes a bf16 copy of its 49k-row head weight (57 MB) per pass, an fp32 chunk of logits (77 MB) per
micro-batch, its embedding gradient (113 MB), each decoder weight's bf16 cast. Each comes back as new pages that
the kernel faults in and zeroes one 4 KiB page at a time, at about 2 GB/s on the 2-core machine: a quarter of
the time of those copies. ``keep_freed_host_memory`` turns glibc's mmap path off (``mallopt(M_MMAP_MAX, 0)``: large
blocks come from the heap too) and its trimming up (``M_TRIM_THRESHOLD`` 2 GiB), so a freed block stays mapped and
the next large tensor reuses its pages; the vs-TRL step took 12% less time so (docs/benchmarks.md, "Freed host
memory reused"). What it costs: memory a run has freed stays in the process (its peak resident set is the same
or a little larger: heap fragments), and glibc cannot be told to go back to trimming on its own. Set once per
process, at the first run that asks (``run.host_memory``); other C libraries and a preloaded allocator
(jemalloc, tcmalloc) are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_MAX = -4
KEPT_TRIM_THRESHOLD = 2**31 - 1
"""Free heap space above this many bytes at the heap's top goes back to the OS (mallopt takes an int: 2 GiB)."""

_kept = False  # set once: glibc's own adjusting thresholds cannot be restored


def host_memory_refusal() -> str | None:
    """Why this process's allocator is left as it is (None: it is glibc's malloc, which can keep freed blocks)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    preloaded = os.environ.get("LD_PRELOAD", "")
    if any(name in preloaded for name in ("jemalloc", "tcmalloc", "mimalloc")):
        return "an allocator is preloaded (LD_PRELOAD)"
    return None


def keep_freed_host_memory(setting: str, device_type: str) -> str:
    """Apply ``run.host_memory`` (``setting``: auto, reuse or release) for a model computing on ``device_type``:
    reuse (auto: on the CPU) keeps large freed blocks in this process's heap from now on; the line a run logs."""
    global _kept
    wanted = setting == "reuse" or (setting == "auto" and device_type == "cpu")
    if not wanted:
        if _kept:
            return "host memory: freed blocks kept for reuse (set by an earlier run of this process, for its life)"
        return "host memory: freed blocks returned to the operating system (the allocator's default)"
    if _kept:
        return "host memory: freed blocks kept for reuse (set by an earlier run of this process)"
    if reason := host_memory_refusal():
        return f"host memory: left to the allocator ({reason})"
    libc = ctypes.CDLL("libc.so.6")
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD)):
        return "host memory: left to the allocator (glibc refused mallopt)"
    _kept = True
    return "host memory: freed blocks kept for reuse (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB; run.host_memory)"


def return_freed_host_memory() -> None:
    """Between steps: hand the heap's free pages back to the operating system (glibc's ``malloc_trim``), so a run
    whose freed blocks are not kept does not grow step after step; nothing where they are kept (the next step
    reuses them) or the C library is not glibc."""
    if _kept:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
