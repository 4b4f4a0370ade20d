"""PAG vs its baselines, and tool_grpo, before and after RL (JSON + PNG).

    python bench/fidelity_pag.py [--profile cpu|smoke] [--seeds 0 1] [--steps 10] [--out bench/results]

Arms (arXiv 2506.10406, Table 1): ``pag``, ``single_turn`` and ``direct_multiturn``, each trained from the
same model for the same number of RL steps on the same prompts, per seed; then every final model (and the
base model once) is evaluated with ``reasonrl eval --protocol pag`` on the same held-out problems:
acc@t1, acc@final, verifier_accuracy, delta_i_to_c, delta_c_to_i, revision_rate.  The paper's pattern:
verifier accuracy rises sharply, acc@final > acc@t1 for PAG, and PAG's delta_c_to_i stays small while
direct_multiturn's does not.  Plus one ``tool_grpo`` run per seed: held-out accuracy before and after and
tool calls per response (``multiturn/tool_calls_mean``).

Each run is its own ``python -m reasonrl train`` process under ``--work`` (default runs/fidelity-pag-PROFILE);
a run whose result file exists is skipped, so a killed benchmark started again continues.  Results: mean
± standard error over seeds in OUT/fidelity_pag_PROFILE.json and .png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when this file is imported
from common import mean_se, reasonrl, seeded_bench_arguments, write_result

ARMS = ("pag", "single_turn", "direct_multiturn")
PAG_KEYS = ("acc@t1", "acc@final", "verifier_accuracy", "delta_i_to_c", "delta_c_to_i", "revision_rate")
PROFILES = {
    # the test suite: tiny-random, one step, two problems
    "smoke": {
        "model": "tiny-random",
        "train": ["rollout.rollout_prompts=2", "rollout.samples_per_prompt=2", "train.minibatch_sequences=4",
                  "rollout.max_response_tokens=8", "rollout.max_conversation_tokens=1200", "data.eval_prompts=2"],
        "eval_limit": 2,
        "max_new_tokens": 8,
    },
    # this machine (2 CPU cores): SmolLM2-135M-Instruct on arithmetic, 8 prompts x 4 conversations per step
    "cpu": {
        "model": "smollm2-135m",
        "train": ["rollout.rollout_prompts=8", "rollout.samples_per_prompt=4", "train.minibatch_sequences=16",
                  "rollout.max_response_tokens=128", "data.eval_prompts=32"],
        "eval_limit": 64,
        "max_new_tokens": 128,
    },
}  # fmt: skip


def pag_eval(model: str, profile: dict) -> dict:
    """``reasonrl eval --protocol pag`` on the held-out problems (greedy), in its own process."""
    limit, tokens = str(profile["eval_limit"]), str(profile["max_new_tokens"])
    return json.loads(reasonrl("eval", "--model", model, "--dataset", "arithmetic", "--limit", limit,
                               "--max-new-tokens", tokens, "--protocol", "pag"))  # fmt: skip


def train(preset: str, seed: int, steps: int, profile: dict, work: Path) -> Path:
    """One RL run; returns its directory."""
    run_dir = work / "runs" / f"{preset}-seed{seed}"
    reasonrl("train", preset, f"model.name_or_path={profile['model']}", *profile["train"],
             f"train.rollout_steps={steps}", f"run.seed={seed}", f"run.eval_every={steps}",
             f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", "run.loggers=[]", "--quiet")  # fmt: skip
    return run_dir


def run_result(preset: str, seed: int, args: argparse.Namespace, profile: dict, work: Path) -> dict:
    """Train (unless done before) and evaluate one arm and seed; cached in work/results."""
    path = work / "results" / f"{preset}-seed{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    run_dir = train(preset, seed, args.steps, profile, work)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("step", 0) >= 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    result = {
        "preset": preset,
        "seed": seed,
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "train_metrics": {
            k: [r.get(k) for r in steps] for k in sorted({k for r in steps for k in r}) if k.startswith("multiturn/")
        },
    }
    if preset != "tool_grpo":
        result["pag_eval"] = {k: v for k, v in pag_eval(str(run_dir), profile).items() if k in PAG_KEYS}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["base", *ARMS]
    fig, axes = plt.subplots(1, len(PAG_KEYS), figsize=(3.2 * len(PAG_KEYS), 3.2))
    for ax, key in zip(axes, PAG_KEYS, strict=True):
        means = [result["base"][key]] + [result["arms"][a][key]["mean"] or 0.0 for a in ARMS]
        errors = [0.0] + [result["arms"][a][key]["se"] or 0.0 for a in ARMS]
        ax.bar(names, means, yerr=errors, color=["grey", "C0", "C1", "C2"])
        ax.set_title(key)
        ax.tick_params(axis="x", rotation=45)
    fig.suptitle(f"PAG and baselines after RL ({result['profile']}; mean ± SE over {len(result['seeds'])} seeds)")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    args = seeded_bench_arguments(__doc__.splitlines()[0], PROFILES, "fidelity-pag", argv)
    profile = PROFILES[args.profile]
    work = args.work
    base_path = work / "results" / "base.json"
    if not base_path.exists():
        base_path.parent.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in pag_eval(profile["model"], profile).items() if k in PAG_KEYS}
        base_path.write_text(json.dumps(base, indent=2) + "\n")
    runs = {(p, s): run_result(p, s, args, profile, work) for p in (*ARMS, "tool_grpo") for s in args.seeds}
    result = {
        "profile": args.profile,
        "command": " ".join(["python bench/fidelity_pag.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": profile["model"],
        "steps": args.steps,
        "seeds": args.seeds,
        "base": json.loads(base_path.read_text()),
        "arms": {
            arm: {key: mean_se([runs[arm, s]["pag_eval"][key] for s in args.seeds]) for key in PAG_KEYS} for arm in ARMS
        },
        "tool_grpo": {
            "accuracy_before": mean_se([runs["tool_grpo", s]["accuracy_before"] for s in args.seeds]),
            "accuracy_after": mean_se([runs["tool_grpo", s]["accuracy_after"] for s in args.seeds]),
            "tool_calls_mean": mean_se(
                [
                    statistics.fmean(runs["tool_grpo", s]["train_metrics"]["multiturn/tool_calls_mean"])
                    for s in args.seeds
                ]
            ),
        },
        "runs": {f"{p}-seed{s}": r for (p, s), r in runs.items()},
    }
    write_result(args.out, f"fidelity_pag_{args.profile}", result, plot, ("base", "arms", "tool_grpo"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
