"""LoRA through PEFT: only the adapters train, engines serve the merged weights, runs resume exactly,
the export loads as a merged model and as an adapter, and bad settings fail with one clear line."""

import json

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.config import ConfigError, load_config
from reasonrl.config.config_loader import config_keys
from reasonrl.config.schema import ModelConfig
from reasonrl.models.load import ModelError, load_model, load_tokenizer
from reasonrl.models.lora import (
    ADAPTER_DIR,
    ADAPTER_FILE,
    adapters_disabled,
    add_lora,
    has_lora,
    load_lora_adapter,
    merged_state_dict,
    save_lora_model,
)
from reasonrl.models.optim import trainable_parameters
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from tests.helpers import DigitFraction, ResponseLength
from tests.train.test_loop import TINY

LORA = ModelConfig(name_or_path="tiny-random", lora_rank=4, lora_alpha=8.0)
Q_PROJ = "model.layers.0.self_attn.q_proj"


def lora_model(settings: ModelConfig = LORA):
    torch.manual_seed(0)
    return add_lora(load_model("tiny-random"), settings)


def perturb_adapters(model, seed: int = 1) -> None:
    """Non-zero B matrices (a fresh adapter's B is zero, which hides every mistake)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def test_lora_is_off_by_default():
    assert ModelConfig().lora_rank == 0
    model = load_model("tiny-random")
    names = list(model.state_dict())
    assert add_lora(model, ModelConfig()) is model and not has_lora(model)
    assert list(model.state_dict()) == names
    assert len(trainable_parameters(model)) == len(list(model.parameters()))
    merged = merged_state_dict(model)
    assert merged.keys() == model.state_dict().keys()
    assert all(merged[k].data_ptr() == v.data_ptr() for k, v in model.state_dict().items())  # no copy


def test_only_the_adapters_train_and_the_base_stays_bit_identical():
    model = lora_model()
    base = {k: v.clone() for k, v in merged_state_dict(model).items()}  # B = 0: merged is the base
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 7 * model.config.num_hidden_layers  # all-linear: q k v o gate up down
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    ids = torch.randint(0, model.config.vocab_size, (2, 10))
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    state = model.state_dict()
    frozen = {k.replace(".base_layer", ""): v for k, v in state.items() if ".lora_" not in k}
    assert frozen.keys() == base.keys()
    assert all(torch.equal(frozen[k], base[k]) for k in base)
    assert state[f"{Q_PROJ}.lora_B.default.weight"].abs().sum() > 0  # the adapter did train


def test_adapters_get_gradients_under_gradient_checkpointing():
    from reasonrl.training.update.policy import response_logprobs

    model = load_model("tiny-random")
    model.gradient_checkpointing_enable()  # before the adapter, as the trainer does
    add_lora(model, LORA)
    model.train()
    prompt, response = torch.randint(0, 100, (2, 5)), torch.randint(0, 100, (2, 4))
    logprobs, _ = response_logprobs(model, prompt, torch.ones_like(prompt), response, torch.ones_like(response))
    logprobs.sum().backward()
    assert all(p.grad is not None for p in trainable_parameters(model))


def test_engines_receive_the_merged_weights():
    plain = load_model("tiny-random")
    model = lora_model()
    perturb_adapters(model)
    merged = merged_state_dict(model)
    assert merged.keys() == plain.state_dict().keys()  # the names load_weights expects
    layer = model.get_submodule(Q_PROJ)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # [r, in], [out, r]
    expected = layer.base_layer.weight + (LORA.lora_alpha / LORA.lora_rank) * (b @ a)
    torch.testing.assert_close(merged[f"{Q_PROJ}.weight"], expected)
    assert not torch.equal(merged[f"{Q_PROJ}.weight"], layer.base_layer.weight)
    # the merged weights are what the adapted model computes
    ids = torch.randint(0, model.config.vocab_size, (2, 10))
    plain.load_state_dict(merged)
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


def test_a_weight_sync_changes_what_the_engine_generates():
    tokenizer = load_tokenizer("tiny-random")
    model = load_model("tiny-random")
    engine = build_engine("fast", model, tokenizer, dtype=torch.float32)
    add_lora(model, LORA)
    prompts = [tokenizer("What is 2 + 3?")["input_ids"]] * 2
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    before = [c.token_ids for c in engine.generate(prompts, greedy)]
    engine.load_weights(merged_state_dict(model))  # a fresh adapter: nothing changes
    assert [c.token_ids for c in engine.generate(prompts, greedy)] == before
    perturb_adapters(model)
    engine.load_weights(merged_state_dict(model))
    after = [c.token_ids for c in engine.generate(prompts, greedy)]
    assert after != before
    reference = load_model("tiny-random")
    reference.load_state_dict(merged_state_dict(model))
    served = build_engine("fast", reference, tokenizer, dtype=torch.float32)
    assert [c.token_ids for c in served.generate(prompts, greedy)] == after


def test_the_reference_is_the_frozen_base():
    model = lora_model()
    perturb_adapters(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    base = load_model("tiny-random")
    with torch.no_grad(), adapters_disabled(model) as reference:
        torch.testing.assert_close(reference(input_ids=ids).logits, base(input_ids=ids).logits)
    with torch.no_grad():
        assert not torch.allclose(model(input_ids=ids).logits, base(input_ids=ids).logits)  # adapters back on


def test_a_saved_adapter_loads_in_place_exactly(tmp_path):
    trained = lora_model()
    perturb_adapters(trained)
    save_lora_model(trained, tmp_path)
    model = lora_model()
    parameters = [p for p in model.parameters() if p.requires_grad]
    load_lora_adapter(model, tmp_path)
    assert [p for p in model.parameters() if p.requires_grad] == parameters  # same objects (the optimiser's)
    a, b = trained.state_dict(), model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_critic_backbone_with_lora_saves_and_reloads(tmp_path):
    from reasonrl.config import resolve
    from reasonrl.models.value import load_value_model
    from reasonrl.training.record.checkpoint import load_value_weights
    from reasonrl.training.setup import build_critic

    cfg = load_config("ppo", [*TINY, "model.lora_rank=4"])
    critic = build_critic(cfg, resolve(cfg, "cpu", 1), torch.device("cpu"))
    held = {id(p) for group in critic.optimizer.param_groups for p in group["params"]}
    trainable = {n for n, p in critic.model.named_parameters() if id(p) in held}
    assert {"head.weight", "head.bias"} <= trainable
    assert all(n.startswith("head.") or ".lora_" in n for n in trainable)
    perturb_adapters(critic.model.backbone)
    with torch.no_grad():
        critic.model.head.weight.normal_()
    critic.model.save(tmp_path)
    assert (tmp_path / ADAPTER_DIR / ADAPTER_FILE).exists()
    rebuilt = build_critic(cfg, resolve(cfg, "cpu", 1), torch.device("cpu"))
    load_value_weights(rebuilt.model, tmp_path)
    a, b = critic.model.state_dict(), rebuilt.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    merged = load_value_model(tmp_path)  # the merged critic loads as a plain value model
    prompt, response = torch.randint(0, 100, (2, 5)), torch.randint(0, 100, (2, 4))
    masks = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)
    with torch.no_grad():
        torch.testing.assert_close(
            merged(prompt, masks[0], response, masks[1]),
            critic.model(prompt, masks[0], response, masks[1]),
            rtol=1e-3,
            atol=1e-4,  # merged vs adapted: float rounding of W + ΔW
        )


# --- runs ----------------------------------------------------------------------------------------

LORA_PPO = [  # a critic, a KL term (the frozen base is its reference) and LoRA on both models
    *TINY[:-1],
    "rollout.samples_per_prompt=1",
    "rollout.rollout_prompts=4",
    "train.minibatch_sequences=4",
    "data.eval_prompts=4",
    "algo.kl_placement=loss",
    "algo.kl_coef=0.05",
    "model.lora_rank=4",
    "train.lr=1e-2",
    "run.save_every=1",
    "train.param_dtype=bfloat16",  # a bf16 base under fp32 adapters
]


def lora_run(directory, steps: int) -> None:
    cfg = load_config("ppo", [*LORA_PPO, f"train.rollout_steps={steps}"])
    fit(cfg, directory, verifier=ResponseLength(), show_progress=False)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lora") / "straight"
    lora_run(directory, 2)
    return directory


def comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "eval/"))} for r in records if r["step"] > 0]


def test_a_lora_run_trains_without_a_reference_copy_and_resumes_exactly(straight_run, tmp_path, monkeypatch):
    import reasonrl.training.setup as loop  # where the models load

    loaded = []
    real = loop.load_model
    monkeypatch.setattr(loop, "load_model", lambda spec, *args: loaded.append(spec) or real(spec, *args))
    split = tmp_path / "split"
    lora_run(split, 1)
    lora_run(split, 2)
    assert len(loaded) == 2  # the policy once per start: no reference copy
    records = read_metrics(straight_run / "metrics.jsonl")
    assert records[1]["policy/kl_ref"] == 0.0  # a fresh adapter: the policy is its reference
    assert records[2]["policy/kl_ref"] > 0
    assert comparable(records) == comparable(read_metrics(split / "metrics.jsonl"))
    for part in (ADAPTER_DIR, f"critic/{ADAPTER_DIR}"):
        a = load_file(straight_run / "checkpoints" / "step-000002" / part / ADAPTER_FILE)
        b = load_file(split / "checkpoints" / "step-000002" / part / ADAPTER_FILE)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    trainer = torch.load(straight_run / "checkpoints" / "step-000002" / "trainer.pt", weights_only=False)
    adapter_tensors = len(load_file(straight_run / "checkpoints" / "step-000002" / ADAPTER_DIR / ADAPTER_FILE))
    assert len(trainer["optimizer"]["state"]) == adapter_tensors  # the optimiser holds the adapters only


def test_the_export_is_a_merged_model_and_an_adapter(straight_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    final = straight_run / "final"
    merged = AutoModelForCausalLM.from_pretrained(final).state_dict()
    stored = {w.dtype for w in merged.values()}  # the trained base's: bf16 (LORA_PPO)
    assert len(stored) == 1
    adapter = load_file(final / ADAPTER_DIR / ADAPTER_FILE)
    assert {w.dtype for w in adapter.values()} == {torch.float32}  # whatever the base: PEFT's autocast_adapter_dtype
    base_model = load_model("tiny-random", stored.pop())
    adapted = PeftModel.from_pretrained(base_model, final / ADAPTER_DIR).merge_and_unload()
    reference = adapted.state_dict()
    assert merged.keys() == reference.keys()
    torch.testing.assert_close(merged, reference)  # our merge is PEFT's merge_and_unload
    base = load_model("tiny-random").state_dict()
    assert not torch.equal(merged[f"{Q_PROJ}.weight"], base[f"{Q_PROJ}.weight"])  # it trained
    config = json.loads((final / ADAPTER_DIR / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 32


def test_bad_lora_settings_fail_with_one_clear_line():
    with pytest.raises(ConfigError) as error:
        load_config("dapo", ["model.lora_rank=-1", "model.lora_alpha=0", "model.lora_target_modules=[]"])
    message = str(error.value)
    for line in (
        "model.lora_rank must be >= 0 (0 = full fine-tuning)",
        "model.lora_alpha must be > 0",
        "model.lora_target_modules must name layers (or be all-linear)",
    ):
        assert line in message
    with pytest.raises(ModelError, match=r"model.lora_target_modules=\('nope',\) matches no layer of this model"):
        add_lora(load_model("tiny-random"), ModelConfig(lora_rank=4, lora_target_modules=("nope",)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_lora_run_on_cuda(tmp_path):
    on_cuda = ["model.device=cuda"] if "model.device" in config_keys() else []  # the trainer's device, once it has one
    cfg = load_config("grpo", [*TINY[:-1], *on_cuda, "model.lora_rank=8", "train.rollout_steps=2"])
    summary = fit(cfg, tmp_path, verifier=DigitFraction(), show_progress=False)
    assert summary["steps"] == 2
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[1]["policy/kl_ref"] == 0.0 and records[2]["train/grad_norm"] > 0
    assert (tmp_path / "final" / ADAPTER_DIR / ADAPTER_FILE).exists()
