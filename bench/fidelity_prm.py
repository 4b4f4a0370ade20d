"""Process rewards for code (arXiv 2410.17621): label, train the PRM, then prm_ppo vs outcome-only ppo (JSON + PNG).

    python bench/fidelity_prm.py [--profile cpu|smoke] [--seeds 0 1] [--steps 10] [--out bench/results]

Stages, each in its own process and cached under ``--work`` (default runs/fidelity-prm-PROFILE; a killed
benchmark started again continues where it stopped):
  base    greedy pass@1 of the initial model on every evaluation set (``reasonrl eval --records``);
  label   ``reasonrl prm label`` on the training split (resumable itself): programs, line labels, the
          completions spent against exhaustive labelling, sandbox seconds;
  prm     ``reasonrl rm train --kind prm``: the PRM's held-out line accuracy and AUC before and after;
  runs    per seed, ``ppo`` (the unit-test outcome only) and ``prm_ppo`` (outcome + dense PRM line rewards,
          critic from the PRM), the same prompts, batch and RL steps; the mechanism the paper names is
          logged every step: ``reward/all_failed_prompts_with_signal``, the share of prompts whose samples
          all fail yet whose samples' rewards still differ (outcome-only rewards give them none);
  eval    every final model's greedy pass@1 on the evaluation sets, and split by response length.
Results: mean ± standard error over seeds in OUT/fidelity_prm_PROFILE.json and .png.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when this file is imported
from common import cached, mean_se, reasonrl, seeded_bench_arguments, write_result

ARMS = ("ppo", "prm_ppo")
LENGTH_BUCKETS = (0, 64, 128, 10**9)  # response tokens: short, medium, long
PROFILES = {
    # the test suite: tiny-random, a handful of tokens, one step
    "smoke": {
        "model": "tiny-random",
        "dataset": "functions",
        "label": ["--limit", "2", "--programs-per-prompt", "2", "--completions", "2", "--max-new-tokens", "24"],
        "prm": ["--steps", "2", "--batch-pairs", "2", "--max-response-tokens", "32"],
        "train": ["model.dtype=float32", "rollout.rollout_prompts=2", "rollout.samples_per_prompt=2",
                  "rollout.max_response_tokens=24", "rollout.max_prompt_tokens=2048", "train.minibatch_sequences=4",
                  "data.eval_prompts=2", "reward.workers=1"],
        "eval": {"functions": 2},
        "max_new_tokens": 24,
    },
    # this machine (2 CPU cores): SmolLM2-135M-Instruct on the generated functions task; K = 8 completions per
    # probe (the paper's 20 scaled to the CPU), 8 prompts x 2 programs per RL step
    "cpu": {
        "model": "smollm2-135m",
        "dataset": "functions",
        "label": ["--limit", "64", "--programs-per-prompt", "4", "--completions", "8", "--max-new-tokens", "128"],
        "prm": ["--steps", "100", "--batch-pairs", "8", "--max-response-tokens", "128"],
        "train": ["rollout.rollout_prompts=8", "rollout.samples_per_prompt=2", "rollout.max_response_tokens=128",
                  "train.minibatch_sequences=8", "data.eval_prompts=64"],
        "eval": {"functions": 100, "mbpp": 100, "humaneval": 164},
        "max_new_tokens": 128,
    },
}  # fmt: skip


def evaluate(model: str, profile: dict, work: Path, name: str) -> dict:
    """Greedy pass@1 per evaluation set, and per response-length bucket over all of them."""
    results, records = {}, []
    for dataset, limit in profile["eval"].items():
        path = work / "records" / f"{name}-{dataset}.jsonl"
        arguments = ["--dataset", dataset, "--limit", str(limit), "--max-new-tokens", str(profile["max_new_tokens"])]
        metrics = json.loads(reasonrl("eval", "--model", model, *arguments, "--records", str(path)))
        results[dataset] = metrics["greedy_pass@1"]
        records += [json.loads(line) for line in path.read_text().splitlines()]
    by_length = {}
    for low, high in itertools.pairwise(LENGTH_BUCKETS):
        bucket = [r["correct"] for r in records if low <= r["response_tokens"] < high]
        by_length[f"{low}-{high if high < 10**9 else 'cap'}"] = {
            "n": len(bucket),
            "pass@1": sum(bucket) / len(bucket) if bucket else None,
        }
    return {"pass@1": results, "pass@1_by_length": by_length}


def label_and_train_prm(profile: dict, work: Path) -> tuple[dict, dict]:
    """The labelling run's summary and the PRM's (both cached)."""
    labels = work / "labels.jsonl"
    label = cached(work / "results" / "label.json", lambda: json.loads(reasonrl(
        "prm", "label", "--model", profile["model"], "--dataset", profile["dataset"], "--split", "train",
        *profile["label"], "--out", str(labels), "--quiet", *profile["train"],
    )))  # fmt: skip
    prm = cached(work / "results" / "prm.json", lambda: json.loads(reasonrl(
        "rm", "train", "--kind", "prm", "--model", profile["model"], "--data", str(labels),
        "--out", str(work / "prm"), *profile["prm"],
    )))  # fmt: skip
    return label, prm


def run(arm: str, seed: int, steps: int, profile: dict, work: Path) -> dict:
    """One RL run (outcome-only ppo or prm_ppo) and its evaluation (cached)."""

    def produce() -> dict:
        run_dir = work / "runs" / f"{arm}-seed{seed}"
        reasonrl("train", arm, f"model.name_or_path={profile['model']}", f"data.dataset={profile['dataset']}",
                 *profile["train"], f"train.rollout_steps={steps}", f"run.seed={seed}", f"run.eval_every={steps}",
                 f"reward.prm_path={work / 'prm'}", f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
                 "run.loggers=[]", "--quiet")  # fmt: skip
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        steps_done = [r for r in records if r.get("step", 0) >= 1]
        keys = ("reward/accuracy", "reward/all_failed_prompts", "reward/all_failed_prompts_with_signal",
                "reward/prm_dense_mean", "rollout/response_length")  # fmt: skip
        summary = json.loads((run_dir / "summary.json").read_text())
        return {
            "arm": arm,
            "seed": seed,
            "accuracy_before": summary["accuracy_before"],
            "accuracy_after": summary["accuracy_after"],
            "train_metrics": {k: [r.get(k) for r in steps_done] for k in keys},
            "eval": evaluate(str(run_dir), profile, work, f"{arm}-seed{seed}"),
        }

    return cached(work / "results" / f"{arm}-seed{seed}.json", produce)


def arm_summary(arm: str, runs: dict, seeds: list[int], datasets: list[str]) -> dict:
    """Mean ± SE over seeds of an arm's pass@1 per evaluation set and of its per-run mean share of
    all-failed prompts that still got a signal."""

    def signal(seed: int) -> float | None:
        values = [v for v in runs[arm, seed]["train_metrics"]["reward/all_failed_prompts_with_signal"] if v is not None]
        return statistics.fmean(values) if values else None

    return {
        "pass@1": {d: mean_se([runs[arm, s]["eval"]["pass@1"][d] for s in seeds]) for d in datasets},
        "all_failed_prompts_with_signal": mean_se([signal(s) for s in seeds]),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(result["base"]["pass@1"])
    fig, axes = plt.subplots(1, len(datasets) + 1, figsize=(3.4 * (len(datasets) + 1), 3.2))
    for ax, dataset in zip(axes, datasets, strict=False):
        names = ["base", *ARMS]
        means = [result["base"]["pass@1"][dataset]] + [result["arms"][a]["pass@1"][dataset]["mean"] or 0 for a in ARMS]
        errors = [0.0] + [result["arms"][a]["pass@1"][dataset]["se"] or 0.0 for a in ARMS]
        ax.bar(names, means, yerr=errors, color=["grey", "C0", "C1"])
        ax.set_title(f"{dataset}: greedy pass@1")
    signal = [result["arms"][a]["all_failed_prompts_with_signal"]["mean"] or 0 for a in ARMS]
    axes[-1].bar(list(ARMS), signal, color=["C0", "C1"])
    axes[-1].set_title("all-failed prompts with a signal")
    fig.suptitle(f"prm_ppo vs ppo ({result['profile']}; mean ± SE over {len(result['seeds'])} seeds)")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    args = seeded_bench_arguments(__doc__.splitlines()[0], PROFILES, "fidelity-prm", argv)
    profile = PROFILES[args.profile]
    work = args.work
    base = cached(work / "results" / "base.json", lambda: evaluate(profile["model"], profile, work, "base"))
    label, prm = label_and_train_prm(profile, work)
    runs = {(a, s): run(a, s, args.steps, profile, work) for s in args.seeds for a in ARMS}
    datasets = list(profile["eval"])
    result = {
        "profile": args.profile,
        "command": " ".join(["python bench/fidelity_prm.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": profile["model"],
        "dataset": profile["dataset"],
        "steps": args.steps,
        "seeds": args.seeds,
        "base": base,
        "labelling": label,
        "prm": prm,
        "arms": {arm: arm_summary(arm, runs, args.seeds, datasets) for arm in ARMS},
        "runs": {f"{a}-seed{s}": r for (a, s), r in runs.items()},
    }
    write_result(args.out, f"fidelity_prm_{args.profile}", result, plot, ("base", "labelling", "prm", "arms"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
