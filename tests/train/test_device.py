"""Device placement: model.device and model.attention resolve before anything loads; batches move per
micro-batch.  The CUDA runs themselves are in tests/train/test_gpu.py (marked gpu)."""

import pytest
import torch

from reasonrl.cli import main
from reasonrl.config import ConfigError, load_config, resolve
from reasonrl.config.plan import attended_span, attention_implementation
from reasonrl.models.load import ModelError, resolve_device
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


def test_attention_auto_is_lanes_for_packed_cpu_rows_else_eager_for_short_sequences_and_sdpa_otherwise(monkeypatch):
    assert attention_implementation("auto", "cpu", 4096) == "lanes"  # packed (the default): every op on the read tokens
    assert attention_implementation("auto", "cpu", 512, packed=False) == "eager"  # its backward is faster there
    assert attention_implementation("auto", "cpu", 513, packed=False) == "sdpa"
    with pytest.raises(ConfigError, match=r"model\.attention=lanes needs train\.pack_sequences=true"):
        attention_implementation("lanes", "cpu", 128, packed=False)
    assert attention_implementation("auto", "cuda", 128) in ("sdpa", "flash_attention_2")
    assert attention_implementation("sdpa", "cpu", 128) == "sdpa"
    with pytest.raises(ConfigError, match="flash_attention_2 needs a CUDA device and the flash-attn package"):
        attention_implementation("flash_attention_2", "cpu", 128)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flash_attn" else real(name))
    assert attention_implementation("auto", "cuda", 128) == "flash_attention_2"


def test_the_plan_resolves_the_device_dependent_settings_once_for_the_device_and_ranks_given():
    cfg = load_config("grpo", [*TINY, "train.microbatch_tokens=null"])
    longest = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    cpu, gpu = resolve(cfg, "cpu", 1), resolve(cfg, "cuda", 8)
    assert (cpu.device_type, cpu.world_size, gpu.device_type, gpu.world_size) == ("cpu", 1, "cuda", 8)
    assert (cpu.microbatch_tokens, gpu.microbatch_tokens) == (max(768, longest), max(16384, longest))
    assert cpu.attention == "lanes"  # packed rows on the CPU
    # unpacked: eager up to 512 tokens; with train.share_prompts a segment is the prompt and its samples' responses
    vs_trl = ["rollout.max_prompt_tokens=256", "rollout.max_response_tokens=64", "train.microbatch_tokens=null"]
    four, eight = (load_config("grpo", [*TINY, *vs_trl, f"rollout.samples_per_prompt={n}"]) for n in (4, 8))
    assert (attended_span(four, "cpu", 320), attended_span(eight, "cpu", 320)) == (512, 768)  # 256 + n × 64, ≤ 768
    assert gpu.attention in ("sdpa", "flash_attention_2")
    rows = resolve(load_config("grpo", [*TINY, "train.microbatch_tokens=null", "train.pack_sequences=false"]), "cpu", 1)
    assert rows.attention == ("eager" if longest <= 512 else "sdpa")
    assert gpu.forward_dtype == "bfloat16" or torch.cuda.is_available()  # a GPU planned from here: bf16
    bf16 = resolve(load_config("grpo", [*TINY, "train.param_dtype=bfloat16", "model.dtype=auto"]), "cpu", 1)
    assert (bf16.forward_dtype, bf16.parameter_dtype) == ("bfloat16", "bfloat16")
    assert resolve(load_config("grpo", [*TINY, "model.dtype=float32"]), "cpu", 1).forward_dtype == "float32"
    with pytest.raises(ConfigError, match="flash_attention_2 needs a CUDA device"):
        resolve(load_config("grpo", [*TINY, "model.attention=flash_attention_2"]), "cpu", 1)


def test_micro_batches_move_to_the_device_and_the_batch_stays():
    batch = rollout_batch()
    assert batch.to("cpu") is batch  # already there: no copy
    micro = batch.micro_batches(10**6, device="meta")
    assert [m.prompt_ids.device.type for m in micro] == ["meta"] and batch.prompt_ids.device == CPU
    assert micro[0].advantages.device.type == "meta"
