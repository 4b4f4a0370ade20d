"""`rm train` and `rm pretrain` on the device: a CUDA GPU when one is visible (the CUDA tests are marked gpu:
`make test-gpu`), and a clear error for --device cuda on a machine without one."""

import json

import pytest
import torch

from reasonrl.cli import main
from tests.jobs.test_contrastive_pretrain import conversations
from tests.reward.test_prm import synthetic_rows, tokenizer  # noqa: F401 (a fixture)
from tests.test_reward_cli import pairs_file, write_jsonl

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a CUDA device")
def test_rm_train_on_cuda_without_a_gpu_says_so(tmp_path, capsys):
    args = ["rm", "train", "--model", "tiny-random", "--data", str(pairs_file(tmp_path)), "--out", str(tmp_path / "o")]
    assert main([*args, "--device", "cuda"]) != 0
    assert "sees no CUDA device" in capsys.readouterr().err


@gpu
@needs_cuda
@pytest.mark.parametrize("kind", ["bt", "pairwise"])
def test_preference_models_train_on_cuda(tmp_path, kind, capsys):
    out = tmp_path / kind
    args = ["rm", "train", "--kind", kind, "--model", "tiny-random", "--data", str(pairs_file(tmp_path))]
    assert main([*args, "--out", str(out), "--steps", "2", "--batch-pairs", "2", "--device", "cuda"]) == 0
    assert json.loads((out / "summary.json").read_text())["held_out_pairs"] == 2


@gpu
@needs_cuda
def test_a_prm_trains_on_cuda(tmp_path, tokenizer, capsys):  # noqa: F811 (the fixture)
    data = write_jsonl(tmp_path / "labels.jsonl", synthetic_rows(tokenizer, 20, 2))
    out = tmp_path / "prm"
    argv = ["rm", "train", "--kind", "prm", "--model", "tiny-random", "--data", str(data), "--out", str(out),
            "--steps", "3", "--batch-pairs", "4", "--max-prompt-tokens", "64", "--max-response-tokens", "64",
            "--device", "cuda"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((out / "summary.json").read_text())["train_programs"] == 16


@gpu
@needs_cuda
def test_contrastive_pretraining_runs_on_cuda(tmp_path, capsys):
    rows = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in conversations(20)]
    data, out = write_jsonl(tmp_path / "pairs.jsonl", rows), tmp_path / "encoder"
    args = ["rm", "pretrain", "--contrastive", "--model", "tiny-random", "--data", str(data), "--out", str(out)]
    assert main([*args, "--steps", "3", "--batch-pairs", "4", "--device", "cuda"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
