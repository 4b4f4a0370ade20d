"""Generation throughput without vLLM (issue 51): generated tokens per second of transformers' ``generate`` (what
the hf engine runs), of its continuous batching (what the paged engine runs) and of vLLM where it is installed,
on random-weight models of real shapes at several batch sizes; the fraction of the weight-bandwidth bound each
reaches; the peak memory.  Random weights seldom end an answer, so each answer's length comes from one
long-tailed stop schedule (``answer_lengths``: lognormal, median a quarter of the cap), the same for every engine:
``generate`` stops each row at its length, the paged engine's requests and vLLM's each get theirs.

    python bench/gpu_rollout.py --profile gpu --out bench/results     (scripts/gpu-check.sh runs it)
    python bench/gpu_rollout.py --profile cpu --smoke --out DIR       (the check tests/bench runs on the CPU)

The bound: a decoding step reads every weight once and gives one token per running answer, so B answers cannot
come faster than B × bandwidth / weight bytes tokens per second (KV-cache reads and compute only lower it).
Prints the JSON it writes to OUT/gpu_rollout_PROFILE[_smoke].json.  Each timed call follows an untimed warm-up
on a few short answers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/train_side.py: the shapes and the length mix
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_side import answer_lengths, model_config

BANDWIDTH_TB_S = {"H200": 4.8, "H100": 3.35, "A100": 2.0}  # HBM bandwidth of the cards this is run on (SXM)
PROFILES = {
    "gpu": dict(shapes=("qwen2.5-0.5b", "qwen2.5-1.5b"), batches=(16, 64, 256), cap=512, prompt=(100, 200)),
    "cpu": dict(shapes=("qwen2.5-0.5b",), batches=(4, 8), cap=16, prompt=(8, 16)),
}
GENERATE_CHUNK = 64  # rows per generate call: the hf engine's max_batch_sequences default


def prompts_and_lengths(batch: int, cap: int, prompt: tuple[int, int], vocab: int, seed: int = 0):
    """``batch`` random prompts of ``prompt`` tokens (uniform) and each answer's scheduled length."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(*prompt))] for _ in range(batch)]
    return prompts, answer_lengths(cap, batch, seed)


def run_generate(model, prompts, lengths) -> list[int]:
    """transformers' ``generate`` as the hf engine calls it (left padding, chunks of prompts sorted by length,
    sampling at temperature 1), each row ended at its scheduled length by a stop token it is made to draw there
    (and barred from before); the tokens each row generated, the stop token included, counted from the output."""
    import torch
    from transformers import LogitsProcessor

    stop = model.config.vocab_size - 1

    class ScheduledStop(LogitsProcessor):
        def __init__(self, width: int, ends: list[int]) -> None:
            self.width, self.ends = width, torch.tensor(ends, device=model.device)

        def __call__(self, input_ids, scores):
            step = input_ids.shape[1] - self.width  # tokens each row has generated
            scores[:, stop] = float("-inf")  # [rows, vocab]: no row stops early
            ending = step == self.ends - 1
            scores[ending] = torch.where(torch.arange(scores.shape[1], device=scores.device) == stop, 0.0, -1e9)
            return scores

    generated = [0] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for start in range(0, len(order), GENERATE_CHUNK):
        rows = order[start : start + GENERATE_CHUNK]
        width = max(len(prompts[i]) for i in rows)
        ids = torch.full((len(rows), width), stop, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, i in enumerate(rows):
            ids[r, width - len(prompts[i]) :], mask[r, width - len(prompts[i]) :] = torch.tensor(prompts[i]), 1
        ends = [lengths[i] for i in rows]
        output = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), do_sample=True,
                                temperature=1.0, top_k=0, max_new_tokens=max(ends), eos_token_id=stop,
                                pad_token_id=stop, logits_processor=[ScheduledStop(width, ends)])  # fmt: skip
        answers = output[:, width:].tolist()
        for r, i in enumerate(rows):
            generated[i] = answers[r].index(stop) + 1 if stop in answers[r] else len(answers[r])
    return generated


def run_paged(model, prompts, lengths) -> list[int]:
    """transformers' continuous batching as the paged engine configures it (its cache sized by the engine's
    ``cache_settings``), each request capped at its scheduled length; the tokens each request generated."""
    from transformers import GenerationConfig

    from reasonrl.rollout.paged import cache_settings, continuous_batching_config

    config_class, page_field = continuous_batching_config()
    settings = cache_settings(prompts, max(lengths), page_field, max_batch_sequences=256)  # the engine's default
    generation = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=max(lengths),
                                  eos_token_id=None, pad_token_id=0)  # fmt: skip
    manager = model.init_continuous_batching(
        generation_config=generation, continuous_batching_config=config_class(return_logprobs=True, seed=0, **settings)
    )
    manager.start()
    try:
        for i, (prompt, length) in enumerate(zip(prompts, lengths, strict=True)):
            manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=length)
        generated = [0] * len(prompts)
        for _ in prompts:
            result = manager.get_result(timeout=600)
            if result is None or result.error:
                raise RuntimeError(f"continuous batching failed: {None if result is None else result.error}")
            generated[int(result.request_id[1:])] = len(result.generated_tokens)
    finally:
        manager.stop(block=True)
    return generated


def run_vllm(engine, prompts, lengths) -> list[int]:
    """vLLM (the vllm engine's LLM), each request capped at its scheduled length, end-of-answer ignored."""
    from vllm import SamplingParams, TokensPrompt

    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=1.0, seed=i) for i, n in enumerate(lengths)]
    outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [len(o.outputs[0].token_ids) for o in outputs]


def peak_memory_gb(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def measure(name: str, run, prompts, lengths, device, bound: float | None) -> dict:
    """One engine on one batch: a warm-up call, then one timed call; tokens/s and the fraction of the bound."""
    import torch

    run(prompts[:4], [min(n, 8) for n in lengths[:4]])  # warm: kernels, allocator, the engine's start
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    generated = run(prompts, lengths)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    if generated != lengths:
        raise RuntimeError(f"{name} did not follow the stop schedule: {sum(generated)} of {sum(lengths)} tokens")
    rate = sum(lengths) / seconds
    return {"engine": name, "seconds": round(seconds, 4), "tokens_per_second": round(rate, 1),
            "fraction_of_bound": round(rate / bound, 4) if bound else None,
            "peak_memory_gb": round(peak_memory_gb(device), 3)}  # fmt: skip


def engines_of(model, tokenizer, device) -> tuple[dict, list[dict]]:
    """The engines to race here, and those skipped with their reason."""
    engines = {"generate": lambda p, n: run_generate(model, p, n), "paged": lambda p, n: run_paged(model, p, n)}
    skipped = []
    if importlib.util.find_spec("vllm") is None:
        skipped.append({"engine": "vllm", "reason": "vLLM is not installed here"})
    else:
        from reasonrl.rollout import build_engine

        served = build_engine("vllm", model, tokenizer, {"gpu_memory_utilization": 0.5}, dtype=model.dtype)
        engines["vllm"] = lambda p, n: run_vllm(served, p, n)
    return engines, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--smoke", action="store_true", help="tiny layers and caps: the code paths, not the figures")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl.models.load import load_tokenizer

    profile = PROFILES[args.profile]
    device = torch.device("cuda" if args.profile == "gpu" else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bandwidth = next((tb for card, tb in BANDWIDTH_TB_S.items() if card in name), None)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows, skipped = [], []
    for shape in profile["shapes"]:
        torch.manual_seed(0)
        config = model_config(shape, args.smoke)
        with device:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        engines, skipped = engines_of(model, load_tokenizer("tiny-random"), device)
        for batch in profile["batches"]:
            prompts, lengths = prompts_and_lengths(batch, profile["cap"], profile["prompt"], config.vocab_size)
            bound = batch * bandwidth * 1e12 / weight_bytes if bandwidth else None
            for engine, run in engines.items():
                row = {"shape": shape, "batch": batch, "answer_tokens": sum(lengths), "weight_gb": weight_bytes / 1e9,
                       "bound_tokens_per_second": round(bound, 1) if bound else None}  # fmt: skip
                rows.append(row | measure(engine, run, prompts, lengths, device, bound))
                print(json.dumps(rows[-1]), file=sys.stderr)
        del model, engines
    result = {"device": name, "bandwidth_tb_s": bandwidth, "profile": args.profile, "smoke": args.smoke,
              "cap": profile["cap"], "dtype": str(dtype).removeprefix("torch."), "rows": rows, "skipped": skipped,
              "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu_rollout_{args.profile}{'_smoke' if args.smoke else ''}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
