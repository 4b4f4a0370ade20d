"""A CPU run keeps the host memory it frees between steps (reasonrl.training.host_memory): no ``malloc_trim``
after each step, one when the run ends; other runs trim after every step as before."""

import types

from reasonrl.training import host_memory
from reasonrl.training.host_memory import host_memory_kept, release_free_memory
from reasonrl.training.loop import fit
from tests.helpers import DigitFraction
from tests.train.test_loop import tiny_config


def counted_trims(monkeypatch) -> list[int]:
    trims: list[int] = []
    fake = types.SimpleNamespace(malloc_trim=lambda pad: trims.append(pad))
    monkeypatch.setattr(host_memory, "_glibc", lambda: fake)
    return trims


def test_freed_memory_stays_while_kept_and_goes_back_once_at_the_end(monkeypatch):
    trims = counted_trims(monkeypatch)
    release_free_memory()
    assert trims == [0]  # outside: every call trims
    with host_memory_kept() as kept:
        assert kept
        release_free_memory()
        release_free_memory()
        assert trims == [0]  # kept: no trim
    assert trims == [0, 0]  # one at the end
    release_free_memory()
    assert trims == [0, 0, 0] and not host_memory._kept


def test_nested_and_disabled_contexts_change_nothing(monkeypatch):
    trims = counted_trims(monkeypatch)
    with host_memory_kept(enabled=False) as kept:
        assert not kept
        release_free_memory()
    assert trims == [0]
    with host_memory_kept(), host_memory_kept() as inner:
        assert inner and host_memory._kept
    assert trims == [0, 0] and not host_memory._kept  # the outer one's trim alone


class KeptDuringSteps:
    """A tracker noting whether host memory was kept while each step was logged."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def log(self, stream, step, metrics):
        self.seen.append(host_memory._kept)

    def log_samples(self, step, samples):
        pass

    def close(self):
        pass


def test_a_cpu_run_keeps_host_memory_for_its_steps_only(tmp_path):
    tracker = KeptDuringSteps()
    fit(tiny_config("train.rollout_steps=2"), tmp_path / "run", verifier=DigitFraction(), trackers=[tracker])
    assert tracker.seen and all(tracker.seen)
    assert not host_memory._kept
