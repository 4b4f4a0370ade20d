"""Rollout engines and reward scorers as Ray workers, on one local 2-CPU cluster for the module."""

import functools
import os
import subprocess
import sys
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from reasonrl.data.examples import Example  # noqa: E402
from reasonrl.dist import (  # noqa: E402
    ClusterError,
    EngineSettings,
    Placement,
    RayRolloutEngines,
    RayScorer,
    WorkerDiedError,
)
from reasonrl.dist.cluster import WorkerHost, gather, kill_workers, start_workers  # noqa: E402
from reasonrl.models.load import load_model, load_tokenizer  # noqa: E402
from reasonrl.reward.math import MathVerifier  # noqa: E402
from reasonrl.reward.scoring_pool import ScoringPool  # noqa: E402
from reasonrl.rollout import SamplingParams, build_engine  # noqa: E402

pytestmark = pytest.mark.ray

GROUPS = [[1, 50, 60, 70], [1, 80], [1, 90, 91, 92, 93], [1, 100, 101]]
BATCH = [prompt for prompt in GROUPS for _ in range(2)]  # 4 groups × 2 copies, copies next to each other
PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)
SETTINGS = EngineSettings("tiny-random", engine="fast", dtype="float32", options={"max_batch_sequences": 4})


@pytest.fixture(scope="module")
def engines(cluster):
    """Two rollout workers for the module (starting them takes seconds); the last test kills one."""
    with RayRolloutEngines(SETTINGS, workers=2, timeout_s=120) as engines:
        yield engines


@pytest.fixture(scope="module")
def local_engine():
    return build_engine("fast", load_model("tiny-random"), load_tokenizer("tiny-random"), dtype=torch.float32)


def assert_same(completions, expected):
    assert [c.token_ids for c in completions] == [c.token_ids for c in expected]
    assert [c.finish_reason for c in completions] == [c.finish_reason for c in expected]
    torch.testing.assert_close([c.logprobs for c in completions], [c.logprobs for c in expected], atol=1e-5, rtol=0)


def perturbed_weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    state = load_model("tiny-random").state_dict()
    return {name: t + 0.05 * torch.randn(t.shape, generator=generator) for name, t in state.items()}


def test_two_workers_generate_what_one_engine_generates_and_follow_weight_updates(engines, local_engine):
    assert engines.stop_token_ids == local_engine.stop_token_ids
    before = engines.generate(BATCH, PARAMS)
    assert_same(before, local_engine.generate(BATCH, PARAMS))
    # an offset batch (a later share of a bigger one) samples the same streams as locally
    later = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3, first_index=8)
    assert_same(engines.generate(BATCH, later), local_engine.generate(BATCH, later))

    weights = perturbed_weights(seed=1)
    engines.load_weights(weights)
    local_engine.load_weights(weights)
    after = engines.generate(BATCH, PARAMS)
    assert_same(after, local_engine.generate(BATCH, PARAMS))
    # both workers (groups 0-1 on one, 2-3 on the other) serve the new weights
    assert [c.token_ids for c in after[:4]] != [c.token_ids for c in before[:4]]
    assert [c.token_ids for c in after[4:]] != [c.token_ids for c in before[4:]]


def test_an_engine_error_comes_back_as_it_is_and_the_worker_lives_on(engines):
    with pytest.raises(IndexError, match="index 1000000 is out of bounds"):
        engines.generate([[1, 10**6]], PARAMS)
    assert len(engines.generate(BATCH[:2], PARAMS)) == 2


class Sleeper(WorkerHost):
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)


def test_a_worker_silent_past_the_timeout_raises_worker_died_naming_it(cluster):
    [worker] = start_workers(Sleeper, (), Placement("scoring", 1), timeout_s=60)
    try:
        started = time.monotonic()
        with pytest.raises(WorkerDiedError) as caught:
            gather([(worker, worker.actor.nap.remote(60))], timeout_s=1)
        assert time.monotonic() - started < 10
        assert str(caught.value) == f"{worker} did not answer within 1 s (the worker timeout)"
        assert str(worker).startswith(f"scoring worker 0 of 1 (actor id {worker.actor_id}, node ")
    finally:
        kill_workers([worker])


def test_ray_scorer_matches_the_local_scorer_in_order(cluster):
    factory = functools.partial(ScoringPool, MathVerifier(), 1, 20.0)
    examples = [Example(f"q{i}", f"{i} + 1?", str(i + 1)) for i in range(7)]
    responses = [f"The answer is \\boxed{{{i + 1 if i % 3 else i}}}" for i in range(7)]
    local = factory()
    try:
        expected = local.score_examples(examples, responses)
    finally:
        local.close()
    assert [r.correct for r in expected] == [i % 3 != 0 for i in range(7)]  # the test can tell orders apart
    scorer = RayScorer(factory, workers=2, timeout_s=60)
    try:
        assert scorer.score_examples(examples, responses) == expected
        assert scorer.score_examples(examples[:1], responses[:1]) == expected[:1]  # fewer pairs than workers
    finally:
        scorer.close()


@pytest.mark.parametrize(
    ("count", "gpus", "cpus", "expected"),
    [
        (2, 1, 0.5, "2 rollout workers of GPU 1, CPU 0.5 each within 1 s: it has GPU 0 free of 0, CPU 2 free of 2"),
        (3, 0, 1, "3 rollout workers of CPU 1 each within 1 s: it has CPU 2 free of 2"),
    ],
)
def test_a_placement_the_cluster_cannot_hold_fails_fast_naming_what_is_missing(cluster, count, gpus, cpus, expected):
    started = time.monotonic()
    with pytest.raises(ClusterError) as caught:
        Placement("rollout", count, gpus=gpus, cpus=cpus, timeout_s=1)
    assert time.monotonic() - started < 10
    assert str(caught.value).startswith(f"the cluster cannot place {expected}; add nodes")
    # nothing stays reserved: the whole cluster can be placed right after
    Placement("rollout", 2, cpus=1, timeout_s=30).release()


def test_an_unreachable_address_fails_fast_with_what_to_do():
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9"}  # the discard port: nobody listens
    code = "from reasonrl.dist import start_ray\nstart_ray()\n"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert time.monotonic() - started < 30
    assert result.returncode != 0
    assert "ClusterError: cannot reach the Ray cluster at 127.0.0.1:9 (" in result.stderr
    assert "unset RAY_ADDRESS to run a local cluster" in result.stderr


def test_the_package_and_the_training_loop_import_no_ray():
    code = "import sys\nimport reasonrl, reasonrl.training.loop, reasonrl.dist\nprint('ray' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_trainer_ranks_in_other_processes_can_share_the_engines(engines):
    """Trainer ranks that run as Ray actors get the engines pickled and each generate their share."""

    @ray.remote(num_cpus=0)
    def rank_generates(engines, prompts, first_index):
        return engines.generate(
            prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=3, first_index=first_index)
        )

    shares = ray.get(
        [rank_generates.remote(engines, BATCH[:4], 0), rank_generates.remote(engines, BATCH[4:], 4)], timeout=120
    )
    assert_same(shares[0] + shares[1], engines.generate(BATCH, PARAMS))
    assert engines.shared_by_ranks


def test_a_killed_rollout_worker_raises_worker_died_naming_it(engines):
    """Last of the module: it kills a worker of the shared ``engines``."""
    dead = engines.workers[1]
    ray.kill(dead.actor)
    started = time.monotonic()
    with pytest.raises(WorkerDiedError) as caught:
        engines.generate(BATCH, PARAMS)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert message.startswith(f"rollout worker 1 of 2 (actor id {dead.actor_id}, node ")
    assert message.endswith("died: The actor is dead because it was killed by `ray.kill`.")
    assert dead.actor_id == dead.actor._actor_id.hex() and "not placed yet" not in dead.node
    resumable = caught.value.with_checkpoint("runs/x/checkpoints/step-4")
    assert str(resumable) == f"{message}; the last checkpoint is runs/x/checkpoints/step-4"
    assert resumable.checkpoint == "runs/x/checkpoints/step-4"
