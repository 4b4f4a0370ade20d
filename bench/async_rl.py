"""Synchronous vs asynchronous rollouts (rollout.max_staleness) vs T-PPO on the main job's task.

    python bench/async_rl.py [--profile main|generation_heavy|slow_engine|gpu] [--smoke] [--variants sync async1 ...]
                             [--seeds 0 1 2] [--out bench/results/async_rl_PROFILE.json]

Each (variant, seed) is one `reasonrl train` run in its own process, as a user runs it (the main job: the
dapo preset with its defaults; the other profiles add ``PROFILES``' overrides). Read from its metrics file:
seconds per step (median of ``perf/step_seconds``), the engine's idle time per step (synchronous: the step's
time outside generation, scoring and evaluation, when the engine waits for the trainer; asynchronous: the
producer's wait for a fresh enough version, ``perf/producer_idle_seconds``), the run's wall time, its
held-out accuracy after each evaluation, the final accuracy, and the time to reach the synchronous run's
final accuracy (same seed): the summed step times up to the first evaluation at or above it (null when
never reached). Each run's metrics file is kept beside OUT (``<OUT stem>_VARIANT_seedN_metrics.jsonl``).
Writes one JSON object (its runs and summary printed too) with a summary per variant (mean ± SE over seeds) and
a plot beside it (held-out accuracy against the seconds of steps; seconds per step).

    python bench/async_rl.py --report bench/results/async_rl_main*.json --out bench/results/async_rl_main_summary.json

merges the runs of earlier invocations (one per (variant, seed); a run with an error, or one recorded again
later, counts once: the last complete one) into one result and plot, without running anything.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, child_env, mean_se, write_result

VARIANTS = {
    "sync": ("dapo", []),
    "async1": ("dapo", ["rollout.max_staleness=1"]),
    "async2": ("dapo", ["rollout.max_staleness=2"]),
    "async1_partial": ("dapo", ["rollout.max_staleness=1", "rollout.partial_rollouts=true"]),
    "t_ppo": ("t_ppo", []),  # T-PPO's own preset (critic, EGAE) on the same task: its algorithm, not dapo's
    "t_ppo_async1": ("t_ppo", ["rollout.max_staleness=1"]),  # the two composed
}
PROFILES = {
    "main": [],
    # word problems answered at length (GSM8K, 256-token cap) where the arithmetic answers are 13-35 tokens;
    # the base model rarely solves them, so dynamic sampling is off and this profile measures time, not accuracy
    "generation_heavy": ["data.dataset=gsm8k", "rollout.max_response_tokens=256", "algo.dynamic_sampling=false"],
    # the main job generating with transformers' generate (about 5x slower than the fast engine on this CPU):
    # generation becomes over half of a synchronous step, the regime of long answers on a GPU
    "slow_engine": ["rollout.engine=hf"],
    # time on one GPU, not accuracy: a random-weight model (``RANDOM_MODELS``) generating with transformers'
    # generate (vLLM where installed); it rarely emits its end token, so answers run long-tailed to the cap
    # (a reward that varies with the answer's length, as a random model solves nothing: every step updates)
    "gpu": ["model.device=cuda", "rollout.max_response_tokens=512", "algo.dynamic_sampling=false",
            "data.eval_prompts=8", "run.eval_every=1000", "reward.functions=[bench/rewards.py:response_length]"],
}  # fmt: skip
# Profiles that train a random-weight model built from a published config (bench/train_side.py's SHAPES) with
# reasonrl's byte-level test tokenizer: the embedded model's weights cannot travel to a GPU machine.
RANDOM_MODELS = {"gpu": "qwen2.5-1.5b"}


def gpu_prefix() -> str:
    """The CUDA device's name (bench/gpu_step.py's) and ", ", or "" on a machine without one."""
    import torch
    from gpu_step import device_description

    return f"{device_description('cuda')['device']}, " if torch.cuda.is_available() else ""


def build_random_model(shape: str, out: Path, smoke: bool, real_vocabulary: bool = False) -> Path:
    """SHAPE's architecture with random weights (bfloat16) and the byte-level tokenizer, saved in OUT;
    ``smoke``: the same family at bench/train_side.py's tiny size.  The vocabulary is the tokenizer's, or with
    ``real_vocabulary`` the shape's own (its LM head costs what the real model's does; generation must then be
    kept to the tokenizer's ids, as bench/gpu_rl_step.py's stop schedule keeps it)."""
    import torch
    from train_side import model_config
    from transformers import AutoModelForCausalLM

    from reasonrl.models.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = model_config(shape, smoke)
    if not real_vocabulary:
        config.vocab_size = len(tokenizer)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def run_once(variant: str, seed: int, profile: str, extra: list[str], keep: Path) -> dict:
    """One run; its metrics file is kept as KEEP (for what the summary does not show)."""
    preset, overrides = VARIANTS[variant]
    with tempfile.TemporaryDirectory() as tmp:
        settings = [*overrides, *PROFILES[profile], *extra, f"run.seed={seed}", f"run.output_dir={tmp}", "run.name=r"]
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "reasonrl", "train", preset, *settings], capture_output=True,
                              text=True, cwd=ROOT, env=child_env())  # fmt: skip
        wall = time.perf_counter() - started
        if done.returncode:
            return {"variant": variant, "seed": seed, "error": done.stderr[-1500:]}
        text = (Path(tmp) / "r" / "metrics.jsonl").read_text()
        keep.write_text(text)
        records = [json.loads(line) for line in text.splitlines()]
    steps = [r for r in records if r["step"] > 0 and "perf/step_seconds" in r]
    elapsed, evaluations = 0.0, [{"step": 0, "seconds": 0.0, "accuracy": records[0].get("eval/accuracy")}]
    for r in steps:
        elapsed += r["perf/step_seconds"]
        if "eval/accuracy" in r:
            evaluations.append({"step": r["step"], "seconds": elapsed, "accuracy": r["eval/accuracy"]})
    idle = [
        r["perf/producer_idle_seconds"]
        if "perf/producer_idle_seconds" in r
        else r["perf/step_seconds"] - sum(r.get(f"perf/{k}_seconds", 0) for k in ("generate", "score", "eval"))
        for r in steps
    ]
    return {
        "variant": variant,
        "seed": seed,
        "command": " ".join(["reasonrl", "train", preset, *settings[:-2]]),
        "wall_seconds": wall,
        "step_seconds_median": statistics.median(r["perf/step_seconds"] for r in steps),
        "generate_seconds_median": statistics.median(r.get("perf/generate_seconds", 0) for r in steps),
        "update_seconds_median": statistics.median(r.get("perf/update_seconds", 0) for r in steps),
        "engine_idle_seconds_median": statistics.median(idle),
        "staleness_mean": statistics.fmean(r.get("rollout/staleness_mean", 0) for r in steps),
        "reprefill_tokens_median": statistics.median(r.get("rollout/reprefill_tokens", 0) for r in steps),
        "evaluations": evaluations,
        "final_accuracy": evaluations[-1]["accuracy"],
    }


def time_to(run: dict, target: float) -> float | None:
    return next((e["seconds"] for e in run.get("evaluations", []) if e["accuracy"] >= target), None)


SUMMARISED = ("step_seconds_median", "generate_seconds_median", "update_seconds_median", "engine_idle_seconds_median",
              "wall_seconds", "final_accuracy", "seconds_to_sync_final_accuracy")  # fmt: skip


def summarise(result: dict) -> dict:
    """``result`` with each run's time to its seed's synchronous final accuracy, and per variant the mean ±
    SE over seeds of ``SUMMARISED`` (the variants' runs without an error)."""
    runs = [r for r in result["runs"] if "error" not in r]
    for run in runs:
        sync = next((r for r in runs if r["variant"] == "sync" and r["seed"] == run["seed"]), None)
        run["seconds_to_sync_final_accuracy"] = time_to(run, sync["final_accuracy"]) if sync else None
    variants = sorted({r["variant"] for r in runs}, key=list(VARIANTS).index)
    result["summary"] = {
        variant: {
            "seeds": [r["seed"] for r in runs if r["variant"] == variant],
            **{key: mean_se([r.get(key) for r in runs if r["variant"] == variant]) for key in SUMMARISED},
        }
        for variant in variants
    }
    return result


def merged(paths: list[Path]) -> dict:
    """The runs of several results files, one per (variant, seed): the last complete one."""
    results = [json.loads(path.read_text()) for path in paths]
    runs: dict[tuple[str, int], dict] = {}
    for result in results:
        for run in result["runs"]:
            if "error" not in run or (run["variant"], run["seed"]) not in runs:
                runs[run["variant"], run["seed"]] = run
    return {
        "dates": sorted({d for r in results for d in r.get("dates", [r.get("date")])}),  # a summary merged again too
        "sources": [str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path) for path in paths],
        "machines": sorted({m for r in results for m in r.get("machines", [r.get("machine")])}),
        "profile": results[0]["profile"],
        "runs": sorted(runs.values(), key=lambda r: (r["seed"], list(VARIANTS).index(r["variant"]))),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve_ax, step_ax) = plt.subplots(1, 2, figsize=(11, 4))
    colours = dict(zip(VARIANTS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for run in (r for r in result["runs"] if "error" not in r):
        evaluations = run["evaluations"]
        curve_ax.plot([e["seconds"] for e in evaluations], [e["accuracy"] for e in evaluations], marker=".",
                      color=colours[run["variant"]], label=f"{run['variant']} seed {run['seed']}")  # fmt: skip
    curve_ax.set(xlabel="seconds of training steps", ylabel="held-out accuracy",
                 title=f"{result['profile']}: accuracy against time")  # fmt: skip
    curve_ax.legend(fontsize=7)
    names = list(result["summary"])
    for i, name in enumerate(names):
        summary = result["summary"][name]["step_seconds_median"]
        step_ax.bar(i, summary["mean"], yerr=summary["se"] or 0.0, color=colours[name])
        step_ax.plot([i] * len(summary["values"]), summary["values"], "k.")
    step_ax.set_xticks(range(len(names)), names)
    step_ax.set(ylabel="seconds per step (median of a run)", title="seconds per step: mean ± SE, dots: seeds")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="main")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path, nargs="+", metavar="RESULT", help="merge these results; run nothing")
    parser.add_argument("--smoke", action="store_true", help="a profile's random-weight model at a tiny size")
    parser.add_argument("overrides", nargs="*", help="settings added to every run (e.g. train.rollout_steps=4)")
    args = parser.parse_args(argv)
    if args.report:
        result = merged(args.report)
        out = args.out or ROOT / "bench" / "results" / f"async_rl_{result['profile']}_summary.json"
        write_result(out.parent, out.stem, summarise(result), plot, shown=("summary",))
        return 0
    out = args.out or ROOT / "bench" / "results" / f"async_rl_{args.profile}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python", "bench/async_rl.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{gpu_prefix()}{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "profile": args.profile,
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as models:
        overrides = args.overrides
        if args.profile in RANDOM_MODELS:
            result["model"] = f"random weights, {RANDOM_MODELS[args.profile]}'s config{' (smoke size)' * args.smoke}"
            built = build_random_model(RANDOM_MODELS[args.profile], Path(models) / "model", args.smoke)
            overrides = [f"model.name_or_path={built}", *overrides]
        for seed in args.seeds:
            for variant in args.variants:
                keep = out.with_name(f"{out.stem}_{variant}_seed{seed}_metrics.jsonl")
                result["runs"].append(run_once(variant, seed, args.profile, overrides, keep))
                out.write_text(json.dumps(result, indent=2) + "\n")  # partial results survive a stop
    write_result(out.parent, out.stem, summarise(result), plot, shown=("runs", "summary"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
