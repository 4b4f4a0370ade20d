"""Engine vs trainer log-probs for the same tokens, and what that means for the PPO ratio (one JSON object).

    python bench/logprob_gap.py [--model smollm2-135m] [--engine fast] [--prompts 32] [--new-tokens 64]

Samples completions of arithmetic prompts with the rollout engine (bf16), then recomputes the
log-probs of exactly those tokens with the trainer's forward: fp32 weights under bf16 autocast (what training
uses by default), bf16 weights computing in bf16 end to end (``train.param_dtype=bfloat16``), and, for reference,
pure fp32.  Reports mean and max |Δ log-prob|, and the PPO ratio
exp(trainer − old) at the first mini-batch for both choices of "old": the engine's log-probs
(what a trainer that trusted the sampler would use) and the trainer's own recomputation (what
reasonrl does: exactly 1).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.prompts import prompt_token_ids
from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.training.update.policy import response_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--engine", default="fast")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    engine = build_engine(args.engine, model, tokenizer, dtype=torch.bfloat16)
    task = ArithmeticTask()
    prompts = [prompt_token_ids(tokenizer, task.train_example(i).question, "answer_line") for i in range(args.prompts)]
    completions = engine.generate(prompts, SamplingParams(args.new_tokens, temperature=1.0, seed=0))
    result: dict = {"model": args.model, "engine": args.engine, "tokens": sum(len(c.token_ids) for c in completions)}
    bf16_weights = copy.deepcopy(model).to(torch.bfloat16)
    arms = (("bf16_weights", bf16_weights, torch.bfloat16), ("autocast_bf16", model, torch.bfloat16),
            ("fp32", model, torch.float32))  # fmt: skip
    for label, trainer_model, dtype in arms:
        gaps, ratios_engine, ratios_recomputed = [], [], []
        with torch.no_grad():
            for prompt, completion in zip(prompts, completions, strict=True):
                ids = torch.tensor([completion.token_ids])
                mask = torch.ones_like(ids, dtype=torch.bool)
                args_ = (torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.bool), ids, mask)
                trainer = response_logprobs(trainer_model, *args_, compute_dtype=dtype)[0][0]
                again = response_logprobs(trainer_model, *args_, compute_dtype=dtype)[0][0]
                engine_lp = torch.tensor(completion.logprobs)
                gaps.append((trainer - engine_lp).abs())
                ratios_engine.append(torch.exp(trainer - engine_lp))
                ratios_recomputed.append(torch.exp(trainer - again))
        gap, r_engine, r_own = torch.cat(gaps), torch.cat(ratios_engine), torch.cat(ratios_recomputed)
        result[f"trainer_{label}"] = {
            "mean_abs_logprob_diff": gap.mean().item(),
            "max_abs_logprob_diff": gap.max().item(),
            "ratio_with_engine_old_logprobs_max_dev": (r_engine - 1).abs().max().item(),
            "ratio_with_engine_old_logprobs_mean_dev": (r_engine - 1).abs().mean().item(),
            "ratio_with_recomputed_old_logprobs_max_dev": (r_own - 1).abs().max().item(),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
