"""GRPO in the Countdown environment with the calculator tool, before and after RL (JSON + PNG).

    python bench/countdown_env.py [--profile cpu|smoke] [--seeds 0 1 2] [--steps 10] [--out bench/results]

Per seed, one ``reasonrl train countdown`` run (the shipped preset: GRPO, the calculator in up to 3 calls over
4 turns of 128 tokens) in its own process under ``--work`` (default runs/countdown-env-PROFILE).  Read from its
metrics file: the held-out success rate before (step 0) and after (the last step): greedy episodes of the same
environment on ``data.eval_prompts`` test puzzles (``eval/accuracy``), with their tool calls, turns and generated tokens
per episode (``eval/tool_calls_mean``, ``eval/turns_mean``, ``eval/response_length``); and the training episodes'
success rate, tool calls, tool errors, turns and tokens per episode, per step.  A seed whose result file exists
is not trained again, so a killed benchmark started again continues.  Results: mean ± standard error over
seeds in OUT/countdown_env_PROFILE.json and .png.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when this file is imported
from common import cpu_model, mean_se, reasonrl, seeded_bench_arguments, write_result

PROFILES = {
    # the test suite: tiny-random, one step, two puzzles
    "smoke": ["model.name_or_path=tiny-random", "rollout.rollout_prompts=2", "rollout.samples_per_prompt=2",
              "train.minibatch_sequences=4", "rollout.max_response_tokens=8", "data.eval_prompts=2"],
    # this machine (2 CPU cores): the preset as shipped (SmolLM2-135M-Instruct, 8 puzzles x 8 episodes per step)
    "cpu": ["data.eval_prompts=100"],
}  # fmt: skip
EVAL_KEYS = {  # held-out episode metric -> name in the result
    "eval/accuracy": "success_rate",
    "eval/tool_calls_mean": "tool_calls_per_episode",
    "eval/turns_mean": "turns_per_episode",
    "eval/response_length": "generated_tokens_per_episode",
    "eval/tool_errors_mean": "tool_errors_per_episode",
}
TRAIN_KEYS = {  # training episode metric -> name in the result
    "reward/accuracy": "success_rate",
    "multiturn/tool_calls_mean": "tool_calls_per_episode",
    "multiturn/tool_errors_mean": "tool_errors_per_episode",
    "multiturn/turns_mean": "turns_per_episode",
    "rollout/response_length": "generated_tokens_per_episode",
    "perf/step_seconds": "step_seconds",
}


def run_result(seed: int, steps: int, settings: list[str], work: Path) -> dict:
    """Train one seed (unless done before) and read its metrics; cached in work/results."""
    path = work / "results" / f"seed{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    run_dir, started = work / "runs" / f"seed{seed}", time.perf_counter()
    reasonrl("train", "countdown", *settings, f"train.rollout_steps={steps}", f"run.seed={seed}",
             f"run.eval_every={steps}", f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
             "run.loggers=[]", "--quiet")  # fmt: skip
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evaluations = [r for r in records if "eval/accuracy" in r]
    trained = [r for r in records if r["step"] >= 1 and "reward/accuracy" in r]
    result = {
        "seed": seed,
        "wall_seconds": wall,
        "before": {name: evaluations[0].get(key) for key, name in EVAL_KEYS.items()},
        "after": {name: evaluations[-1].get(key) for key, name in EVAL_KEYS.items()},
        "evaluated_steps": [r["step"] for r in evaluations],
        "train": {name: [r.get(key) for r in trained] for key, name in TRAIN_KEYS.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (train_ax, eval_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, run in result["runs"].items():
        success = run["train"]["success_rate"]
        train_ax.plot(range(1, len(success) + 1), success, marker=".", label=name)
    train_ax.set(xlabel="RL step", ylabel="training episodes solved", title="Countdown: training episodes")
    train_ax.legend()
    keys = ("success_rate", "tool_calls_per_episode", "turns_per_episode")
    for offset, when in ((-0.2, "before"), (0.2, "after")):
        means = [result[when][key]["mean"] or 0.0 for key in keys]
        errors = [result[when][key]["se"] or 0.0 for key in keys]
        eval_ax.bar([i + offset for i in range(len(keys))], means, 0.4, yerr=errors, label=when)
    eval_ax.set_xticks(range(len(keys)), keys, rotation=15)
    eval_ax.set_title(f"held-out episodes (greedy), mean ± SE over {len(result['seeds'])} seeds")
    eval_ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    args = seeded_bench_arguments(__doc__.splitlines()[0], PROFILES, "countdown-env", argv)
    runs = {seed: run_result(seed, args.steps, PROFILES[args.profile], args.work) for seed in args.seeds}
    result = {
        "profile": args.profile,
        "command": " ".join(["python bench/countdown_env.py", *(argv if argv is not None else sys.argv[1:])]),
        "settings": PROFILES[args.profile],
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "steps": args.steps,
        "seeds": args.seeds,
        **{
            when: {name: mean_se([runs[s][when][name] for s in args.seeds]) for name in EVAL_KEYS.values()}
            for when in ("before", "after")
        },
        **{
            f"train_{when}_step": {
                name: mean_se([runs[s]["train"][name][at] for s in args.seeds]) for name in TRAIN_KEYS.values()
            }
            for when, at in (("first", 0), ("last", -1))
        },
        "wall_seconds": mean_se([runs[s]["wall_seconds"] for s in args.seeds]),
        "runs": {f"seed{s}": r for s, r in runs.items()},
    }
    write_result(args.out, f"countdown_env_{args.profile}", result, plot, ("before", "after", "train_last_step"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
