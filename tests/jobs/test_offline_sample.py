"""`reasonrl data sample`: one line per response with its behaviour log-probs, resumable, settings kept."""

import json

import pytest

from reasonrl.data.loaders import DataError
from reasonrl.data.offline_dataset import read_samples
from reasonrl.jobs.offline_sample import OfflineSampleRun, run_sampling

SETTINGS = {"model": "tiny-random", "dataset": "arithmetic", "limit": 3, "samples_per_prompt": 2, "max_new_tokens": 4,
            "overrides": ("reward.workers=1",)}  # fmt: skip


def test_samples_carry_their_log_probs_and_a_killed_run_continues(tmp_path, capsys):
    out = tmp_path / "samples.jsonl"
    summary = run_sampling(OfflineSampleRun(**SETTINGS, out=str(out)))
    assert summary["prompts"] == 3 and summary["responses"] == 6
    samples = read_samples(out)
    assert all(len(s.behaviour_logprobs) == len(s.response_token_ids) <= 4 for s in samples)
    assert all(all(x <= 0 for x in s.behaviour_logprobs) for s in samples)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["sampling"]["samples_per_prompt"] == 2 and rows[0]["sampling"]["model"] == "tiny-random"
    assert rows[0]["behaviour_logprob_sum"] == pytest.approx(sum(rows[0]["behaviour_logprobs"]))
    # a kill after three responses, mid-way through the fourth line
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]) + lines[3][:20])
    run_sampling(OfflineSampleRun(**SETTINGS, out=str(out)), progress=True)
    assert "data sample sampling: 3/3 prompts" in capsys.readouterr().err
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert again == rows  # exactly what the uninterrupted run wrote: the same samples, once each
    with pytest.raises(DataError, match=r"other settings .*temperature"):
        run_sampling(OfflineSampleRun(**SETTINGS, out=str(out), temperature=0.7))


def test_bad_settings_are_refused():
    from reasonrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"--samples-per-prompt must be >= 1.*--temperature must be > 0"):
        OfflineSampleRun(samples_per_prompt=0, temperature=0.0).check()
