"""Offline RL from one sampled dataset: DQO vs DPO vs the base model, DQO without importance weights, and
online GRPO on the same task for scale (arXiv 2410.09302's comparison; JSON + PNG).

    python bench/fidelity_offline.py [--profile cpu|smoke] [--seeds 0 1] [--steps 40] [--out bench/results]

Stages, each in its own process and cached under ``--work`` (default runs/fidelity-offline-PROFILE; a
killed benchmark started again continues where it stopped):
  sample  ``reasonrl data sample``: n responses to each of the first N training prompts from the embedded
          model, scored, with behaviour log-probs (resumable itself);
  runs    per seed: ``dpo`` (the file's correct-vs-wrong pairs), ``dqo`` and ``dqo_no_weights``
          (``algo.dqo_importance_weights=false``, the paper's ablation), the same file, the same number
          of update steps of the same size; and ``grpo`` online, with as many sampled responses in total
          as the offline file holds.  Each run's held-out greedy accuracy before and after training.
Results: mean ± standard error over seeds in OUT/fidelity_offline_PROFILE.json and .png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when this file is imported
from common import cached, mean_se, reasonrl, seeded_bench_arguments, write_result

OFFLINE_ARMS = {
    "dpo": ("dpo", []),
    "dqo": ("dqo", []),
    "dqo_no_weights": ("dqo", ["algo.dqo_importance_weights=false"]),
}
ARMS = (*OFFLINE_ARMS, "grpo")
PROFILES = {
    # the test suite: tiny-random, a few tokens, one step
    "smoke": {
        "model": "tiny-random",
        "dataset": "arithmetic",
        "sample": ["--limit", "4", "--samples-per-prompt", "2", "--max-new-tokens", "8"],
        "train": ["model.dtype=float32", "rollout.max_response_tokens=8", "train.minibatch_sequences=4",
                  "data.eval_prompts=2", "reward.workers=1"],
        "grpo": ["rollout.rollout_prompts=2", "rollout.samples_per_prompt=2"],
        "grpo_steps": 2,  # 2 x 4 responses: the 8 of the offline file
    },
    # this machine (2 CPU cores): SmolLM2-135M-Instruct on two-digit arithmetic, 128 prompts x 16 responses
    # (at temperature 1 it answers 2.5% right: 4 responses per prompt gave DPO 13 pairs in all)
    "cpu": {
        "model": "smollm2-135m",
        "dataset": "arithmetic",
        "sample": ["--limit", "128", "--samples-per-prompt", "16", "--max-new-tokens", "64"],
        "train": ["rollout.max_response_tokens=64", "train.minibatch_sequences=32", "data.eval_prompts=200"],
        "grpo": ["rollout.rollout_prompts=8", "rollout.samples_per_prompt=16", "train.minibatch_sequences=32"],
        "grpo_steps": 16,  # 16 x 128 responses: the 2048 of the offline file
    },
}  # fmt: skip


def run(arm: str, seed: int, steps: int, profile: dict, work: Path) -> dict:
    """One training run and its held-out accuracy (cached)."""

    def produce() -> dict:
        run_dir = work / "runs" / f"{arm}-seed{seed}"
        common = [f"model.name_or_path={profile['model']}", f"data.dataset={profile['dataset']}", *profile["train"],
                  f"run.seed={seed}", f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
                  "run.loggers=[]"]  # fmt: skip
        if arm == "grpo":  # online, sampling as many responses in all as the offline file holds
            preset, steps_of_arm, extra = "grpo", profile["grpo_steps"], profile["grpo"]
        else:
            (preset, extra), steps_of_arm = OFFLINE_ARMS[arm], steps
            extra = [f"data.offline_path={work / 'samples.jsonl'}", *extra]
        schedule = [f"train.rollout_steps={steps_of_arm}", f"run.eval_every={steps_of_arm}"]
        reasonrl("train", preset, *common, *extra, *schedule, "--quiet")
        summary = json.loads((run_dir / "summary.json").read_text())
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        keys = ("reward/margin", "reward/pairwise_accuracy", "loss/dpo", "loss/dqo_q", "critic/value_loss",
                "dqo/weight_mean", "policy/logratio_ref", "reward/accuracy")  # fmt: skip
        return {
            "seed": seed,
            "accuracy_before": summary["accuracy_before"],
            "accuracy_after": summary["accuracy_after"],
            "wall_seconds": summary["wall_seconds"],
            "train_metrics": {k: [r.get(k) for r in records if r["step"] >= 1] for k in keys},
        }

    return cached(work / "results" / f"{arm}-seed{seed}.json", produce)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    names = ["base", *ARMS]
    means = [result["base_accuracy"]] + [result["arms"][a]["accuracy_after"]["mean"] or 0 for a in ARMS]
    errors = [0.0] + [result["arms"][a]["accuracy_after"]["se"] or 0.0 for a in ARMS]
    ax.bar(names, means, yerr=errors, color=["grey", "C0", "C1", "C2", "C3"])
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(f"offline RL ({result['profile']}; mean ± SE over {len(result['seeds'])} seeds)")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    args = seeded_bench_arguments(__doc__.splitlines()[0], PROFILES, "fidelity-offline", argv)
    profile, work = PROFILES[args.profile], args.work
    samples = cached(work / "results" / "sample.json", lambda: json.loads(reasonrl(
        "data", "sample", "--model", profile["model"], "--dataset", profile["dataset"], "--split", "train",
        *profile["sample"], "--out", str(work / "samples.jsonl"), "--quiet",
    )))  # fmt: skip
    runs = {(a, s): run(a, s, args.steps, profile, work) for s in args.seeds for a in ARMS}
    first = runs[ARMS[0], args.seeds[0]]
    result = {
        "profile": args.profile,
        "command": " ".join(["python bench/fidelity_offline.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": profile["model"],
        "dataset": profile["dataset"],
        "steps": args.steps,
        "seeds": args.seeds,
        "samples": samples,
        "base_accuracy": first["accuracy_before"],
        "arms": {
            arm: {
                "accuracy_after": mean_se([runs[arm, s]["accuracy_after"] for s in args.seeds]),
                "gain": mean_se([runs[arm, s]["accuracy_after"] - runs[arm, s]["accuracy_before"] for s in args.seeds]),
            }
            for arm in ARMS
        },
        "dqo_minus_dpo": mean_se(
            [runs["dqo", s]["accuracy_after"] - runs["dpo", s]["accuracy_after"] for s in args.seeds]
        ),
        "weights_minus_no_weights": mean_se(
            [runs["dqo", s]["accuracy_after"] - runs["dqo_no_weights", s]["accuracy_after"] for s in args.seeds]
        ),
        "runs": {f"{a}-seed{s}": r for (a, s), r in runs.items()},
    }
    write_result(
        args.out,
        f"fidelity_offline_{args.profile}",
        result,
        plot,
        ("samples", "base_accuracy", "arms", "dqo_minus_dpo"),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
