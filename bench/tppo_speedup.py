"""T-PPO's speed-up: truncated rollouts vs synchronous rollouts, wall-clock time to the same accuracy.

    python bench/tppo_speedup.py [--steps 12] [--seed 0] [--model smollm2-135m] [--out bench/results]

Both runs train SmolLM2-135M-Instruct on the embedded arithmetic task, whose responses are
long-tailed at a 192-token cap (most answers take 10-40 tokens, a few ramble to the cap), with the
same prompts, seed, cap, group sampling (8 prompts x 8 samples) and PPO settings: the `t_ppo`
preset, and the same preset made synchronous (algo.window_tokens=null, advantage_estimator=gae),
i.e. VAPO's PPO settings without NLL or value warm-up, exactly as T-PPO uses them.  The only
difference is the rollout: a 64-token window per step with successive batching, or every response
run to its end.  Each run is its own process.  Held-out greedy accuracy (200 prompts) is measured
before training and every ``--eval-every`` steps; the training clock excludes evaluation.

Prints one JSON object (also OUT/tppo_speedup.json):
  speedup_time_to_accuracy   synchronous seconds ÷ T-PPO seconds to first reach the target accuracy,
                             the lower of the two runs' best held-out accuracies
  speedup_per_step           synchronous ÷ T-PPO median training seconds per step
  runs.<name>                curve, generation tokens per second, share of generation decode steps
                             with an idle slot, share of step time spent generating, lengths
OUT/tppo_speedup.png draws held-out accuracy against training wall-clock for both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RUNS = {
    "t_ppo": [],
    "synchronous": ["algo.window_tokens=null", "algo.advantage_estimator=gae"],
}


def run_one(name: str, seed: int, steps: int, eval_every: int, model: str, run_dir: Path) -> dict:
    """Train one configuration in this process; returns its curve and rollout statistics."""
    from reasonrl.config import load_config
    from reasonrl.train.loop import fit
    from reasonrl.train.metrics import read_metrics

    overrides = [
        f"model.name_or_path={model}",
        f"train.rollout_steps={steps}",
        f"run.seed={seed}",
        f"run.eval_every={eval_every}",
        *RUNS[name],
    ]
    cfg = load_config("t_ppo", overrides)
    summary = fit(cfg, run_dir, preset=name, overrides=tuple(overrides), show_progress=False)
    records = read_metrics(run_dir / "metrics.jsonl")
    clock, curve = 0.0, [[0.0, 0, records[0]["eval/accuracy"]]]
    steps_seconds, generate, tokens, underfull = [], [], [], []
    for r in records[1:]:
        train_seconds = r["perf/step_seconds"] - (r.get("perf/eval_seconds") or 0.0)
        clock += train_seconds
        steps_seconds.append(train_seconds)
        generate.append(r["perf/generate_seconds"])
        tokens.append(r["rollout/tokens_generated"])
        underfull.append(r["rollout/underfull_step_fraction"])
        if r.get("eval/accuracy") is not None:
            curve.append([clock, r["step"], r["eval/accuracy"]])
    lengths = [r.get("rollout/response_length_max") for r in records[1:]]
    return {
        "name": name,
        "overrides": overrides,
        "accuracy_curve": curve,  # [training seconds, step, held-out accuracy]
        "train_seconds": clock,
        "median_step_seconds": statistics.median(steps_seconds),
        "generation_tokens_per_second": sum(tokens) / sum(generate),
        "train_tokens_per_second": sum(tokens) / clock,
        "generate_time_share": sum(generate) / clock,
        "underfull_step_fraction": sum(u * g for u, g in zip(underfull, generate, strict=True)) / sum(generate),
        "response_length_max_per_step": lengths,
        "train_reward": [r.get("reward/mean") for r in records[1:]],
        **{k: summary.get(k) for k in ("accuracy_before", "accuracy_after", "wall_seconds", "peak_rss_gb")},
    }


def time_to(curve: list[list[float]], target: float) -> float | None:
    """Training seconds at the first evaluation reaching ``target`` (None if never)."""
    return next((seconds for seconds, _, accuracy in curve if accuracy >= target), None)


def plot(runs: dict[str, dict], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (name, run), colour in zip(runs.items(), ("tab:red", "tab:grey"), strict=True):
        seconds, _, accuracy = zip(*run["accuracy_curve"], strict=True)
        ax.plot([s / 60 for s in seconds], accuracy, marker="o", color=colour, label=name)
    ax.axhline(target, color="black", lw=0.8, ls="--", label=f"target {target:.1%}")
    ax.set(xlabel="training wall-clock (minutes, evaluation excluded)", ylabel="held-out accuracy (greedy, 200)")
    ax.set_title("T-PPO vs synchronous rollouts, arithmetic, 192-token cap (SmolLM2-135M, 2 CPU cores)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--runs", type=Path, default=Path("runs/tppo_speedup"))
    parser.add_argument("--worker", choices=RUNS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = run_one(args.worker, args.seed, args.steps, args.eval_every, args.model, args.runs / args.worker)
        print(json.dumps(result))
        return
    runs = {}
    for name in RUNS:  # one process per run: each starts from the same clean state
        command = [sys.executable, __file__, "--worker", name, "--steps", str(args.steps), "--seed", str(args.seed)]
        command += ["--eval-every", str(args.eval_every), "--model", args.model, "--runs", str(args.runs)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        runs[name] = json.loads(output.strip().splitlines()[-1])
        print(f"{name}: {runs[name]['accuracy_after']:.3f} in {runs[name]['train_seconds']:.0f} s", file=sys.stderr)
    target = min(max(a for _, _, a in run["accuracy_curve"][1:]) for run in runs.values())
    reached = {name: time_to(run["accuracy_curve"][1:], target) for name, run in runs.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    plot(runs, target, args.out / "tppo_speedup.png")
    sync, tppo = runs["synchronous"], runs["t_ppo"]
    result = {
        "task": "arithmetic (embedded), 192-token cap, 200 held-out prompts, greedy",
        "model": args.model,
        "rl_steps": args.steps,
        "seed": args.seed,
        "target_accuracy": target,
        "seconds_to_target": reached,
        "speedup_time_to_accuracy": reached["synchronous"] / reached["t_ppo"],
        "speedup_per_step": sync["median_step_seconds"] / tppo["median_step_seconds"],
        "generation_tokens_per_second": {n: r["generation_tokens_per_second"] for n, r in runs.items()},
        "underfull_step_fraction": {n: r["underfull_step_fraction"] for n, r in runs.items()},
        "generate_time_share": {n: r["generate_time_share"] for n, r in runs.items()},
        "plot": str(args.out / "tppo_speedup.png"),
        "runs": runs,
    }
    (args.out / "tppo_speedup.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
