"""Fidelity of the value-based family: ppo vs vc_ppo vs vapo on one task, budget and seed set.

    python bench/fidelity_value.py [--steps 10] [--seeds 0] [--model smollm2-135m] [--out bench/results]

Each (preset, seed) trains in its own process on the embedded arithmetic task with the preset's
run settings (VAPO: 8 prompts x 8 samples; PPO / VC-PPO: 64 prompts x 1 — the same 64 responses
per step) for the same number of RL steps; VC-PPO and VAPO first pretrain their critic as their
presets say.  Held-out greedy accuracy on the same 200 eval prompts is measured before training,
every 5 steps and at the end.  Prints one JSON object (also written to OUT/fidelity_value.json):
``final_accuracy`` maps preset -> mean final accuracy over seeds; ``runs`` has each run's curve,
wall time and value-pretraining summary.  OUT/fidelity_value.png draws the curves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

PRESETS = ("ppo", "vc_ppo", "vapo")  # the papers' order, weakest first


def run_one(preset: str, seed: int, steps: int, model: str, run_dir: Path) -> dict:
    """Train one preset in this process; returns its summary and held-out accuracy curve."""
    from reasonrl.config import load_config
    from reasonrl.train.loop import fit
    from reasonrl.train.metrics import read_metrics

    overrides = [f"model.name_or_path={model}", f"train.rollout_steps={steps}", f"run.seed={seed}", "run.eval_every=5"]
    cfg = load_config(preset, overrides)
    summary = fit(cfg, run_dir, preset=preset, overrides=tuple(overrides), show_progress=False)
    records = read_metrics(run_dir / "metrics.jsonl")
    curve = [[r["step"], r["eval/accuracy"]] for r in records if r.get("eval/accuracy") is not None]
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    critic_ev = [r.get("critic/explained_variance") for r in records if "reward/mean" in r]
    return {
        "preset": preset,
        "seed": seed,
        "accuracy_curve": curve,
        "train_reward": rewards,
        "critic_explained_variance": critic_ev,
        **{k: summary.get(k) for k in ("accuracy_before", "accuracy_after", "wall_seconds", "peak_rss_gb")},
        **{k: v for k, v in summary.items() if k.startswith("value_pretrain")},
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, reward) = plt.subplots(1, 2, figsize=(11, 4))
    colours = dict(zip(PRESETS, ("tab:grey", "tab:blue", "tab:red"), strict=True))
    for run in runs:
        label, colour = f"{run['preset']} (seed {run['seed']})", colours[run["preset"]]
        steps, values = zip(*run["accuracy_curve"], strict=True)
        acc.plot(steps, values, marker="o", color=colour, label=label)
        reward.plot(range(1, len(run["train_reward"]) + 1), run["train_reward"], color=colour, label=label)
    acc.set(title="held-out accuracy (greedy, 200 prompts)", xlabel="RL step")
    reward.set(title="training reward (rollout mean)", xlabel="RL step")
    for ax in (acc, reward):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("value-based family on the arithmetic task (SmolLM2-135M-Instruct)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--runs", type=Path, default=Path("runs/fidelity_value"))
    parser.add_argument("--worker", nargs=2, metavar=("PRESET", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        preset, seed = args.worker[0], int(args.worker[1])
        print(json.dumps(run_one(preset, seed, args.steps, args.model, args.runs / f"{preset}-seed{seed}")))
        return
    runs = []
    for seed in args.seeds:
        for preset in args.presets:  # one process per run: each starts from the same clean state
            command = [sys.executable, __file__, "--worker", preset, str(seed), "--steps", str(args.steps)]
            command += ["--model", args.model, "--runs", str(args.runs)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(output.strip().splitlines()[-1]))
            print(f"{preset} seed {seed}: {runs[-1]['accuracy_after']:.3f}", file=sys.stderr, flush=True)
    final = {p: sum(r["accuracy_after"] for r in runs if r["preset"] == p) / len(args.seeds) for p in args.presets}
    args.out.mkdir(parents=True, exist_ok=True)
    plot(runs, args.out / "fidelity_value.png")
    result = {
        "task": "arithmetic (embedded), 200 held-out prompts, greedy",
        "model": args.model,
        "rl_steps": args.steps,
        "seeds": args.seeds,
        "final_accuracy": final,
        "accuracy_before": sum(r["accuracy_before"] for r in runs) / len(runs),
        "paper_order_holds": final.get("vapo", 0) > final.get("vc_ppo", 0) > final.get("ppo", 0),
        "plot": str(args.out / "fidelity_value.png"),
        "runs": runs,
    }
    (args.out / "fidelity_value.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
