"""fp32 vs bf16 (and eager vs SDPA attention in training) for the embedded model (one JSON object).

    python bench/dtype.py [--model smollm2-135m] [--batch 64] [--new-tokens 64]

Generation: the hf engine, sampled, `--batch` arithmetic prompts, `--new-tokens` forced tokens.
Training: forward + backward of the chunked log-prob loss over 10 sequences of 100 tokens, with
fp32 weights computed in fp32 or under bf16 autocast (what `model.dtype` selects), and in bf16 with
eager instead of SDPA attention (what the trainer picks for sequences up to 512 tokens on a CPU).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.prompts import prompt_token_ids
from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.training.update.policy import response_logprobs


def generation_tokens_per_second(model, tokenizer, dtype, batch: int, new_tokens: int) -> float:
    engine = build_engine("hf", model, tokenizer, dtype=dtype)
    task = ArithmeticTask()
    prompts = [prompt_token_ids(tokenizer, task.train_example(i).question, "answer_line") for i in range(batch)]
    engine.generate(prompts[:4], SamplingParams(4, seed=0))  # warm-up
    start = time.perf_counter()
    completions = engine.generate(prompts, SamplingParams(new_tokens, seed=0))
    elapsed = time.perf_counter() - start
    # every row of a batch runs until the longest one stops: count the decode steps actually computed
    return batch * max(len(c.token_ids) for c in completions) / elapsed


def training_tokens_per_second(model, dtype, repeats: int = 3) -> float:
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 20000, (10, 56), generator=generator)
    responses = torch.randint(100, 20000, (10, 44), generator=generator)
    masks = torch.ones_like(prompts, dtype=torch.bool), torch.ones_like(responses, dtype=torch.bool)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        logprobs, _ = response_logprobs(model, prompts, masks[0], responses, masks[1], compute_dtype=dtype)
        logprobs.sum().backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return 1000 / min(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    result = {"model": args.model, "threads": torch.get_num_threads(), "batch": args.batch}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        result[f"generate_tokens_per_second_{name}"] = generation_tokens_per_second(
            model, tokenizer, dtype, args.batch, args.new_tokens
        )
        result[f"train_tokens_per_second_{name}"] = training_tokens_per_second(model, dtype)
    eager = load_model(args.model, attn_implementation="eager")
    result["train_tokens_per_second_bfloat16_eager_attention"] = training_tokens_per_second(eager, torch.bfloat16)
    result["train_eager_over_sdpa"] = (
        result["train_tokens_per_second_bfloat16_eager_attention"] / result["train_tokens_per_second_bfloat16"]
    )
    for kind in ("generate", "train"):
        result[f"{kind}_bf16_speedup"] = (
            result[f"{kind}_tokens_per_second_bfloat16"] / result[f"{kind}_tokens_per_second_float32"]
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
