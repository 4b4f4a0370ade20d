"""Large freed host blocks kept for reuse on a CPU run (run.host_memory): the next large tensor takes pages the
process already has instead of new ones the kernel faults in and zeroes; released otherwise, as glibc does."""

import subprocess
import sys
import textwrap

import pytest

from reasonrl.training.placement import host_memory

PAGES_OF_32_MB = 32 * 2**20 // 4096

pytestmark = pytest.mark.skipif(host_memory.host_memory_refusal() is not None, reason="glibc's malloc only")


def _faults_of_a_second_large_tensor(setting: str, device_type: str) -> tuple[str, int]:
    """In a fresh process: the run's log line for ``setting`` on ``device_type``, then the minor page faults of
    filling a 32 MB tensor made after a 64 MB one was freed and the step's end handed memory back."""
    script = textwrap.dedent(f"""
        import resource, torch
        from reasonrl.training.placement.host_memory import keep_freed_host_memory, return_freed_host_memory
        print(keep_freed_host_memory({setting!r}, {device_type!r}))
        first = torch.ones(16 * 2**20)  # 64 MB
        del first
        return_freed_host_memory()  # what the loop does after each step
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(8 * 2**20).fill_(2.0)  # 32 MB
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    line, faults = done.stdout.strip().splitlines()
    return line, int(faults)


def test_a_cpu_run_reuses_the_pages_a_large_freed_tensor_had():
    line, faults = _faults_of_a_second_large_tensor("auto", "cpu")
    assert line.startswith("host memory: freed blocks kept for reuse (mallopt M_MMAP_MAX=0"), line
    assert faults < PAGES_OF_32_MB // 20, faults  # its pages were the freed tensor's


@pytest.mark.parametrize(("setting", "device_type"), [("release", "cpu"), ("auto", "cuda")])
def test_released_memory_is_faulted_in_again_as_glibc_does_by_default(setting, device_type):
    line, faults = _faults_of_a_second_large_tensor(setting, device_type)
    assert line == "host memory: freed blocks returned to the operating system (the allocator's default)"
    assert faults >= PAGES_OF_32_MB * 9 // 10, faults  # every page new


def test_a_preloaded_allocator_is_left_alone(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert host_memory.host_memory_refusal() == "an allocator is preloaded (LD_PRELOAD)"
    monkeypatch.setattr(host_memory, "_kept", False)
    line = host_memory.keep_freed_host_memory("reuse", "cpu")
    assert line == "host memory: left to the allocator (an allocator is preloaded (LD_PRELOAD))"
    assert host_memory._kept is False
