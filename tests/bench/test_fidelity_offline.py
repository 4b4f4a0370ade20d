"""bench/fidelity_offline.py: the smoke profile end to end (dpo, dqo, dqo without weights, grpo) and its
resume.  tiny-random never answers arithmetic right, so the smoke run reads a prepared offline file in
place of its sampling stage (tests/jobs/test_offline_sample.py covers `reasonrl data sample`)."""

import json
import math

from reasonrl.jobs.offline_sample import summarise
from tests.bench.smoke import run_smoke
from tests.train.test_offline import write_samples


def test_the_offline_benchmark_trains_every_arm_and_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "results").mkdir(parents=True)
    samples = write_samples(work / "samples.jsonl", prompts=2, per_prompt=4)
    (work / "results" / "sample.json").write_text(json.dumps(summarise(samples, 0.0)))
    first = run_smoke("fidelity_offline.py", work, out)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads((out / "fidelity_offline_smoke.json").read_text())
    assert (out / "fidelity_offline_smoke.png").stat().st_size > 0
    assert set(result["arms"]) == {"dpo", "dqo", "dqo_no_weights", "grpo"}
    assert result["samples"]["dpo_pairs"] == 4
    runs = result["runs"]
    assert abs(runs["dpo-seed0"]["train_metrics"]["loss/dpo"][0] - math.log(2)) < 1e-3  # step 1 is at the reference
    assert runs["dqo-seed0"]["train_metrics"]["dqo/weight_mean"][0] is not None
    assert runs["dqo_no_weights-seed0"]["train_metrics"]["dqo/weight_mean"] == [1.0]
    assert runs["grpo-seed0"]["train_metrics"]["reward/accuracy"][0] is not None  # online rollouts
    mtime = (work / "results" / "dqo-seed0.json").stat().st_mtime_ns
    second = run_smoke("fidelity_offline.py", work, out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (work / "results" / "dqo-seed0.json").stat().st_mtime_ns == mtime  # nothing trained again
