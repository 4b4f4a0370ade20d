"""Asynchronous rollouts (rollout.max_staleness): the staleness bound, a producer that fails or dies, a
resume mid-run, and staleness 0 being the synchronous loop."""

import json
import os
import queue
import signal
import threading
import time

import pytest
import torch

from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError, load_config, resolve
from reasonrl.training.loop import fit
from reasonrl.training.placement.parallel import SINGLE_PROCESS, collective_timeout_seconds
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.rollouts.async_rollouts import AsyncRollouts, ProducerError
from reasonrl.training.rollouts.engine_versions import EngineVersions
from reasonrl.training.rollouts.producer import ProducerProcess, ProducerThread, producer_gpu
from reasonrl.training.rollouts.rollout_stage import DynamicSamplingError
from tests.helpers import DigitFraction
from tests.train.test_loop import comparable, tiny_config

# --- the producer's protocol, with a stand-in collector (built in the producer process: module level) ---


class RecordingEngine:
    def __init__(self) -> None:
        self.loads = 0

    def load_weights(self, state_dict) -> None:
        self.loads += 1


class CountingStream:
    def __init__(self, consumed: int) -> None:
        self.consumed = consumed

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = state["consumed"]


class StandInCollector:
    """One row per step, its only token the step number; ``behaviour`` picks a failure to act out."""

    def __init__(self, stream_state: dict, behaviour: str, engine_for) -> None:
        self.engine, self.behaviour = engine_for(RecordingEngine()), behaviour
        self.stream = CountingStream(stream_state["consumed"])

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])

    def collect(self, step: int):
        if self.behaviour == "raises" and step == 2:
            raise DynamicSamplingError("no informative group after 3 generation passes")
        if self.behaviour == "raises_lookup" and step == 2:
            raise LookupError("row 3 of the batch is missing")
        if self.behaviour == "raises_unpicklable" and step == 2:
            error = RuntimeError("a handle went stale")
            error.handle = threading.Lock()  # an exception that cannot travel to another rank
            raise error
        if self.behaviour == "hangs":
            time.sleep(60)
        self.stream.consumed += 1
        ones = torch.ones(1, 1, dtype=torch.bool)
        batch = RolloutBatch(
            prompt_ids=torch.tensor([[step]]), prompt_mask=ones, response_ids=torch.tensor([[step]]),
            response_mask=ones, policy_loss_mask=ones, value_loss_mask=ones, rollout_logprobs=torch.zeros(1, 1),
            rewards=torch.zeros(1), correct=torch.zeros(1, dtype=torch.bool),
            truncated=torch.zeros(1, dtype=torch.bool), group_ids=torch.zeros(1, dtype=torch.long),
        )  # fmt: skip
        stats = {"rollout/generated_by_step": float(step)}
        if self.behaviour == "environment":  # what the producer process sees of the launcher's variables
            stats |= {"gpu": float(os.environ.get("CUDA_VISIBLE_DEVICES", -1)), "rank_set": float("RANK" in os.environ)}
        return batch, stats


def stand_in(cfg, plan, state, verifier, policy):
    return StandInCollector(state["stream"], verifier, policy.engine_for)  # the "verifier" slot carries the behaviour


class StartedStream:
    def __init__(self) -> None:
        self.consumed = 0

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = state["consumed"]


def producer(
    staleness: int,
    behaviour: str = "",
    timeout: float = 60.0,
    gpu: str | None = None,
    thread: bool = False,
    parallel=SINGLE_PROCESS,
) -> AsyncRollouts:
    """A producer process, or with ``thread`` a producer thread on a shared engine (as under Ray)."""
    cfg = load_config("grpo", [f"rollout.max_staleness={staleness}", f"rollout.producer_timeout_seconds={timeout}",
                               "train.rollout_steps=10"])  # fmt: skip
    versions = EngineVersions(RecordingEngine()) if thread else None
    weights = lambda: {"w": torch.zeros(2)}  # noqa: E731
    transport = ProducerThread(stand_in, versions, behaviour) if thread else ProducerProcess(stand_in, behaviour, gpu)
    return AsyncRollouts(cfg, resolve(cfg, "cpu", 1), transport, StartedStream(), weights, parallel=parallel)


def queued_steps(rollouts: AsyncRollouts, settle: float = 3.0) -> list[int]:
    """The steps the producer has made beyond those collected, once it had ``settle`` seconds to run ahead."""
    time.sleep(settle)
    steps = []
    while True:
        try:
            steps.append(rollouts.transport.receive(timeout=0.5).step)
        except queue.Empty:  # the producer is waiting for a newer version
            return steps


@pytest.mark.parametrize("thread", [False, True], ids=["process", "thread"])
@pytest.mark.parametrize("staleness", [1, 2])
def test_the_producer_runs_at_most_k_versions_ahead(staleness, thread):
    rollouts = producer(staleness, thread=thread)
    try:
        batch, metrics = rollouts.collect(1)  # sampled with version 0, as a synchronous step 1 is
        assert batch.prompt_ids.item() == 1 and metrics["rollout/staleness_mean"] == 0.0
        assert metrics["rollout/staleness_0_fraction"] == 1.0
        # no update has been published: batches 2 .. k + 1 may use version 0, batch k + 2 may not
        assert queued_steps(rollouts) == list(range(2, staleness + 2))
        rollouts.publish({"w": torch.ones(2)})  # the update of step 1 -> version 1
        assert queued_steps(rollouts) == [staleness + 2]
    finally:
        rollouts.close()
    assert getattr(rollouts.transport, "thread" if thread else "process") is None


def test_a_stale_batch_reports_its_staleness_and_the_stream_follows_the_batches_trained():
    rollouts = producer(1)
    try:
        rollouts.collect(1)
        time.sleep(2)  # batch 2 is made from version 0 before any publish
        batch, metrics = rollouts.collect(2)
        assert metrics["rollout/staleness_max"] == 1.0 and metrics["rollout/staleness_1_fraction"] == 1.0
        assert batch.policy_versions.tolist() == [[0]]
        assert rollouts.stream.consumed == 2  # what a checkpoint after step 2 resumes from
    finally:
        rollouts.close()


def test_a_killed_producer_fails_the_run_with_one_clear_error_not_a_hang():
    rollouts = producer(1)
    try:
        rollouts.collect(1)
        os.kill(rollouts.transport.process.pid, signal.SIGKILL)
        started = time.monotonic()
        rollouts.publish({"w": torch.ones(2)})
        with pytest.raises(ProducerError, match=r"died with exit code -9 before step \d's batch.*resume"):
            for step in (2, 3):
                rollouts.collect(step)
        assert time.monotonic() - started < 10
    finally:
        rollouts.close()


@pytest.mark.parametrize("thread", [False, True], ids=["process", "thread"])
def test_a_producer_error_reaches_the_trainer_as_itself(thread):
    rollouts = producer(1, "raises", thread=thread)
    try:
        rollouts.collect(1)
        with pytest.raises(DynamicSamplingError, match="no informative group after 3 generation passes"):
            rollouts.collect(2)
    finally:
        rollouts.close()


class RankZeroOfTwo:
    """Rank 0 of two data-parallel ranks, recording what it broadcasts to the other."""

    is_main, world_size = True, 2

    def broadcast(self, value):
        self.sent = value
        return value


@pytest.mark.parametrize(
    "behaviour, raised, message",
    [
        ("raises_lookup", LookupError, "row 3 of the batch is missing"),
        ("raises_unpicklable", ProducerError, "failed at step 2: RuntimeError: a handle went stale"),
    ],
)
def test_a_producer_threads_own_error_reaches_every_rank(behaviour, raised, message):
    """Under Ray with several trainer workers: the other ranks raise what rank 0 raises, not wait for it."""
    ranks = RankZeroOfTwo()
    rollouts = producer(1, behaviour, thread=True, parallel=ranks)
    try:
        rollouts.collect(1)
        with pytest.raises(raised, match=message):
            rollouts.collect(2)
        assert isinstance(ranks.sent, raised) and message in str(ranks.sent)
    finally:
        rollouts.close()


def test_a_silent_producer_times_out_with_the_setting_named():
    rollouts = producer(1, "hangs", timeout=2.0)
    try:
        with pytest.raises(ProducerError, match=r"no batch for step 1 in rollout.producer_timeout_seconds=2"):
            rollouts.collect(1)
    finally:
        started = time.monotonic()
        rollouts.close()
        assert time.monotonic() - started < 15  # a producer stuck in a call is killed


def test_the_producer_takes_the_first_gpu_no_trainer_rank_uses():
    assert producer_gpu(None, 2, 1) == "1"  # one trainer on GPU 0: the producer gets GPU 1 to itself
    assert producer_gpu("4,5,6", 3, 2) == "6"  # torchrun's two ranks on 4 and 5
    assert producer_gpu("GPU-a, GPU-b", 2, 1) == "GPU-b"
    assert producer_gpu(None, 2, 2) is None and producer_gpu(None, 1, 1) is None  # every GPU trains: share rank 0's


def test_the_producer_runs_on_its_gpu_as_a_process_of_its_own(monkeypatch):
    monkeypatch.setenv("RANK", "0")  # as under torchrun: the spawned producer inherits rank 0's environment
    rollouts = producer(1, "environment", gpu="7")
    try:
        _, metrics = rollouts.collect(1)
        assert metrics["gpu"] == 7.0 and metrics["rank_set"] == 0.0
    finally:
        rollouts.close()


# --- whole runs on tiny-random -------------------------------------------------------------------


def test_staleness_zero_is_the_synchronous_loop(tmp_path):
    default, explicit = tmp_path / "default", tmp_path / "explicit"
    fit(tiny_config("train.rollout_steps=2"), default, verifier=DigitFraction(), show_progress=False)
    cfg = tiny_config("train.rollout_steps=2", "rollout.max_staleness=0", "algo.rollout_correction=auto")
    fit(cfg, explicit, verifier=DigitFraction(), show_progress=False)
    a, b = (comparable(read_metrics(d / "metrics.jsonl")) for d in (default, explicit))
    assert a == b and not any(k.startswith("rollout/staleness") for record in a for k in record)


def test_an_async_run_resumes_with_the_prompts_in_flight_issued_again(tmp_path):
    settings = ("run.save_every=2", "rollout.max_staleness=1", "train.lr=1e-3")
    fit(tiny_config("train.rollout_steps=2", *settings), tmp_path, verifier=DigitFraction(), show_progress=False)
    state = json.loads((tmp_path / "checkpoints" / "step-000002" / "state.json").read_text())
    assert state["stream"]["consumed"] == 2 * 4  # two steps of 4 prompts, not the batch made ahead
    fit(tiny_config("train.rollout_steps=4", *settings), tmp_path, verifier=DigitFraction(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # nothing trained twice or skipped
    for r in records:
        assert 0 <= r["rollout/staleness_max"] <= 1
        assert r["rollout/staleness_0_fraction"] + r["rollout/staleness_1_fraction"] == 1.0
        assert r["rollout/is_masked_fraction"] <= 0.05 and r["rollout/is_weight_mean"] == pytest.approx(1, abs=0.1)
    final = json.loads((tmp_path / "checkpoints" / "step-000004" / "state.json").read_text())
    assert final["stream"]["consumed"] == 4 * 4


def test_partial_rollouts_train_with_each_token_tagged_by_the_version_that_sampled_it(tmp_path):
    from tests.train.test_loop import undocumented_metrics

    settings = ("rollout.max_staleness=1", "rollout.partial_rollouts=true", "rollout.partial_window_tokens=4")
    fit(tiny_config("train.rollout_steps=3", *settings), tmp_path, verifier=DigitFraction(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["rollout/reprefill_tokens"] > 0 for r in records)  # responses longer than a window continued
    for r in records:  # token staleness: a response may gain fresher tokens, never staler than the bound
        assert 0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= 1
        assert r["rollout/staleness_0_fraction"] + r["rollout/staleness_1_fraction"] == pytest.approx(1.0)
    assert not undocumented_metrics(tmp_path / "metrics.jsonl")


def test_multiturn_conversations_run_in_the_producer(tmp_path):
    from tests.train.test_multiturn import PAG_TINY

    overrides = [*PAG_TINY[:-2], "rollout.max_response_tokens=12", "train.rollout_steps=2", "rollout.max_staleness=1"]
    fit(load_config("direct_multiturn", overrides), tmp_path, verifier=DigitFraction(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["multiturn/turns_mean"] == 2.0 and r["rollout/staleness_max"] <= 1 for r in records)


def test_what_the_producer_cannot_run_with_is_refused_with_the_reason():
    with pytest.raises(
        ConfigError, match=r"partial_rollouts does not run with algo\.window_tokens \(T-PPO\): T-PPO's windows"
    ):
        load_config("t_ppo", ["rollout.max_staleness=1", "rollout.partial_rollouts=true"])
    with pytest.raises(
        ConfigError, match=r"partial_rollouts does not run with rollout\.multiturn: a conversation's turns"
    ):
        load_config("pag", ["rollout.max_staleness=2", "rollout.partial_rollouts=true"])
    with pytest.raises(ConfigError, match=r"partial_rollouts .* needs rollout\.max_staleness >= 1"):
        load_config("grpo", ["rollout.partial_rollouts=true"])
    with pytest.raises(ConfigError, match="decoupled weights tokens"):
        load_config("grpo", ["algo.rollout_correction=decoupled", "algo.rollout_correction_level=sequence"])
    with pytest.raises(ConfigError, match=r"rollout_correction_threshold=1 must be above 1"):
        load_config("grpo", ["algo.rollout_correction=tis", "algo.rollout_correction_threshold=1"])


def test_under_torchrun_a_producer_timeout_beyond_the_collectives_timeout_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings = ["rollout.max_staleness=1", "dist.backend=torch", "dist.worker_timeout_seconds=600"]
    with pytest.raises(ConfigError, match=r"producer_timeout_seconds=1800 exceeds dist\.worker_timeout_seconds=600"):
        load_config("grpo", settings)
    assert load_config("grpo", [*settings, "rollout.producer_timeout_seconds=600"]).rollout.max_staleness == 1


def test_a_run_given_its_own_engine_object_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    import reasonrl.training.setup as setup

    monkeypatch.setattr(setup, "load_model", lambda *a, **k: pytest.fail("a model loaded before the refusal"))
    cfg = tiny_config("rollout.max_staleness=1")
    with pytest.raises(ConfigError, match=r"a run given its own engine object runs synchronously"):
        fit(cfg, tmp_path, engine=RecordingEngine(), verifier=DigitFraction(), show_progress=False)


def test_t_ppo_runs_its_pool_in_the_producer_and_a_checkpoint_holds_the_pool_of_the_batch_trained(tmp_path):
    from tests.train.test_tppo import tppo_config

    settings = ("rollout.max_staleness=1", "run.save_every=2")
    fit(tppo_config("train.rollout_steps=2", *settings), tmp_path, verifier=DigitFraction(), show_progress=False)
    state = json.loads((tmp_path / "checkpoints" / "step-000002" / "state.json").read_text())
    assert state["pool"]["active"], "the test needs sequences in flight at the checkpoint"
    # one prompt is admitted per group: the pool saved is the one of the stream position saved, not the ahead batch's
    assert state["stream"]["consumed"] == state["pool"]["groups_admitted"]
    fit(tppo_config("train.rollout_steps=4", *settings), tmp_path, verifier=DigitFraction(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all("rollout/running_sequences" in r and r["rollout/staleness_max"] <= 1 for r in records)


def test_lora_adapters_reach_the_producer_merged(tmp_path):
    cfg = tiny_config("train.rollout_steps=3", "rollout.max_staleness=1", "model.lora_rank=4", "train.lr=1e-2")
    fit(cfg, tmp_path, verifier=DigitFraction(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3]
    # the producer samples with the trainer's merged weights: its log-probs are the trainer's at that version
    kl = [r["rollout/trainer_kl"] for r in records]
    assert all(0 <= value < 0.05 for value in kl), kl


def test_an_asynchronous_ray_run_waits_three_worker_timeouts_in_a_collective():
    """Rank 0's evaluation may wait for the producer's call on the shared rollout workers, load the weights,
    then generate, while the other ranks wait in the broadcast of its answers."""
    ray = ["dist.backend=ray", "dist.worker_timeout_seconds=100", "rollout.producer_timeout_seconds=100"]
    assert collective_timeout_seconds(load_config("grpo", [*ray, "rollout.max_staleness=1"])) == 300
    assert collective_timeout_seconds(load_config("grpo", ray)) == 100
    assert collective_timeout_seconds(load_config("grpo", ["rollout.max_staleness=1"])) == 1800  # torchrun's: one
