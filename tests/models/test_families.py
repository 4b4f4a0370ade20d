"""Causal LMs beyond the embedded one: tiny random Qwen2, Mistral and Gemma models, built locally with
their own chat templates, train through `fit`; the fast engine runs the Llama-like families and refuses
the others naming the engines that run them."""

import pytest
import torch

from reasonrl.config import load_config
from reasonrl.data.examples import Example
from reasonrl.data.prompts import PromptEncoder
from reasonrl.models.load import ModelError, load_model, load_tokenizer
from reasonrl.rollout import build_engine
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from tests.helpers import DigitFraction
from tests.train.test_loop import TINY

GEMMA_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' "
    "+ message['content'] + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def build_family(directory, family: str) -> str:
    """A 2-layer random model of ``family`` with the tiny byte-level tokenizer (Gemma: its own turn markers)."""
    from transformers import (
        AutoTokenizer,
        GemmaConfig,
        GemmaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = load_tokenizer("tiny-random")
    if family == "gemma":
        tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
        tokenizer.chat_template = GEMMA_TEMPLATE
        tokenizer.eos_token = "<end_of_turn>"
    vocab = len(tokenizer)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    shape |= {"num_key_value_heads": 2, "vocab_size": vocab, "max_position_embeddings": 1024}
    config, model_class = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "gemma": (GemmaConfig, GemmaForCausalLM),
    }[family]
    extra = {"head_dim": 16} if family == "gemma" else {}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(config(**shape, **ids, **extra))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    assert AutoTokenizer.from_pretrained(directory).chat_template == tokenizer.chat_template
    return str(directory)


@pytest.mark.parametrize("family, engine", [("qwen2", "fast"), ("mistral", "fast"), ("gemma", "hf")])
def test_a_tiny_model_of_each_family_trains_with_its_chat_template(tmp_path, family, engine):
    path = build_family(tmp_path / family, family)
    prompt = PromptEncoder(load_tokenizer(path), "plain", 10**6)(Example("1", "What is 2+2?", "4"))
    text = load_tokenizer(path).decode(prompt)
    assert text.endswith("<start_of_turn>model\n" if family == "gemma" else "<|im_start|>assistant\n")
    cfg = load_config("grpo", [*TINY, f"model.name_or_path={path}", "train.rollout_steps=1", "run.eval_every=100"])
    fit(cfg, tmp_path / "run", verifier=DigitFraction(), show_progress=False)
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] == 1]
    assert records and records[0]["rollout/tokens_generated"] > 0
    built = build_engine("auto", load_model(path), load_tokenizer(path))
    assert type(built).__name__ == {"fast": "FastEngine", "hf": "HFEngine"}[engine]


def test_the_fast_engine_refuses_a_family_it_does_not_run_and_names_the_ones_that_do(tmp_path):
    path = build_family(tmp_path / "gemma", "gemma")
    with pytest.raises(ModelError, match=r"the fast engine runs llama, mistral, qwen2 models, not .gemma.*engine=hf"):
        build_engine("fast", load_model(path), load_tokenizer(path))
