"""Model resolution: tiny-random offline, paths, run directories, clear errors."""

import pytest
import torch

from reasonrl.models.load import ModelError, compute_dtype, load_model, load_tokenizer, resolve_model


def test_tiny_random_builds_offline_and_chats():
    tokenizer = load_tokenizer("tiny-random")
    model = load_model("tiny-random")
    assert model.config.num_hidden_layers == 2 and model.dtype == torch.float32
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert resolve_model("tiny-random") == resolve_model("tiny-random")  # built once


def test_run_directory_resolves_to_its_exported_model(tmp_path):
    model, tokenizer = load_model("tiny-random"), load_tokenizer("tiny-random")
    model.save_pretrained(tmp_path / "final")
    tokenizer.save_pretrained(tmp_path / "final")
    assert resolve_model(str(tmp_path)) == str(tmp_path / "final")
    reloaded = load_model(str(tmp_path))
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)


def test_bad_specs_fail_clearly(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./no/such/model")
    with pytest.raises(ModelError, match="holds no model"):
        resolve_model(str(tmp_path))
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(ModelError, match=r"not a \.gguf"):
        resolve_model(str(tmp_path / "weights.bin"))
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub id


def test_a_vlm_that_was_not_built_fails_naming_the_command_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match=r"smollm2-135m-vlm is not built yet: build it once with `reasonrl vlm build`"):
        load_model("smollm2-135m-vlm")
    assert list(tmp_path.iterdir()) == []  # loading built nothing


def test_compute_dtype():
    assert compute_dtype("float32") == torch.float32
    assert compute_dtype("bfloat16") == torch.bfloat16
    assert compute_dtype("auto") in (torch.float32, torch.bfloat16)


@pytest.mark.parametrize("family", ["gpt2", "opt"])
def test_loaded_models_train_without_dropout(tmp_path, family):
    """A checkpoint that sets dropout (GPT-2's and OPT's configs do) still trains one function: in training mode
    two forwards agree to the bit, so PPO's first ratio is 1 and the KL to an identical reference 0."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from reasonrl.models.value import ValueModel

    config = AutoConfig.for_model(family, vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    config.update({k: 0.5 for k in config.to_dict() if "dropout" in k or "pdrop" in k})
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    ids = torch.randint(0, 64, (2, 12))
    for model in (load_model(str(tmp_path)), ValueModel(AutoModelForCausalLM.from_config(config).base_model)):
        model.train()
        core = model if hasattr(model, "lm_head") else model.backbone
        first, second = (core(input_ids=ids, use_cache=False)[0] for _ in range(2))
        assert torch.equal(first, second)
