"""LoRA vs full fine-tuning on the main job: seconds per step, peak RSS and held-out accuracy gain.

    python bench/lora_vs_full.py [--arms full lora] [--steps 10] [--rank 16] [--threads 1]
                                 [--out bench/results/lora_vs_full.json] [--runs DIR] [key=value ...]

Both arms run `reasonrl train dapo` as `make demo` does (SmolLM2-135M-Instruct, two-digit addition,
8 prompts x 8 samples, 64-token cap, greedy accuracy on 200 held-out problems before and after),
with the same seed: ``full`` fine-tunes every weight; ``lora`` sets ``model.lora_rank=RANK``
(lora_alpha 32, all linear layers); ``lora_10x_lr`` is LoRA at 10 × the preset's learning rate.
The arms run side by side, each in its own process with ``--threads`` torch threads, started
together, so they see the same machine load (the project machine's CPU is shared); compare the
ratios, not the absolute seconds.  Extra ``key=value`` overrides apply to every arm.  ``--runs DIR``
keeps the run directories (else a temporary directory).

Prints one JSON object (also written to OUT): per arm the median training seconds per step
(evaluation excluded) and per phase, tokens generated and update seconds per 1,000 generated tokens,
peak RSS, accuracy before / after / gain, trainable parameters and the size of the last checkpoint;
and each LoRA arm ÷ full.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
from common import cpu_model

PHASES = {"generate": "perf/generate_seconds", "logprob": "perf/logprob_seconds", "update": "perf/update_seconds"}


def arm_overrides(arm: str, rank: int, steps: int, extra: list[str]) -> list[str]:
    from reasonrl.config import load_config

    lora = [f"model.lora_rank={rank}"] if arm.startswith("lora") else []
    if arm == "lora_10x_lr":
        lora.append(f"train.lr={10 * load_config('dapo', extra).train.lr}")
    return [f"train.rollout_steps={steps}", *lora, *extra]


def trainable_parameters(overrides: list[str]) -> int:
    from reasonrl.config import load_config
    from reasonrl.models.load import load_model
    from reasonrl.models.lora import add_lora

    cfg = load_config("dapo", overrides)
    model = add_lora(load_model(cfg.model.name_or_path), cfg.model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def run_arm(arm: str, overrides: list[str], run_dir: Path, threads: int) -> dict:
    """Train one arm in this process; returns its measurements."""
    import torch

    from reasonrl.config import load_config
    from reasonrl.training.loop import fit
    from reasonrl.training.record.metrics import read_metrics

    torch.set_num_threads(threads)
    started = time.perf_counter()
    cfg = load_config("dapo", overrides)
    summary = fit(cfg, run_dir, preset="dapo", overrides=tuple(overrides), show_progress=False)
    wall = time.perf_counter() - started
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]
    training = [r["perf/step_seconds"] - (r.get("perf/eval_seconds") or 0.0) for r in steps]
    tokens = sum(r["rollout/tokens_generated"] for r in steps)
    checkpoint = max((run_dir / "checkpoints").glob("step-*"))
    return {
        "overrides": overrides,
        "trainable_parameters": trainable_parameters(overrides),
        "seconds_per_step": statistics.median(training),
        "seconds_per_step_first_last": [training[0], training[-1]],
        "phase_seconds": {name: statistics.median(r.get(key, 0.0) for r in steps) for name, key in PHASES.items()},
        "tokens_generated": tokens,
        "update_seconds_per_1k_generated_tokens": 1000 * sum(r["perf/update_seconds"] for r in steps) / tokens,
        "peak_rss_gb": summary["peak_rss_gb"],
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "accuracy_gain": summary["accuracy_after"] - summary["accuracy_before"],
        "wall_seconds": wall,
        "checkpoint_gb": sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file()) / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per arm (the arms run at once)")
    parser.add_argument("--arms", nargs="+", choices=["full", "lora", "lora_10x_lr"], default=["full", "lora"])
    parser.add_argument("--out", type=Path, default=Path("bench/results/lora_vs_full.json"))
    parser.add_argument("--runs", type=Path, help="keep the run directories here")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # a child process runs one arm
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.arm:
        overrides = arm_overrides(args.arm, args.rank, args.steps, args.overrides)
        result = run_arm(args.arm, overrides, args.run_dir, args.threads)
        (args.run_dir.parent / f"{args.arm}.json").write_text(json.dumps(result))
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.runs or Path(scratch)
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        settings = ["--steps", str(args.steps), "--rank", str(args.rank), "--threads", str(args.threads)]
        children = {
            arm: subprocess.Popen(
                [sys.executable, __file__, "--arm", arm, "--run-dir", f"{tmp}/{arm}", *settings, *args.overrides],
                env=env,
            )
            for arm in args.arms
        }
        for arm, child in children.items():
            if child.wait():
                raise SystemExit(f"the {arm} arm failed (exit status {child.returncode})")
        arms = {arm: json.loads(Path(tmp, f"{arm}.json").read_text()) for arm in children}
    full = arms["full"]
    result = {
        "task": "reasonrl train dapo (the main job): smollm2-135m, arithmetic, 8 x 8 samples, 200 held-out prompts",
        "steps": args.steps,
        "lora_rank": args.rank,
        "threads_per_arm": args.threads,
        "cpu": cpu_model(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "arms": arms,
        "over_full": {arm: _ratios(arms[arm], full) for arm in arms if arm != "full"},
        "accuracy_gain_points": {arm: 100 * arms[arm]["accuracy_gain"] for arm in arms},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def _ratios(arm: dict, full: dict) -> dict[str, float]:
    """An arm's measurements ÷ full fine-tuning's."""
    per_token = "update_seconds_per_1k_generated_tokens"
    return {
        "seconds_per_step": arm["seconds_per_step"] / full["seconds_per_step"],
        "update_seconds": arm["phase_seconds"]["update"] / full["phase_seconds"]["update"],
        per_token: arm[per_token] / full[per_token],
        "peak_rss": arm["peak_rss_gb"] / full["peak_rss_gb"],
        "trainable_parameters": arm["trainable_parameters"] / full["trainable_parameters"],
        "checkpoint_size": arm["checkpoint_gb"] / full["checkpoint_gb"],
    }


if __name__ == "__main__":
    main()
