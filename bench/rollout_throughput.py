"""Rollout throughput: the hf, fast and vLLM engines at several batch sizes (one JSON object).

    python bench/rollout_throughput.py [--model smollm2-135m] [--new-tokens 128] [--batches 8,32,64,128]
        [--engines hf,fast,vllm]

vllm runs where vLLM is installed (its CPU build: .venv-vllm/bin/python, see `make test-vllm`), in
this process with torch's threads (tuned: no separate scheduler process), compiled as in training;
one engine serves every batch size.  The engines take turns at each batch size, so a burst of
load from elsewhere hits them alike.  All serve bf16 weights and sample (temperature 1) completions
of the same arithmetic-task prompts (~56 tokens with the chat template).  Two modes:
  - fixed (the headline keys): every row generates exactly --new-tokens (stop tokens ignored), the
    usual way to measure engine throughput;
  - natural (keys with ``_natural``): rows stop at end of turn as in training, so a batch waits for
    its longest row; tokens/s counts generated tokens only.
Prompt processing (prefill) is included in the time.  The share of peak is
(2 × parameters × tokens/s) ÷ the bf16 matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

import torch

from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.prompts import prompt_token_ids
from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine


def matmul_peak_flops(dtype: torch.dtype = torch.bfloat16, size: int = 2048, repeats: int = 10) -> float:
    """Best-of-``repeats`` FLOP/s of a square matmul: the denominator of utilisation figures."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def tokens_per_second(engine, prompts, new_tokens: int, ignore_stop: bool, seed: int = 1) -> float:
    engine.generate(prompts[:2], SamplingParams(4, seed=0))  # warm-up
    start = time.perf_counter()
    params = SamplingParams(new_tokens, temperature=1.0, seed=seed, ignore_stop=ignore_stop)
    completions = engine.generate(prompts, params)
    return sum(len(c.token_ids) for c in completions) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="8,32,64,128")
    parser.add_argument("--engines", default="hf,fast,vllm", help="vllm is left out where vLLM is not installed")
    parser.add_argument("--vllm-eager", action="store_true", help="vLLM without torch.compile (faster start-up)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per engine and setting; the best counts")
    args = parser.parse_args()
    names = [n for n in args.engines.split(",") if n != "vllm" or importlib.util.find_spec("vllm") is not None]
    tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    flops_per_token = 2 * sum(p.numel() for p in model.parameters())
    task = ArithmeticTask()
    batches = [int(b) for b in args.batches.split(",")]
    prompts = [prompt_token_ids(tokenizer, task.train_example(i).question, "answer_line") for i in range(max(batches))]
    peak_before = matmul_peak_flops()
    result: dict = {"model": args.model, "new_tokens": args.new_tokens, "threads": torch.get_num_threads()}
    result["load_average_before"] = os.getloadavg()
    vllm = None
    if "vllm" in names:
        started = time.perf_counter()
        longest = max(len(p) for p in prompts) + args.new_tokens
        options = {"max_model_len": longest, "enforce_eager": args.vllm_eager}
        vllm = build_engine("vllm", model, tokenizer, options, dtype=torch.bfloat16, max_batch_sequences=max(batches))
        result["vllm_enforce_eager"] = args.vllm_eager
        result["vllm_startup_seconds"] = time.perf_counter() - started
    samples: dict[str, list[float]] = {}
    for batch in batches:
        engines = {
            name: build_engine(name, model, tokenizer, dtype=torch.bfloat16, max_batch_sequences=batch)
            for name in names
            if name != "vllm"
        }
        if vllm is not None:
            engines["vllm"] = vllm  # one engine for every batch size: its start-up is long
        for mode, ignore_stop in (("", True), ("_natural", False)):
            for repeat in range(args.repeats):  # the engines take turns
                for name, engine in engines.items():
                    rate = tokens_per_second(engine, prompts[:batch], args.new_tokens, ignore_stop, seed=1 + repeat)
                    samples.setdefault(f"{name}{mode}_bs{batch}", []).append(rate)
        del engines
    rates = {key: max(values) for key, values in samples.items()}
    # the peak is measured before and after the engines, and the higher value kept, so a moment of
    # interference cannot inflate the utilisation figures
    peak = max(peak_before, matmul_peak_flops())
    result["bf16_matmul_peak_tflops"] = peak / 1e12
    for batch in batches:
        for mode in ("", "_natural"):
            for name in names:
                rate = rates[f"{name}{mode}_bs{batch}"]
                result[f"{name}_tokens_per_second{mode}_bs{batch}"] = rate
                result[f"{name}_peak_fraction{mode}_bs{batch}"] = rate * flops_per_token / peak
            for other in ("hf", "vllm"):
                if "fast" in names and other in names:
                    result[f"fast_over_{other}_bf16{mode}_bs{batch}"] = (
                        rates[f"fast{mode}_bs{batch}"] / rates[f"{other}{mode}_bs{batch}"]
                    )
    if args.repeats > 1:
        result["samples_tokens_per_second"] = samples
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
