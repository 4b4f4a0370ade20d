"""Peak memory of one policy update of the embedded SmolLM2-135M under each memory option, as one JSON object.

    python bench/memory_options.py [--rows 8] [--response-tokens 16]

Each option (train.param_dtype, train.offload_optimizer; default: float32 without offload) runs in a
fresh process, because peak RSS only grows: the model loads as setup loads it, one update (GRPO, a
fixed random batch of ``--rows`` responses of up to ``--response-tokens`` tokens, two optimiser steps)
runs, and the process reports its peak RSS, its RSS after the update (what stays: weights and AdamW's
moments), the bytes of weights and moments it holds, and the update's seconds.  On a CPU device
offloading changes nothing (the moments are in CPU memory already): its row checks exactly that.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

OPTIONS = {
    "default": [],
    "bf16_params": ["train.param_dtype=bfloat16"],
    "offload_optimizer": ["train.offload_optimizer=true"],
    "bf16_params_offload_optimizer": ["train.param_dtype=bfloat16", "train.offload_optimizer=true"],
}
MODEL = "smollm2-135m"


def rss_gb() -> float:
    """This process's resident memory now."""
    import os

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def random_batch(rows: int, response_tokens: int, seed: int = 0):
    """A rollout batch of random tokens: prompts of 32–64 tokens, responses of a quarter to all of
    ``response_tokens``, with random advantages (two prompts' groups)."""
    import torch

    from reasonrl.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(32, 65, (rows,), generator=g)
    response_lens = torch.randint(response_tokens // 4, response_tokens + 1, (rows,), generator=g)
    P, T = int(prompt_lens.max()), int(response_lens.max())
    prompt_mask = torch.arange(P)[None] >= (P - prompt_lens)[:, None]
    response_mask = torch.arange(T)[None] < response_lens[:, None]
    return RolloutBatch(
        prompt_ids=torch.where(prompt_mask, torch.randint(3, 20000, (rows, P), generator=g), 0),
        prompt_mask=prompt_mask,
        response_ids=torch.where(response_mask, torch.randint(3, 20000, (rows, T), generator=g), 0),
        response_mask=response_mask,
        policy_loss_mask=response_mask.clone(),
        value_loss_mask=response_mask.clone(),
        rollout_logprobs=torch.zeros(rows, T),
        rewards=torch.zeros(rows),
        correct=torch.zeros(rows, dtype=torch.bool),
        truncated=torch.zeros(rows, dtype=torch.bool),
        group_ids=torch.arange(rows) // (rows // 2),
        old_logprobs=torch.where(response_mask, -2.0, 0.0),
        advantages=torch.where(response_mask, torch.randn(rows, 1, generator=g).expand(rows, T), 0.0),
    )


def measure(option: str, rows: int, response_tokens: int) -> dict:
    """One update under ``option``, in this process, built as setup builds the policy and its optimiser."""

    from reasonrl.config import load_config, resolve
    from reasonrl.models.load import load_model
    from reasonrl.training.backend import SingleProcess
    from reasonrl.training.setup import build_policy_updater
    from reasonrl.training.update.policy import TokenLogprobs

    overrides = [
        f"model.name_or_path={MODEL}",
        f"train.minibatch_sequences={rows // 2}",
        f"rollout.rollout_prompts={rows // 8}",
        "rollout.samples_per_prompt=8",
        *OPTIONS[option],
    ]
    cfg = load_config("grpo", overrides)
    before_load = rss_gb()
    plan = dataclasses.replace(resolve(cfg, "cpu", 1), microbatch_tokens=768)
    model = load_model(MODEL, plan.parameter_torch_dtype)
    if cfg.model.gradient_checkpointing is True:  # auto: off here, as the plan without a capacity
        model.gradient_checkpointing_enable()
    policy = TokenLogprobs(model, cfg.rollout.temperature, plan.forward_torch_dtype)
    updater = build_policy_updater(cfg, plan, policy, SingleProcess())
    batch = random_batch(rows, response_tokens)
    start = time.perf_counter()
    updater.update(batch, seed=0)
    seconds = time.perf_counter() - start
    moments = [t for state in updater.optimizer.state.values() for k, t in state.items() if k != "step"]
    return {
        "overrides": OPTIONS[option],
        "forward_dtype": plan.forward_dtype,
        "optimizer": type(updater.optimizer).__name__,
        "weights_gb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
        "adamw_moments_gb": sum(t.numel() * t.element_size() for t in moments) / 2**30,
        "rss_before_load_gb": before_load,
        "rss_after_update_gb": rss_gb(),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "update_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="responses in the update (two optimiser steps)")
    parser.add_argument("--response-tokens", type=int, default=16)
    parser.add_argument("--child", choices=sorted(OPTIONS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.rows, args.response_tokens)))
        return
    sizes = ["--rows", str(args.rows), "--response-tokens", str(args.response_tokens)]
    results = {}
    for option in OPTIONS:
        done = subprocess.run(
            [sys.executable, __file__, "--child", option, *sizes], capture_output=True, text=True, check=True
        )
        results[option] = json.loads(done.stdout.strip().splitlines()[-1])
    default = results["default"]["peak_rss_gb"]
    for result in results.values():
        result["peak_rss_saved_gb"] = default - result["peak_rss_gb"]
    command = "python bench/memory_options.py " + " ".join(sizes)
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine()}
    print(json.dumps({"model": MODEL, "command": command, "machine": machine, "options": results}, indent=2))


if __name__ == "__main__":
    main()
