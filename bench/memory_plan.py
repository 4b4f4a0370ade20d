"""The memory plan (``reasonrl.models.memory_plan``) against measured peak RSS on this CPU.

    python bench/memory_plan.py [--out bench/results/memory_plan_cpu.json] [--only NAME ...]

Each configuration of ``CONFIGS`` runs in a fresh process (``--worker``), so its peak RSS
(``resource.getrusage``'s ``ru_maxrss``) is its own: the model is built from its config with random
weights (``from_config``; no download, no checkpoint read), in fp32 master weights as ``reasonrl train``
holds them, with LoRA and gradient checkpointing as the configuration says and a frozen reference in the
compute dtype where it has one (a KL term); gradients and AdamW's states exist, as from the second
micro-batch of a mini-batch on (one step on zero gradients made them); then one micro-batch of
``train.microbatch_tokens`` tokens (rows of one full sequence, packed by the trainer into one sequence) runs
the reference's forward and the trainer's own chunked log-prob forward and backward, and the optimiser steps.  The
worker's peak RSS is compared with ``plan_memory``'s total for the same settings, less the rollout engine's
share (the worker holds no engine).  Prints one JSON object and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/memory_plan.py` from a clone

from bench.common import ROOT, child_env

QWEN25_05B = {
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "max_position_embeddings": 32768, "tie_word_embeddings": True, "rope_theta": 1000000.0,
}  # fmt: skip
"""Qwen2.5-0.5B's shape (its config.json on the Hub), built with random weights."""
QWEN25_15B = QWEN25_05B | {
    "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
}  # fmt: skip
"""Qwen2.5-1.5B's shape."""

SHORT = ["rollout.max_prompt_tokens=64", "rollout.max_response_tokens=128"]  # rows of 192 tokens: eager attention
CONFIGS: dict[str, tuple[str | dict, list[str]]] = {
    "smollm2-135m": ("smollm2-135m", [*SHORT, "train.microbatch_tokens=768"]),
    "smollm2-135m-checkpointing": (
        "smollm2-135m",
        [*SHORT, "train.microbatch_tokens=768", "model.gradient_checkpointing=true"],
    ),
    "qwen2.5-0.5b": (QWEN25_05B, [*SHORT, "train.microbatch_tokens=192"]),
    "qwen2.5-1.5b-lora16": (QWEN25_15B, [*SHORT, "train.microbatch_tokens=192", "model.lora_rank=16"]),
}
"""name -> (model: a spec or a config dict, overrides of the dr_grpo preset, which has no KL term).  Sized
for 2 shared CPU cores (about 10 minutes in all): short token budgets for the larger shapes.  Full
fine-tuning of the 1.5B shape needs 16 bytes per parameter (25 GB) before activations, more than this
24 GiB machine has; it runs with LoRA."""
PRESET = "dr_grpo"


def model_config(model: str | dict):
    """The transformers config of a spec or a config dict (no weights)."""
    from transformers import AutoConfig

    from reasonrl.models.load import model_config as spec_config

    if isinstance(model, dict):
        options = dict(model)
        return AutoConfig.for_model(options.pop("model_type"), **options)
    return spec_config(model)


def settings(name: str):
    """(the run's Config, the model's transformers config) of a configuration."""
    from reasonrl.config import load_config

    model, overrides = CONFIGS[name]
    cfg = load_config(PRESET, [*overrides, "model.device=cpu", "rollout.engine=hf"])
    return cfg, model_config(model)


def worker(name: str) -> dict:
    """One configuration's training step in this (fresh) process: its peak RSS and its plan."""
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl.config import resolve
    from reasonrl.models.load import compute_dtype
    from reasonrl.models.lora import add_lora
    from reasonrl.models.memory_plan import plan_memory
    from reasonrl.models.optim import trainable_parameters
    from reasonrl.training.update.policy import response_logprobs

    cfg, config = settings(name)
    plan = resolve(cfg, "cpu", 1)
    baseline = peak_rss_bytes()
    torch.manual_seed(0)
    dtype = compute_dtype(cfg.model.dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=plan.attention)
    if cfg.model.gradient_checkpointing is True:  # auto plans (capacity unknown here) without it
        model.gradient_checkpointing_enable()
    add_lora(model, cfg.model)
    reference = None
    if plan.uses_reference and not cfg.model.lora_rank:
        reference = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=plan.attention).eval()
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-6)
    for parameter in trainable_parameters(model):  # as after a first micro-batch: gradients accumulate
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # AdamW's states exist from the first step on
    resident = peak_rss_bytes()
    prompt, response = cfg.rollout.max_prompt_tokens, cfg.rollout.max_response_tokens
    rows = plan.microbatch_tokens // (prompt + response)
    prompt_ids = torch.randint(0, config.vocab_size, (rows, prompt))
    response_ids = torch.randint(0, config.vocab_size, (rows, response))
    masks = torch.ones_like(prompt_ids), torch.ones_like(response_ids)
    model.train()
    started = time.perf_counter()
    if reference is not None:
        with torch.no_grad():
            response_logprobs(reference, prompt_ids, masks[0], response_ids, masks[1], compute_dtype=dtype)
    logprobs, _ = response_logprobs(model, prompt_ids, masks[0], response_ids, masks[1], compute_dtype=dtype)
    logprobs.mean().backward()
    optimizer.step()
    predicted = plan_memory(cfg, config, device_type="cpu")
    return {
        "name": name,
        "model": CONFIGS[name][0] if isinstance(CONFIGS[name][0], str) else f"{config.model_type} (config dict)",
        "overrides": CONFIGS[name][1],
        "parameters": predicted.parameters,
        "attention": plan.attention,
        "compute_dtype": str(dtype).removeprefix("torch."),
        "rows_per_microbatch": rows,
        "step_seconds": round(time.perf_counter() - started, 1),
        "baseline_rss_gib": gib(baseline),
        "resident_rss_gib": gib(resident),
        "predicted_gib": gib(predicted.total - predicted.components.get("rollout engine", 0)),
        "measured_gib": gib(peak_rss_bytes()),
        "components_gib": {key: gib(value) for key, value in predicted.components.items()},
    }


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def gib(value: float) -> float:
    return round(value / 2**30, 3)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "memory_plan_cpu.json")
    parser.add_argument("--only", nargs="+", choices=sorted(CONFIGS), help="run these configurations only")
    parser.add_argument("--worker", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return 0
    started = time.perf_counter()
    results = []
    for name in args.only or CONFIGS:
        load_before = load_average()
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
        done = subprocess.run(command, env=child_env(), cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            done.check_returncode()
        result = json.loads(done.stdout.splitlines()[-1])
        result["relative_error"] = round(result["predicted_gib"] / result["measured_gib"] - 1, 3)
        result["load_average_before_after"] = [load_before, load_average()]
        results.append(result)
        print(json.dumps(result), file=sys.stderr)
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "command": "python bench/memory_plan.py",
        "measured": "peak RSS (ru_maxrss) of a fresh process per configuration: model from its config with "
        "random weights, AdamW's states, one optimiser step of two micro-batches",
        "predicted": "plan_memory(...).total less the rollout engine (the worker holds none)",
        "contention": "the 1-minute load average before and after each configuration; another engineer's "
        "tests shared the machine's 2 cores, which changes step_seconds, not memory",
        "max_abs_relative_error": max(abs(r["relative_error"]) for r in results),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "configs": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
