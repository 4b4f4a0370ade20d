"""The memory plan: exact bytes for the counted components, sharding, LoRA, vLLM's share, the refusal
before any weight loads, and `reasonrl config show` printing it."""

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from reasonrl.cli import main
from reasonrl.config import ConfigError, load_config
from reasonrl.models import memory_check, memory_plan
from reasonrl.models.lora import add_lora
from reasonrl.models.memory_check import check_memory, refusal_message
from reasonrl.models.memory_plan import GIB, plan_memory

TINY = LlamaConfig(
    vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, tie_word_embeddings=True,
)  # fmt: skip
CPU = ["model.device=cpu", "model.dtype=float32", "rollout.engine=hf"]


def tiny_parameters() -> int:
    return sum(p.numel() for p in LlamaForCausalLM(TINY).parameters())


def plan(*overrides: str, preset: str = "dr_grpo", **options):
    return plan_memory(load_config(preset, [*CPU, *overrides]), TINY, **({"device_type": "cpu"} | options))


def test_weights_gradients_and_adamw_states_are_counted_per_parameter():
    params = tiny_parameters()
    parts = plan().components
    assert (parts["policy weights"], parts["policy gradients"]) == (4 * params, 4 * params)
    assert parts["optimizer states (AdamW)"] == 8 * params  # two fp32 moments
    assert parts["reference weights"] == 0  # dr_grpo has no KL term
    assert parts["rollout engine"] == 4 * params  # the hf engine's copy in the compute dtype
    bf16 = plan("model.dtype=bfloat16", "train.param_dtype=bfloat16").components
    assert (bf16["policy weights"], bf16["optimizer states (AdamW)"]) == (2 * params, 12 * params)  # + master


def test_a_kl_term_adds_the_reference_in_the_policys_dtype_unless_lora_is_its_base():
    params = tiny_parameters()
    assert plan(preset="grpo").components["reference weights"] == 4 * params
    assert plan("model.dtype=bfloat16", preset="grpo").components["reference weights"] == 4 * params  # as the policy
    bf16_weights = plan("model.dtype=bfloat16", "train.param_dtype=bfloat16", preset="grpo").components
    assert bf16_weights["reference weights"] == 2 * params
    assert plan("model.lora_rank=4", preset="grpo").components["reference weights"] == 0


def test_lora_trains_exactly_the_adapters_peft_adds():
    model = add_lora(LlamaForCausalLM(TINY), load_config("dr_grpo", ["model.lora_rank=4"]).model)
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    parts = plan("model.lora_rank=4").components
    assert parts["policy gradients"] == 4 * adapters
    assert parts["optimizer states (AdamW)"] == 8 * adapters
    assert parts["policy weights"] == 4 * tiny_parameters()  # the frozen base stays


def test_two_fsdp2_ranks_halve_the_sharded_parts_and_gather_layers():
    one, two = plan().components, plan(world_size=2).components
    for part in ("policy weights", "policy gradients", "optimizer states (AdamW)"):
        assert two[part] == one[part] // 2
    assert one["FSDP2 gathered layers"] == 0 < two["FSDP2 gathered layers"]
    assert two["activations"] == one["activations"]  # each rank runs whole micro-batches


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_checkpointing_and_a_smaller_token_budget_shrink_activations(attention):
    base = plan("train.microbatch_tokens=1024", f"model.attention={attention}").components["activations"]
    assert plan("train.microbatch_tokens=512", f"model.attention={attention}").components["activations"] < base
    checkpointed = plan(
        "train.microbatch_tokens=1024", "model.gradient_checkpointing=true", f"model.attention={attention}"
    )
    assert checkpointed.components["activations"] < base


def test_vllm_takes_its_share_of_the_gpu_and_gives_it_back_while_asleep():
    options = {"device_type": "cuda", "device_memory": 80 * GIB}
    awake = plan("model.device=auto", "rollout.engine=vllm", "rollout.vllm.sleep_mode=false", **options)
    assert awake.components["rollout engine"] == 40 * GIB  # gpu_memory_utilization 0.5
    assert awake.total == sum(awake.components.values())
    asleep = plan("model.device=auto", "rollout.engine=vllm", **options)
    assert asleep.total < awake.total
    offloaded = plan("model.device=auto", "rollout.engine=vllm", "train.offload_optimizer=true", **options)
    assert offloaded.components["optimizer states (AdamW)"] == 0


def test_the_refusal_names_each_setting_with_its_predicted_peak():
    cfg = load_config("dr_grpo", [*CPU, "train.microbatch_tokens=4096", "model.dtype=auto",
                                  "model.gradient_checkpointing=false"])  # fmt: skip
    over = plan_memory(cfg, TINY, device_type="cpu")
    # room for everything but a fifth of the activations: checkpointing or a smaller budget fits
    capacity = over.total - over.components["activations"] // 5
    message = refusal_message(cfg, TINY, plan_memory(cfg, TINY, device_type="cpu", capacity=capacity))
    fitting = message.split("settings that would make it fit")[1].split("\n")[0]
    assert "train.microbatch_tokens=2048 (" in fitting
    assert "model.gradient_checkpointing=true (" in fitting
    for setting in ("model.lora_rank=16", "train.param_dtype=bfloat16", "train.memory_check=warn"):
        assert setting in message
    assert "GiB" in fitting and "activations" in message


def test_auto_checkpointing_is_on_exactly_where_the_run_does_not_fit_without_it():
    cfg = load_config("dr_grpo", [*CPU, "train.microbatch_tokens=4096"])
    assert cfg.model.gradient_checkpointing == "auto"
    without = plan("train.microbatch_tokens=4096", "model.gradient_checkpointing=false")
    with_it = plan("train.microbatch_tokens=4096", "model.gradient_checkpointing=true")
    assert with_it.total < without.total
    for capacity, expected in ((None, without), (without.total, without), (without.total - 1, with_it)):
        chosen = plan_memory(cfg, TINY, device_type="cpu", capacity=capacity)
        assert chosen.components == expected.components and chosen.gradient_checkpointing == (expected is with_it)
    on = plan_memory(cfg, TINY, device_type="cpu", capacity=without.total - 1)
    assert on.fits and "model.gradient_checkpointing=auto: on (without it the peak would be" in on.notes[-1]
    short = plan_memory(cfg, TINY, device_type="cpu", capacity=with_it.total - 1)  # not even with it: refused as is
    assert not short.fits and short.gradient_checkpointing


def test_a_run_with_auto_checkpointing_recomputes_where_the_memory_plan_says_it_must(monkeypatch, tmp_path, caplog):
    from reasonrl.models.load import model_config
    from reasonrl.training import setup

    cfg = load_config("dr_grpo", [*CPU, "model.name_or_path=tiny-random", "train.rollout_steps=1"])
    tiny = model_config("tiny-random")
    no_checkpointing = load_config(
        "dr_grpo", [*CPU, "model.name_or_path=tiny-random", "model.gradient_checkpointing=false"]
    )
    without = plan_memory(no_checkpointing, tiny, device_type="cpu")
    monkeypatch.setattr(memory_check, "device_memory", lambda device, local_ranks=1: (without.total - 1, 64 * GIB))
    with caplog.at_level(logging.INFO):
        run = setup.setup(cfg, tmp_path)
    assert run.plan.gradient_checkpointing and run.model.is_gradient_checkpointing
    assert "model.gradient_checkpointing=auto: on" in caplog.text
    monkeypatch.setattr(memory_check, "device_memory", lambda device, local_ranks=1: (64 * GIB, 64 * GIB))
    run = setup.setup(cfg, tmp_path / "roomy")
    assert not run.plan.gradient_checkpointing and not run.model.is_gradient_checkpointing


def test_train_refuses_before_any_weight_loads(monkeypatch, tmp_path):
    from reasonrl.training import setup

    monkeypatch.setattr(memory_check, "device_memory", lambda device, local_ranks=1: (GIB // 4, GIB))
    monkeypatch.setattr(setup, "load_model", lambda *a, **k: pytest.fail("weights loaded before the check"))
    cfg = load_config("dr_grpo", [*CPU, "model.name_or_path=tiny-random"])
    with pytest.raises(ConfigError, match=r"more than the 0\.25 GiB this cpu has available") as refused:
        setup.setup(cfg, tmp_path)
    assert "settings that would make it fit" in str(refused.value)


def test_warn_logs_the_plan_and_skip_skips_it(monkeypatch, caplog):
    monkeypatch.setattr(memory_check, "device_memory", lambda device, local_ranks=1: (GIB // 4, GIB))
    device = torch.device("cpu")
    with caplog.at_level(logging.WARNING):
        planned = check_memory(load_config("dr_grpo", [*CPU, "model.name_or_path=tiny-random",
                                                       "train.memory_check=warn"]), device)  # fmt: skip
    assert not planned.fits and "train.memory_check=warn" in caplog.text
    assert check_memory(load_config("dr_grpo", [*CPU, "train.memory_check=skip"]), device) is None


def test_config_show_prints_the_plan(capsys):
    assert main(["config", "show", "grpo", "model.name_or_path=tiny-random", "model.device=cpu"]) == 0
    shown = capsys.readouterr().out
    plan_lines = shown.split("# memory plan")[1]
    for row in ("policy weights", "optimizer states (AdamW)", "reference weights", "activations",
                "total (predicted peak)", "cpu available"):  # fmt: skip
        assert f"# {row}" in plan_lines


def test_the_planned_lm_head_chunk_is_the_trainers():
    from reasonrl.training.update import policy

    assert memory_plan.DEFAULT_CHUNK_TOKENS == policy.DEFAULT_CHUNK_TOKENS


HUGE_STEP = ["rollout.rollout_prompts=20000", "rollout.max_response_tokens=4096", "train.minibatch_sequences=20000"]


def test_a_step_whose_sequences_exceed_the_cpus_memory_is_refused_naming_them(monkeypatch):
    """The plan once counted one micro-batch and never the rollout batch: a step of 20000 × 8 sequences of 4k tokens
    (83 GiB of completions and batch tensors, 166 GiB with one more generation pass) started on a 24 GiB machine."""
    cfg = load_config("dr_grpo", [*CPU, *HUGE_STEP])
    parts = plan_memory(cfg, TINY, device_type="cpu").components
    assert parts["rollout batch (host)"] == (160000 + 20000 * 8) * (256 + 4096) * 128  # the batch and one more pass
    monkeypatch.setattr(memory_check, "device_memory", lambda device, local_ranks=1: (24 * GIB, 24 * GIB))
    with pytest.raises(ConfigError, match=r"a rollout step's sequences alone take 166\.02 GiB: lower rollout"):
        check_memory(load_config("dr_grpo", [*CPU, *HUGE_STEP, "model.name_or_path=tiny-random"]), torch.device("cpu"))


def test_a_gpu_steps_sequences_are_checked_against_the_hosts_memory(monkeypatch, caplog):
    monkeypatch.setattr(memory_check, "host_memory", lambda local_ranks=1: (24 * GIB, 32 * GIB))
    cfg = load_config("dr_grpo", [*HUGE_STEP, "model.name_or_path=tiny-random"])
    with pytest.raises(
        ConfigError, match=r"sequences take about 166\.02 GiB of host memory .* more than the 24\.00 GiB"
    ):
        check_memory(cfg, torch.device("cuda"))
    warned = load_config("dr_grpo", [*HUGE_STEP, "model.name_or_path=tiny-random", "train.memory_check=warn"])
    with caplog.at_level(logging.WARNING):
        check_memory(warned, torch.device("cuda"))
    assert "166.02 GiB of host memory" in caplog.text


def test_auto_checkpointing_is_on_for_every_rank_when_one_ranks_plan_needs_it(caplog):
    from reasonrl.config import resolve
    from reasonrl.training.setup import with_planned_settings

    class OtherRankNeedsIt:  # DataParallel.max: the largest value over ranks
        def max(self, value: int) -> int:
            return 1

    cfg = load_config("dr_grpo", CPU)
    plan = resolve(cfg, "cpu", 2)
    assert not plan.gradient_checkpointing
    with caplog.at_level(logging.INFO):
        assert with_planned_settings(cfg, plan, None, OtherRankNeedsIt()).gradient_checkpointing
    assert "model.gradient_checkpointing=auto: on (another rank needs it)" in caplog.text
    explicit = load_config("dr_grpo", [*CPU, "model.gradient_checkpointing=false"])
    assert not with_planned_settings(
        explicit, resolve(explicit, "cpu", 2), None, OtherRankNeedsIt()
    ).gradient_checkpointing


GPU = ["model.device=auto", "rollout.engine=hf", "model.dtype=bfloat16", "rollout.max_response_tokens=1792"]


def gpu_plan(*overrides: str, capacity: int | None = None):
    cfg = load_config("dr_grpo", [*GPU, *overrides])
    return plan_memory(cfg, TINY, device_type="cuda", capacity=capacity, device_memory=80 * GIB)


def test_the_optimiser_steps_temporaries_count_where_the_step_peaks_and_a_gpu_keeps_headroom():
    params = tiny_parameters()
    # torch's fused AdamW over fp32 weights: in place
    fused = gpu_plan("train.microbatch_tokens=2048")
    assert fused.components["optimizer step temporaries"] == 0
    assert fused.components["allocator headroom"] == int(0.05 * (fused.total - fused.components["allocator headroom"]))
    master = gpu_plan("train.microbatch_tokens=2048", "train.param_dtype=bfloat16")
    assert master.components["policy gradients"] == 4 * params  # summed in fp32
    assert master.components["optimizer step temporaries"] == 4 * params  # foreach's denominator
    parts = master.components
    transients = sum(parts[k] for k in memory_plan.UPDATE_TRANSIENTS)
    resident = sum(parts.values()) - transients - parts["optimizer step temporaries"] - parts["allocator headroom"]
    assert master.total - parts["allocator headroom"] == resident + max(transients, 4 * params)
    offloaded = gpu_plan("train.microbatch_tokens=2048", "train.param_dtype=bfloat16", "train.offload_optimizer=true")
    assert offloaded.components["optimizer step temporaries"] == 0  # the step runs in host memory
    assert offloaded.components["policy gradients"] == 0  # summed in fp32 in host memory
    assert "allocator headroom" not in plan().components  # the CPU: none


def test_auto_token_budget_is_the_largest_that_fits_and_prefers_no_recomputation():
    longest = 256 + 1792
    sizes = {b: gpu_plan(f"train.microbatch_tokens={b}", "model.gradient_checkpointing=false").total
             for b in (longest, 4096, 8192, 16384, 32768)}  # fmt: skip
    auto = load_config("dr_grpo", [*GPU, "train.microbatch_tokens=auto"])
    most = auto.train.minibatch_sequences * longest  # a larger budget never fills
    candidates = memory_plan.microbatch_candidates(auto, "cuda")
    assert candidates == [longest, *(2**k for k in range(12, 20) if 2**k <= most)] and candidates[-1] * 2 > most
    chosen = gpu_plan("train.microbatch_tokens=auto", "model.gradient_checkpointing=false", capacity=sizes[8192])
    assert chosen.microbatch_tokens == 8192 and chosen.fits and not chosen.gradient_checkpointing
    assert (
        f"train.microbatch_tokens=auto: 8192 tokens, the largest of 2048–{candidates[-1]} that fits" in chosen.notes[-1]
    )
    # auto checkpointing: off where the device default (16384) fits without it
    roomy = gpu_plan("train.microbatch_tokens=auto", capacity=sizes[32768])
    assert (roomy.microbatch_tokens, roomy.gradient_checkpointing) == (32768, False)
    # on where only a smaller budget would fit without it, at the largest budget that fits with it
    recomputed = gpu_plan("train.microbatch_tokens=16384", "model.gradient_checkpointing=true").total
    assert sizes[8192] < recomputed < sizes[16384]
    tight = gpu_plan("train.microbatch_tokens=auto", capacity=recomputed)
    assert (tight.microbatch_tokens, tight.gradient_checkpointing) == (16384, True) and tight.fits
    assert "model.gradient_checkpointing=auto: on (no budget of at least 16384 tokens" in tight.notes[-1]
    # nothing fits: the smallest budget, refused with its fixes by the check
    assert gpu_plan("train.microbatch_tokens=auto", capacity=GIB // 8).microbatch_tokens == longest
    # a mini-batch smaller than the device default: its whole, without recomputation where that fits
    small = gpu_plan("train.microbatch_tokens=auto", "train.minibatch_sequences=4", capacity=64 * GIB)
    assert (small.microbatch_tokens, small.gradient_checkpointing) == (8192, False)
    # no capacity known, or the CPU: the device's default
    assert gpu_plan("train.microbatch_tokens=auto").microbatch_tokens == 16384
    assert plan("train.microbatch_tokens=auto", capacity=64 * GIB).microbatch_tokens == 768


def test_a_run_trains_with_the_planned_token_budget_agreed_over_ranks(caplog):
    from dataclasses import replace

    from reasonrl.config import resolve
    from reasonrl.training.setup import with_planned_settings

    class OtherRankFitsLess:  # DataParallel.max over ranks, one of which planned 4096
        def max(self, value: int) -> int:
            return max(value, -4096)

    cfg = load_config("dr_grpo", [*CPU, "train.microbatch_tokens=auto", "model.gradient_checkpointing=false"])
    plan = resolve(cfg, "cpu", 2)
    assert plan.microbatch_tokens == 768  # the default until the memory plan chooses
    memory = replace(gpu_plan("train.microbatch_tokens=8192"), notes=("train.microbatch_tokens=auto: 8192 tokens",))
    with caplog.at_level(logging.INFO):
        assert with_planned_settings(cfg, plan, memory, OtherRankFitsLess()).microbatch_tokens == 4096
    assert "train.microbatch_tokens=auto: 4096 tokens, the smallest over ranks" in caplog.text
    assert "(this rank's plan: train.microbatch_tokens=auto: 8192 tokens)" in caplog.text
    assert with_planned_settings(cfg, plan, None, OtherRankFitsLess()).microbatch_tokens == 768  # no plan


def test_selective_checkpointing_keeps_more_than_full_and_much_less_than_none():
    deep = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=176, num_hidden_layers=30,
                       num_attention_heads=4, num_key_value_heads=1)  # fmt: skip
    cfg = [*GPU, "train.microbatch_tokens=4096", "model.attention=sdpa"]

    def activations(*overrides: str) -> int:
        chosen = plan_memory(load_config("dr_grpo", [*cfg, *overrides]), deep, device_type="cuda")
        return chosen.components["activations"]

    none = activations("model.gradient_checkpointing=false")
    full = activations("model.gradient_checkpointing=true")
    selective = activations("model.gradient_checkpointing=true", "model.checkpoint_policy=selective")
    assert full < selective < none / 2
    # per token and layer: the fp32 input, and the bf16 outputs of q, o, attention, down (d each), k, v (16 each:
    # one key/value head of 16) and gate, up (176 each)
    assert selective - full == 4096 * 30 * 2 * (4 * 64 + 2 * 16 + 2 * 176)
