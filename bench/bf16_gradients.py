"""How far the policy gradient of bf16 compute is from fp32's: fp32 weights under bf16 autocast (the default) and bf16
weights computing in bf16 end to end (train.param_dtype=bfloat16), each against pure fp32 (one JSON object).

    python bench/bf16_gradients.py [--model smollm2-135m] [--prompts 16] [--new-tokens 48]

The fast engine samples answers to arithmetic prompts; each answer gets a random advantage (seeded), and the gradient
of -Σ advantage · log π(answer) / prompts is taken three ways at the same weights.  Reported per group of weights
(all, RMSNorms, the tied embedding, the linear layers): the cosine to the fp32 gradient, the norm ratio, and the
share of elements (|g| > 1e-8) whose sign agrees with fp32's: AdamW's first step moves every weight by the
learning rate in its gradient's sign.
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from reasonrl.data.arithmetic import ArithmeticTask
from reasonrl.data.prompts import prompt_token_ids
from reasonrl.models.embedding_gradient import sum_embedding_gradients_in_fp32
from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.training.update.policy import response_logprobs


def gradients(model, prompts, completions, advantages, dtype) -> dict[str, torch.Tensor]:
    """Each weight's gradient (fp32) of the advantage-weighted log-probs, computed in ``dtype``."""
    model.zero_grad(set_to_none=True)
    for prompt, completion, advantage in zip(prompts, completions, advantages, strict=True):
        ids = torch.tensor([completion.token_ids])
        rows = (torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.bool), ids, torch.ones_like(ids).bool())
        logprobs = response_logprobs(model, *rows, compute_dtype=dtype)[0][0]
        (-advantage * logprobs.sum() / len(prompts)).backward()
    return {name: p.grad.detach().float().clone() for name, p in model.named_parameters()}


def agreement(reference: dict, other: dict, names: list[str]) -> dict[str, float]:
    x = torch.cat([reference[n].flatten() for n in names]).double()
    y = torch.cat([other[n].flatten() for n in names]).double()
    counted = x.abs() > 1e-8
    return {
        "cosine": (x @ y / x.norm() / y.norm()).item(),
        "norm_ratio": (y.norm() / x.norm()).item(),
        "sign_agreement": ((x.sign() == y.sign()) & counted).sum().item() / counted.sum().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    engine = build_engine("fast", model, tokenizer, dtype=torch.bfloat16)
    task = ArithmeticTask()
    prompts = [prompt_token_ids(tokenizer, task.train_example(i).question, "answer_line") for i in range(args.prompts)]
    completions = engine.generate(prompts, SamplingParams(args.new_tokens, temperature=1.0, seed=0))
    advantages = torch.randn(len(prompts)).tolist()
    work = (prompts, completions, advantages)
    fp32 = gradients(model, *work, torch.float32)
    autocast = gradients(model, *work, torch.bfloat16)
    bf16_model = copy.deepcopy(model).to(torch.bfloat16)
    sum_embedding_gradients_in_fp32(bf16_model)  # as the trainer's setup does
    bf16 = gradients(bf16_model, *work, torch.bfloat16)
    groups = {
        "all": list(fp32),
        "norms": [n for n in fp32 if "norm" in n],
        "embedding": [n for n in fp32 if "embed" in n],
        "linear": [n for n in fp32 if "proj" in n],
    }
    result = {"model": args.model, "prompts": args.prompts, "new_tokens": args.new_tokens}
    for group, names in groups.items():
        result[group] = {
            "autocast_vs_fp32": agreement(fp32, autocast, names),
            "bf16_weights_vs_fp32": agreement(fp32, bf16, names),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
