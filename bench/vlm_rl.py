"""Vision-language RL end to end (Seed1.5-VL's visual RL): build the VLM, then GRPO on a visual task (JSON + PNG).

    python bench/vlm_rl.py [--profile cpu|smoke] [--seeds 0 1] [--steps 20] [--out bench/results]

Stages, each in its own process and cached under ``--work`` (default runs/vlm-rl-PROFILE; a killed
benchmark started again continues where it stopped):
  build   ``reasonrl vlm build`` (the profile's recipe): the three stages' losses and seconds, the parameters;
  base    the built VLM's greedy accuracy on every visual task's held-out problems (``reasonrl eval``);
  runs    per seed, ``reasonrl train grpo`` on the profile's task: held-out accuracy before and after (the
          run's own evaluation), wall time, peak memory, and every task evaluated again at the end.
Results: OUT/vlm_rl_PROFILE.json and .png (accuracy before/after per task, the training reward).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when this file is imported
from common import cached, mean_se, reasonrl, seeded_bench_arguments, write_result

TASKS = ("visual_arithmetic", "visual_counting", "visual_grounding", "visual_pointing")
PROFILES = {
    # the test suite: the tiny random LM, a one-layer encoder, a few steps of everything
    "smoke": {
        "build": ["--language-model", "tiny-random", "--tasks", "visual_counting", "--vision-hidden", "32",
                  "--vision-layers", "1", "--encoder-steps", "2", "--contrastive-steps", "2", "--align-steps", "2",
                  "--sft-steps", "2",
                  "--batch-size", "2"],
        "task": "visual_counting",
        "eval_limit": 4,
        "max_new_tokens": 8,
        "train": ["rollout.rollout_prompts=2", "rollout.samples_per_prompt=2", "rollout.max_response_tokens=8",
                  "train.minibatch_sequences=4", "data.eval_prompts=4", "reward.workers=1"],
    },
    # this machine (2 CPU cores): the default recipe on SmolLM2-135M-Instruct, GRPO on the sums in images
    "cpu": {
        "build": [],
        "task": "visual_arithmetic",
        "eval_limit": 100,
        "max_new_tokens": 32,
        "train": ["rollout.rollout_prompts=8", "rollout.samples_per_prompt=4", "rollout.max_response_tokens=32",
                  "train.minibatch_sequences=16", "data.eval_prompts=100"],
    },
}  # fmt: skip


def evaluate(model: Path, profile: dict) -> dict[str, float]:
    """Greedy accuracy of ``model`` on the held-out problems of every visual task."""
    limit, tokens = str(profile["eval_limit"]), str(profile["max_new_tokens"])
    out = {}
    for task in TASKS:
        result = json.loads(reasonrl("eval", "--model", str(model), "--dataset", task, "--limit", limit,
                                     "--max-new-tokens", tokens))  # fmt: skip
        out[task] = result["greedy_pass@1"]
    return out


def run(seed: int, steps: int, profile: dict, work: Path) -> dict:
    """One GRPO run on the built VLM (cached)."""

    def produce() -> dict:
        run_dir = work / "runs" / f"grpo-seed{seed}"
        reasonrl("train", "grpo", f"model.name_or_path={work / 'vlm'}", f"data.dataset={profile['task']}",
                 *profile["train"], f"train.rollout_steps={steps}", f"run.eval_every={steps}", f"run.seed={seed}",
                 f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", "run.loggers=[]",
                 "--quiet")  # fmt: skip
        summary = json.loads((run_dir / "summary.json").read_text())
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return {
            "seed": seed,
            "accuracy_before": summary["accuracy_before"],
            "accuracy_after": summary["accuracy_after"],
            "wall_seconds": summary["wall_seconds"],
            "peak_rss_gb": summary["peak_rss_gb"],
            "reward": [r.get("reward/mean") for r in records if r["step"] >= 1],
            "after": evaluate(run_dir, profile),
        }

    return cached(work / "results" / f"grpo-seed{seed}.json", produce)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curve) = plt.subplots(1, 2, figsize=(10, 3.4))
    x = range(len(TASKS))
    after = [result["after"][t]["mean"] or 0.0 for t in TASKS]
    errors = [result["after"][t]["se"] or 0.0 for t in TASKS]
    bars.bar([i - 0.2 for i in x], [result["base"][t] for t in TASKS], 0.4, label="built VLM", color="grey")
    bars.bar([i + 0.2 for i in x], after, 0.4, yerr=errors, label=f"after GRPO on {result['task']}", color="C0")
    bars.set_xticks(list(x), [t.removeprefix("visual_") for t in TASKS])
    bars.set_ylabel("held-out greedy accuracy")
    bars.legend(fontsize=8)
    for seed, r in result["runs"].items():
        curve.plot(range(1, len(r["reward"]) + 1), r["reward"], label=seed)
    curve.set_xlabel("RL step")
    curve.set_ylabel("mean reward")
    curve.legend(fontsize=8)
    fig.suptitle(f"VLM RL ({result['profile']}; mean ± SE over {len(result['seeds'])} seeds)")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    args = seeded_bench_arguments(__doc__.splitlines()[0], PROFILES, "vlm-rl", argv)
    profile, work = PROFILES[args.profile], args.work
    built = work / "vlm" / "build.json"
    if not built.exists():
        reasonrl("vlm", "build", *profile["build"], "--out", str(work / "vlm"), "--quiet")
    build = json.loads(built.read_text())
    base = cached(work / "results" / "base.json", lambda: evaluate(work / "vlm", profile))
    runs = {f"seed{s}": run(s, args.steps, profile, work) for s in args.seeds}
    result = {
        "profile": args.profile,
        "command": " ".join(["python bench/vlm_rl.py", *(argv if argv is not None else sys.argv[1:])]),
        "task": profile["task"],
        "steps": args.steps,
        "seeds": args.seeds,
        "build": {k: build[k] for k in ("parameters", "vision_parameters", "stages", "wall_seconds")},
        "base": base,
        "accuracy_before": mean_se([r["accuracy_before"] for r in runs.values()]),
        "accuracy_after": mean_se([r["accuracy_after"] for r in runs.values()]),
        "after": {t: mean_se([r["after"][t] for r in runs.values()]) for t in TASKS},
        "runs": runs,
    }
    shown = ("build", "base", "accuracy_before", "accuracy_after")
    write_result(args.out, f"vlm_rl_{args.profile}", result, plot, shown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
