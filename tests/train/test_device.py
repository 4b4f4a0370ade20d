"""Device placement: model.device and model.attention resolve before anything loads; batches move per
micro-batch.  The CUDA runs themselves are in tests/train/test_gpu.py (marked gpu)."""

import pytest
import torch

from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.models.load import ModelError, attention_implementation, resolve_device
from reasonrl.training.loop import fit
from tests.helpers import DigitFraction
from tests.train.test_loop import TINY
from tests.train.test_step import rollout_batch

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_one_fails_before_anything_loads(tmp_path, monkeypatch, capsys):
    import reasonrl.training.setup as loop  # where the models load

    monkeypatch.setattr(loop, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(loop, "load_tokenizer", lambda *a, **k: pytest.fail("a tokenizer was loaded"))
    with pytest.raises(ModelError, match=r"model.device=cuda, but this torch .* sees no CUDA device; use model.device"):
        fit(load_config("grpo", [*TINY, "model.device=cuda"]), tmp_path / "a", verifier=DigitFraction())
    assert main(["train", "grpo", *TINY, "model.device=cuda", f"run.output_dir={tmp_path}", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "model.device=cuda" in err and "Traceback" not in err
    assert resolve_device("auto") == CPU and resolve_device("cpu") == CPU


def test_attention_auto_is_eager_for_short_cpu_sequences_and_sdpa_otherwise(monkeypatch):
    assert attention_implementation("auto", CPU, 512) == "eager"  # its backward is faster there (bench/dtype.py)
    assert attention_implementation("auto", CPU, 513) == "sdpa"
    assert attention_implementation("auto", CUDA, 128) in ("sdpa", "flash_attention_2")
    assert attention_implementation("sdpa", CPU, 128) == "sdpa"
    with pytest.raises(ModelError, match="flash_attention_2 needs a CUDA device and the flash-attn package"):
        attention_implementation("flash_attention_2", CPU, 128)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flash_attn" else real(name))
    assert attention_implementation("auto", CUDA, 128) == "flash_attention_2"


def test_micro_batches_move_to_the_device_and_the_batch_stays():
    batch = rollout_batch()
    assert batch.to("cpu") is batch  # already there: no copy
    micro = batch.micro_batches(10**6, device="meta")
    assert [m.prompt_ids.device.type for m in micro] == ["meta"] and batch.prompt_ids.device == CPU
    assert micro[0].advantages.device.type == "meta"
