"""One engine shared by evaluation and a producer thread (dist.backend=ray with rollout.max_staleness ≥ 1):
every call generates with the version it asks for, however the two callers interleave, and the trainer's
later in-place updates never reach a published version."""

import threading
import time

import pytest
import torch

from reasonrl.training.rollouts.engine_versions import (
    EngineVersions,
    EvaluationEngine,
    ProducerEngine,
    ProducerStopped,
    StopFlag,
)


class WeightEchoEngine:
    """Answers each prompt with the weight it holds, read at the start and at the end of the call."""

    stop_token_ids = frozenset({0})

    def __init__(self, weight: float) -> None:
        self.weight = torch.tensor(weight)
        self.loads = 0

    def load_weights(self, state_dict) -> None:
        self.weight.copy_(state_dict["w"])
        self.loads += 1

    def generate(self, prompts, params, seconds: float = 0.0):
        before = self.weight.item()
        time.sleep(seconds)
        return [(before, self.weight.item()) for _ in prompts]


def engines(initial: float = -1.0):
    versions = EngineVersions(WeightEchoEngine(initial))
    return versions, ProducerEngine(versions), EvaluationEngine(versions)


def test_each_caller_generates_with_its_own_version():
    versions, producer, evaluation = engines()
    evaluation.load_weights({"w": torch.tensor(5.0)})  # before the producer starts: loaded as it is
    assert evaluation.generate([[1]], None) == [(5.0, 5.0)]
    trainer_weight = torch.tensor(0.0)
    versions.publish({"w": trainer_weight}, 0)  # the producer starts from version 0
    assert versions.load_into() == 0
    trainer_weight += 1.0  # the update of step 1, in place, then published as version 1
    evaluation.load_weights({"w": trainer_weight})  # after the start: publishing is what loads
    versions.publish({"w": trainer_weight}, 1)
    assert producer.generate([[1]], None) == [(0.0, 0.0)]  # the copy of version 0, not the updated tensor
    assert evaluation.generate([[1], [2]], None) == [(1.0, 1.0)] * 2
    assert producer.generate([[1]], None) == [(0.0, 0.0)]
    assert versions.engine.loads == 4  # 5.0, then 0, 1, 0: a load only where the version changes
    assert producer.stop_token_ids == evaluation.stop_token_ids == frozenset({0})


def test_only_the_producers_version_and_the_newest_are_kept():
    versions, _, _ = engines()
    for version in range(3):
        versions.publish({"w": torch.tensor(float(version))}, version)
    assert set(versions.weights) == {2}
    versions.load_into()  # the producer takes 2
    versions.publish({"w": torch.tensor(3.0)}, 3)
    versions.publish({"w": torch.tensor(4.0)}, 4)
    assert set(versions.weights) == {2, 4}
    versions.load_into()
    assert set(versions.weights) == {4}


def test_interleaved_calls_from_two_threads_never_see_another_version():
    versions, producer, evaluation = engines()
    versions.publish({"w": torch.tensor(0.0)}, 0)
    versions.load_into()
    versions.publish({"w": torch.tensor(1.0)}, 1)
    seen = {"producer": [], "evaluation": []}

    def call(name, engine):
        for _ in range(20):
            seen[name] += engine.generate([[1]], None)

    # each call sleeps inside the engine, so the other thread's call is due while it runs
    versions.engine.generate = lambda prompts, params, real=versions.engine.generate: real(prompts, params, 0.002)
    callers = (("producer", producer), ("evaluation", evaluation))
    threads = [threading.Thread(target=call, args=caller) for caller in callers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen["producer"] == [(0.0, 0.0)] * 20 and seen["evaluation"] == [(1.0, 1.0)] * 20


def test_a_producer_waiting_for_a_version_stops_when_told():
    versions, _, _ = engines()
    versions.publish({"w": torch.tensor(0.0)}, 0)
    stop = StopFlag()
    assert versions.wait_for_version(0, stop)
    threading.Timer(0.2, setattr, (stop, "value", 1)).start()
    started = time.monotonic()
    assert not versions.wait_for_version(1, stop)
    assert time.monotonic() - started < 2


def test_a_stopped_producer_makes_no_more_engine_calls_even_mid_batch():
    versions, producer, evaluation = engines()
    versions.publish({"w": torch.tensor(0.0)}, 0)
    versions.load_into()
    assert producer.generate([[1]], None) == [(0.0, 0.0)]
    versions.stop.value = 1  # the run ends: AsyncRollouts.close
    with pytest.raises(ProducerStopped):
        producer.generate([[1]], None)
    assert evaluation.generate([[1]], None) == [(0.0, 0.0)]  # the trainer's own calls go on
