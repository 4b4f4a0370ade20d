"""How many threads torch computes with: the cores this process may use that other work leaves free.

torch's default, a thread per core, assumes an idle machine. Beside other work its threads wait for one another
on cores they do not get: one embedded-model step on 2 cores at a load of 3-4 took 309.6 s with the default
and 20.2 s with one thread (docs/benchmarks.md, "Threads on a busy CPU"). A run chooses at its start
(``apply_threads``): ``run.threads`` where set, else ``OMP_NUM_THREADS`` where the user (or torchrun) set it,
else the free cores: the usable cores (``os.sched_getaffinity``) less the cores other work keeps busy, at least
1. That work is the smaller of the 1-minute load average and the tasks running now besides this one (a
machine that was busy a minute ago, a package install say, and is idle now gets its cores), scaled to this
process's share of the machine's cores. The automatic choice is made once per process, so every run of a
process (a notebook's, a test session's) computes with the same threads. ``reasonrl train`` also lets idle
OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``) on a machine busy at its start; that must be set before
torch loads OpenMP.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

BUSY_LOAD = 1.0
"""Other work keeping this many cores busy (``busy_cores``) makes a machine busy: idle OpenMP threads then sleep."""


@dataclass(frozen=True)
class ThreadChoice:
    """torch's thread count for a run, and what it was chosen from."""

    threads: int
    """The threads torch computes with (``torch.set_num_threads``)."""
    cores: int
    """The cores this process may run on (``os.sched_getaffinity``)."""
    load: float
    """The cores other work kept busy when the choice was made (``busy_cores``)."""
    source: Literal["run.threads", "OMP_NUM_THREADS", "auto"]
    """Who chose: the setting, the environment variable, or the free cores."""

    def describe(self) -> str:
        """The line a run logs at its start."""
        if self.source == "auto":
            how = "auto: the cores other work leaves free; run.threads=N or OMP_NUM_THREADS=N chooses"
        elif self.source == "run.threads":
            how = f"run.threads={self.threads}"
        else:
            how = f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
        policy = os.environ.get("OMP_WAIT_POLICY")
        waiting = f"; OMP_WAIT_POLICY={policy}" if policy else ""
        return f"threads: {self.threads} of {self.cores} cores, load {self.load:.2f} ({how}{waiting})"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> float:
    """The machine's 1-minute load average (0 where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


RUNNING_SAMPLES = 5
"""How often the running tasks are counted (RUNNING_INTERVAL apart); the largest count is taken."""
RUNNING_INTERVAL = 0.02


def running_elsewhere() -> float | None:
    """The tasks running or runnable on the machine now outside this process (the largest of a few counts of
    /proc/loadavg's fourth field, less this process's own running threads: its OpenMP threads, still spinning
    after a torch call, are no other work); None where the system does not say."""
    counts = []
    for sample in range(RUNNING_SAMPLES):
        try:
            with open("/proc/loadavg") as handle:
                running = int(handle.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(max(0, running - own_running_threads()))
        if sample < RUNNING_SAMPLES - 1:
            time.sleep(RUNNING_INTERVAL)
    return float(max(counts))


def own_running_threads() -> int:
    """This process's threads that are running or runnable now (at least the one asking)."""
    running = 0
    try:
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/stat") as handle:
                running += handle.read().rsplit(")", 1)[1].split()[0] == "R"
    except OSError:
        return 1
    return max(1, running)


def busy_cores(cores: int) -> float:
    """The cores of this process's ``cores`` that other work keeps busy: the smaller of the 1-minute load average
    and the tasks running now besides this one, times this process's share of the machine's cores."""
    load, now = load_average(), running_elsewhere()
    other = load if now is None else min(load, now)
    return other * min(1.0, cores / (os.cpu_count() or cores))


def _env_threads(value: str | None) -> int | None:
    """The thread count of an OMP_NUM_THREADS value (its first level: '4,2' -> 4); None when unset or unreadable."""
    try:
        threads = int((value or "").split(",")[0])
    except ValueError:
        return None
    return threads if threads >= 1 else None


def choose_threads(cores: int, load: float, setting: int | None, omp_num_threads: str | None) -> ThreadChoice:
    """torch's threads on ``cores`` usable cores of which other work keeps ``load`` busy: ``setting``
    (run.threads) where given, else ``omp_num_threads`` (the environment's OMP_NUM_THREADS) where it is a
    number, else the free cores, ``cores - load`` rounded, between 1 and ``cores``."""
    if setting is not None:
        return ThreadChoice(setting, cores, load, "run.threads")
    if (from_env := _env_threads(omp_num_threads)) is not None:
        return ThreadChoice(from_env, cores, load, "OMP_NUM_THREADS")
    return ThreadChoice(max(1, min(cores, int(cores - load + 0.5))), cores, load, "auto")


_automatic: ThreadChoice | None = None  # this process's automatic choice, made at its first run


def apply_threads(setting: int | None) -> ThreadChoice:
    """Choose torch's threads for a run (``choose_threads``; the automatic choice once per process), set them
    and log the choice."""
    global _automatic
    import torch

    cores, from_env = usable_cores(), os.environ.get("OMP_NUM_THREADS")
    if setting is not None or _env_threads(from_env) is not None:
        choice = choose_threads(cores, busy_cores(cores), setting, from_env)
    else:
        _automatic = _automatic or choose_threads(cores, busy_cores(cores), None, None)
        choice = _automatic
    torch.set_num_threads(choice.threads)
    log.info("%s", choice.describe())
    return choice


def sleeping_openmp_threads(environ: MutableMapping[str, str] = os.environ, load: float | None = None) -> bool:
    """On a machine busy at the start (other work on BUSY_LOAD cores or more; ``load``: as ``busy_cores``
    measures it), let idle OpenMP threads sleep instead of spinning on cores other work needs
    (``OMP_WAIT_POLICY=PASSIVE``), unless the user chose a policy; only before torch is imported, since OpenMP
    reads it once, as torch loads. Whether it was set."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in environ:
        return False
    if (busy_cores(usable_cores()) if load is None else load) < BUSY_LOAD:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
