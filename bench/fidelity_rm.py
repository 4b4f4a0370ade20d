"""Reward models on the embedded model: COCA pretraining, Pairwise-RL vs Bradley-Terry, and reward hacking by
source (arXiv 2108.10510, 2504.04950, 2503.22230; JSON + PNG).

    python bench/fidelity_rm.py [--profile cpu|smoke] [--seeds 0 1 2] [--pairwise-seeds 0 1] [--steps 10]
                                [--out bench/results]

Stages, each in its own process and cached under ``--work`` (default runs/fidelity-rm-PROFILE; a killed
benchmark started again continues where it stopped):
  coca      per seed: a Bradley-Terry RM trained on the HH-RLHF pairs (``rm train --kind bt``), and the same
            after COCA contrastive pretraining of its encoder (``rm pretrain --contrastive``), with the same
            BT steps; held-out pairwise accuracy on the pairs as they are, with one earlier exchange of the
            history dropped, and with two exchanges swapped (the variability COCA targets);
  pairwise  per seed: a pairwise judge from the same pairs (``rm train --kind pairwise``) against the BT RM:
            held-out accuracy overall, by length bucket, and a reliability curve; then ``pairwise_ppo`` (the
            judge's debiased win rate against the human anchor) vs ``ppo`` rewarded by the BT RM, same prompts
            and steps; each final policy's win rate against the anchors, judged by a referee judge trained on
            another seed's split, which neither policy trained against;
  hacking   per seed, one policy (grpo on arithmetic, ``--steps`` steps) rewarded by (a) the math verifier,
            (b) GenRM with the ground-truth answer, (c) GenRM with a best-of-N reference (``data bon``); every
            step logs the judge's reward and the verifier's accuracy on the same responses
            (``reward/judge_minus_verifier``).
Results: mean ± standard error over seeds in OUT/fidelity_rm_PROFILE.json and .png.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when this file is imported
from common import cached, mean_se, reasonrl, seeded_bench_arguments, write_result

HH = "hh-rlhf-harmless"
LENGTH_BUCKETS = ((0, 40), (40, 120), (120, 10**9))  # words in the chosen + rejected replies
HACKING_ARMS = ("verifier", "genrm_ground_truth", "genrm_best_of_n")
PROFILES = {
    # the test suite: tiny-random, a few pairs and steps
    "smoke": {
        "model": "tiny-random",
        "rm": ["--steps", "2", "--batch-pairs", "2", "--eval-pairs", "4", "--max-response-tokens", "16"],
        "pretrain": ["--steps", "2", "--batch-pairs", "2", "--eval-pairs", "4"],
        "eval_pairs": 6,
        "rl": ["model.dtype=float32", "rollout.rollout_prompts=2", "rollout.max_response_tokens=8",
               "rollout.max_prompt_tokens=4096", "train.minibatch_sequences=2", "data.eval_prompts=2",
               "reward.workers=1"],
        "win_prompts": 2,
        "arithmetic_prompts": 8,
        "bon_n": 2,
        "hacking": ["rollout.rollout_prompts=2", "rollout.samples_per_prompt=2", "train.minibatch_sequences=4"],
        "max_new_tokens": 8,
    },
    # this machine (2 CPU cores): SmolLM2-135M-Instruct
    "cpu": {
        "model": "smollm2-135m",
        "rm": ["--steps", "60", "--batch-pairs", "8", "--eval-pairs", "200", "--max-response-tokens", "128"],
        "pretrain": ["--steps", "60", "--batch-pairs", "8", "--eval-pairs", "200"],
        "eval_pairs": 200,
        "rl": ["rollout.rollout_prompts=16", "rollout.max_response_tokens=64", "train.minibatch_sequences=8",
               "data.eval_prompts=32"],
        "win_prompts": 64,
        "arithmetic_prompts": 512,
        "bon_n": 4,
        "hacking": ["rollout.rollout_prompts=8", "rollout.samples_per_prompt=4", "train.minibatch_sequences=32",
                    "data.eval_prompts=64"],
        "max_new_tokens": 64,
    },
}  # fmt: skip


# --- perturbed histories (COCA's robustness) ----------------------------------------------------------


def perturbed(pair, how: str, rng: random.Random):
    """The pair with its history changed (``drop``: one earlier exchange removed; ``reorder``: two swapped),
    or None when the history has too few earlier exchanges; the replies stay."""
    from reasonrl.data.augment import movable_exchanges, reorder_turns
    from reasonrl.reward.bt import PreferencePair

    spans = movable_exchanges(pair.prompt)
    if how == "drop":
        if not spans:
            return None
        start, stop = spans[rng.randrange(len(spans))]
        history = [*pair.prompt[:start], *pair.prompt[stop:]]
    else:
        history = reorder_turns(pair.prompt, rng)
        if history is None:
            return None
    return PreferencePair(history, pair.chosen, pair.rejected)


def robustness(rm_dir: Path, held_out: list, seed: int) -> dict:
    """Held-out pair accuracy of a BT RM on the pairs as they are and with perturbed histories."""
    from reasonrl.reward.bt import RewardModel, pair_accuracy

    rm = RewardModel.load(rm_dir)
    out = {"as_is": {"n": len(held_out), "accuracy": pair_accuracy(rm, held_out)}}
    for how in ("drop", "reorder"):
        rng = random.Random(f"{how}:{seed}")
        changed = [(p, q) for p in held_out if (q := perturbed(p, how, rng)) is not None]
        out[how] = {
            "n": len(changed),
            "accuracy": pair_accuracy(rm, [q for _, q in changed]) if changed else None,
            "accuracy_same_pairs_as_is": pair_accuracy(rm, [p for p, _ in changed]) if changed else None,
        }
    return out


def held_out_pairs(seed: int, count: int) -> list:
    """The held-out pairs `rm train --seed SEED` kept out (the same split)."""
    from reasonrl.reward.bt import load_preference_pairs, split_pairs

    return split_pairs(load_preference_pairs(HH), 0.2, seed)[1][:count]


def rm_command(out: Path, *arguments: str) -> dict:
    """``reasonrl rm ARGUMENTS --out OUT``, run once: a directory that holds its ``summary.json`` is done, so a
    restarted benchmark does not train a finished reward model again; returns that summary."""
    if not (out / "summary.json").exists():
        reasonrl("rm", *arguments, "--out", str(out))
    return json.loads((out / "summary.json").read_text())


def coca_stage(seed: int, profile: dict, work: Path) -> dict:
    """BT with and without COCA pretraining of its encoder; accuracy and robustness (cached)."""

    def produce() -> dict:
        root, model = work / "coca", profile["model"]
        plain, encoder, pretrained = root / f"plain-{seed}", root / f"encoder-{seed}", root / f"pretrained-{seed}"
        common = ["--data", HH, "--seed", str(seed)]
        rm_command(plain, "train", "--kind", "bt", "--model", model, *common, *profile["rm"])
        summary = rm_command(encoder, "pretrain", "--contrastive", "--model", model, *common, *profile["pretrain"])
        rm_command(pretrained, "train", "--kind", "bt", "--model", str(encoder / "model"), *common, *profile["rm"])
        held_out = held_out_pairs(seed, profile["eval_pairs"])
        return {
            "seed": seed,
            "contrastive": {k: summary[k] for k in ("held_out_before", "held_out_after", "wall_seconds")},
            "plain": robustness(plain, held_out, seed),
            "pretrained": robustness(pretrained, held_out, seed),
        }

    return cached(work / "results" / f"coca-seed{seed}.json", produce)


# --- Pairwise-RL vs Bradley-Terry ----------------------------------------------------------------------


def preference_probabilities(work: Path, seed: int, held_out: list) -> dict[str, list[float]]:
    """P(chosen ≻ rejected) per held-out pair: the BT RM's σ(s_c − s_r), the judge's debiased verdict."""
    import math

    from reasonrl.data.preferences import conversation_text
    from reasonrl.models.load import load_model, load_tokenizer
    from reasonrl.reward.bt import RewardModel
    from reasonrl.reward.pairwise import PairwiseJudge

    bt = RewardModel.load(work / "coca" / f"plain-{seed}")
    prompts = [p.prompt for p in held_out]
    chosen, rejected = (
        bt.score(prompts, [p.chosen for p in held_out]),
        bt.score(prompts, [p.rejected for p in held_out]),
    )
    judge_dir = work / "pairwise" / f"judge-{seed}" / "model"
    judge = PairwiseJudge(load_model(str(judge_dir)), load_tokenizer(str(judge_dir)))
    questions = [conversation_text(p.prompt) for p in held_out]
    debiased = judge.debiased_reward(questions, [p.chosen for p in held_out], [p.rejected for p in held_out])
    return {
        "bt": [1 / (1 + math.exp(r - c)) for c, r in zip(chosen, rejected, strict=True)],
        "judge": [float(x) for x in debiased],  # both orders: P(chosen ≻ rejected), position bias removed
    }


def calibration(probabilities: list[float], held_out: list) -> dict:
    """Accuracy overall and by reply length, and a 5-bin reliability curve of the predicted P(chosen ≻ rejected)."""
    right = [p > 0.5 for p in probabilities]
    by_length = {}
    for low, high in LENGTH_BUCKETS:
        rows = [i for i, p in enumerate(held_out) if low <= len((p.chosen + " " + p.rejected).split()) < high]
        by_length[f"{low}-{high if high < 10**9 else 'longer'}"] = {
            "n": len(rows), "accuracy": sum(right[i] for i in rows) / len(rows) if rows else None,
        }  # fmt: skip
    bins = []
    for b in range(5):  # predicted confidence for the chosen reply, folded: |p − 0.5| in five bins
        rows = [i for i, p in enumerate(probabilities) if b / 10 <= abs(p - 0.5) < (b + 1) / 10 + (b == 4) * 1e-9]
        bins.append({
            "confidence": 0.5 + (b + 0.5) / 10, "n": len(rows),
            "accuracy": sum(right[i] for i in rows) / len(rows) if rows else None,
        })  # fmt: skip
    return {"accuracy": sum(right) / len(right), "by_length": by_length, "reliability": bins}


def win_rate(policy_model: str, referee: Path, profile: dict) -> dict:
    """The policy's greedy replies to the first held-out HH prompts, scored by the referee judge against the
    human anchor (position-debiased win probability; 0.5 = parity)."""
    from reasonrl.config import load_config
    from reasonrl.data.source import DataSpec, eval_examples
    from reasonrl.jobs.prompt_sampling import InitialPolicy
    from reasonrl.reward.genrm import GenRM
    from reasonrl.rollout import SamplingParams

    cfg = load_config("pairwise_ppo", [f"model.name_or_path={policy_model}", *profile["rl"]])
    examples = [e for e in eval_examples(DataSpec(HH), profile["win_prompts"]) if e.answer]  # the held-out prompts
    policy = InitialPolicy.load(cfg)
    kept = [e for e in examples if policy.encoder(e) is not None]
    completions = policy.engine.generate(
        [policy.encoder(e) for e in kept], SamplingParams(profile["max_new_tokens"], 0.0)
    )
    replies = policy.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
    scores = GenRM.from_model(str(referee / "model")).score(
        [e.question for e in kept], replies, [e.answer for e in kept]
    )
    return {"n": len(scores), "mean_win_probability": sum(scores) / len(scores),
            "win_rate": sum(s > 0.5 for s in scores) / len(scores)}  # fmt: skip


def pairwise_stage(seed: int, steps: int, profile: dict, work: Path, referee: Path) -> dict:
    """The judge vs the BT RM as reward models, then pairwise_ppo vs ppo(BT) and their win rates (cached)."""

    def produce() -> dict:
        judge = work / "pairwise" / f"judge-{seed}"
        rm_command(judge, "train", "--kind", "pairwise", "--model", profile["model"], "--data", HH, "--seed", str(seed),
                   *profile["rm"])  # fmt: skip
        held_out = held_out_pairs(seed, profile["eval_pairs"])
        probabilities = preference_probabilities(work, seed, held_out)
        runs = {}
        bt = work / "coca" / f"plain-{seed}"
        arms = {
            "pairwise_ppo": ["pairwise_ppo", f"reward.judge_model={judge / 'model'}"],
            "ppo_bt": ["pairwise_ppo", "reward.routes=[reference=bt]", f"reward.reward_model={bt}"],  # the same PPO
        }
        for arm, (preset, *extra) in arms.items():
            run_dir = work / "pairwise" / "runs" / f"{arm}-seed{seed}"
            if not (run_dir / "summary.json").exists():
                reasonrl("train", preset, f"model.name_or_path={profile['model']}", *profile["rl"], *extra,
                         f"train.rollout_steps={steps}", f"run.eval_every={steps}", f"run.seed={seed}",
                         f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", "run.loggers=[]",
                         "--quiet")  # fmt: skip
            runs[arm] = {"summary": json.loads((run_dir / "summary.json").read_text()),
                         "referee": win_rate(str(run_dir / "final"), referee, profile)}  # fmt: skip
        return {"seed": seed, "bt": calibration(probabilities["bt"], held_out),
                "judge": calibration(probabilities["judge"], held_out), "runs": runs}  # fmt: skip

    return cached(work / "results" / f"pairwise-seed{seed}.json", produce)


# --- reward hacking by source ---------------------------------------------------------------------------


def hacking_data(profile: dict, work: Path, bt: Path) -> dict[str, Path]:
    """The same arithmetic prompts as three datasets: math (the verifier), reference (GenRM with the true
    answer) and open (GenRM with the BT RM ``bt``'s best-of-N reference), each judged row with its true answer
    in ``verifier_answer``."""
    from reasonrl.data.arithmetic import ArithmeticTask

    root = work / "hacking"
    root.mkdir(parents=True, exist_ok=True)
    task = ArithmeticTask(2, "+", 0)
    problems = [task.train_example(i) for i in range(profile["arithmetic_prompts"])]

    def write(path: Path, task_type: str) -> Path:
        rows = [{"id": e.id, "question": e.question, "answer": e.answer, "task_type": task_type,
                 **({"verifier_answer": e.answer} if task_type != "math" else {})} for e in problems]  # fmt: skip
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    paths = {"verifier": write(root / "math.jsonl", "math"),
             "genrm_ground_truth": write(root / "reference.jsonl", "reference")}  # fmt: skip
    bon = root / "best_of_n.jsonl"
    if not bon.exists():
        reasonrl("data", "bon", "--prompts", str(paths["verifier"]), "--reward-model", str(bt),
                 "--out", str(bon), "--n", str(profile["bon_n"]), "--max-new-tokens", str(profile["max_new_tokens"]),
                 f"model.name_or_path={profile['model']}")  # fmt: skip
    paths["genrm_best_of_n"] = bon
    return paths


def hacking_stage(arm: str, seed: int, steps: int, profile: dict, work: Path, data: Path) -> dict:
    """One grpo run rewarded by ``arm``'s source; its per-step reward and true accuracy (cached)."""

    def produce() -> dict:
        run_dir = work / "hacking" / "runs" / f"{arm}-seed{seed}"
        reasonrl("train", "grpo", f"model.name_or_path={profile['model']}", f"data.dataset={data}",
                 *profile["rl"], *profile["hacking"], f"rollout.max_response_tokens={profile['max_new_tokens']}",
                 f"train.rollout_steps={steps}", f"run.eval_every={steps}", f"run.seed={seed}",
                 f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", "run.loggers=[]",
                 "--quiet")  # fmt: skip
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        steps_done = [r for r in records if r["step"] >= 1]
        keys = ("reward/mean", "reward/accuracy", "reward/verifier_accuracy", "reward/judge_minus_verifier")
        return {"arm": arm, "train_metrics": {k: [r.get(k) for r in steps_done] for k in keys},
                "eval": {k: v for k, v in records[-1].items() if k.startswith("eval/")}}  # fmt: skip

    return cached(work / "results" / f"hacking-{arm}-seed{seed}.json", produce)


def calibration_error(reliability: list[dict]) -> float:
    """Expected calibration error of a folded reliability curve, each bin at its centre's confidence:
    Σ_b n_b / N · |accuracy_b − confidence_b|."""
    total = sum(b["n"] for b in reliability)
    return sum(b["n"] * abs(b["accuracy"] - b["confidence"]) for b in reliability if b["n"]) / total


def pooled_reliability(curves: list[list[dict]]) -> list[dict]:
    """Reliability curves of several seeds as one: per bin, the pairs of all seeds and their accuracy."""
    pooled = []
    for bins in zip(*curves, strict=True):
        n = sum(b["n"] for b in bins)
        right = sum(b["n"] * b["accuracy"] for b in bins if b["n"])
        pooled.append({"confidence": bins[0]["confidence"], "n": n, "accuracy": right / n if n else None})
    return pooled


def hacking_gap(run: dict) -> dict:
    """The hacking signal of one run: the training reward minus the verifier's accuracy on the same responses,
    averaged over the steps (0 for the verifier itself); on the final held-out evaluation, the same gap, the
    share of wrong answers the judge calls right, and the verifier's accuracy."""
    gaps = [g for g in run["train_metrics"]["reward/judge_minus_verifier"] if g is not None]
    final = run["eval"]
    return {"train_mean": sum(gaps) / len(gaps) if gaps else 0.0,
            "eval": final.get("eval/judge_minus_verifier", 0.0),
            "eval_judge_fooled": final.get("eval/judge_fooled", 0.0),
            "eval_verifier_accuracy": final.get("eval/verifier_accuracy", final.get("eval/accuracy"))}  # fmt: skip


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    coca = result["coca"]
    names = ["as_is", "drop", "reorder"]
    for offset, arm in ((-0.2, "plain"), (0.2, "pretrained")):
        means = [coca[arm][n]["mean"] or 0 for n in names]
        errors = [coca[arm][n]["se"] or 0 for n in names]
        axes[0].bar([i + offset for i in range(3)], means, 0.4, yerr=errors, label=arm)
    axes[0].set_xticks(range(3), names)
    axes[0].set_title("BT held-out accuracy (COCA or not)")
    axes[0].legend(loc="lower right")
    for arm in ("bt", "judge"):
        bins = [b for b in result["pairwise"]["reliability"][arm] if b["n"]]
        axes[1].plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], "o-", label=arm)
        for b in bins:
            axes[1].annotate(f"n={b['n']}", (b["confidence"], b["accuracy"]), fontsize=7, xytext=(3, -9),
                             textcoords="offset points")  # fmt: skip
    axes[1].plot([0.5, 1], [0.5, 1], "k:", lw=0.8)
    axes[1].set_xlabel("predicted P(preferred reply)")
    axes[1].set_title("reliability (held-out pairs, seeds pooled)")
    axes[1].legend()
    for arm, runs in result["per_seed"]["hacking"].items():  # the verifier's reward is its accuracy: a gap of 0
        gaps = [[g if g is not None else 0.0 for g in run["train_metrics"]["reward/judge_minus_verifier"]]
                for run in runs.values()]  # fmt: skip
        mean_gap = [sum(step) / len(step) for step in zip(*gaps, strict=True)]
        axes[2].plot(range(1, len(mean_gap) + 1), mean_gap, label=arm)
    axes[2].set_title("training reward − verifier accuracy (seed mean)")
    axes[2].set_xlabel("step")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    def pairwise_seeds_option(parser):
        parser.add_argument("--pairwise-seeds", type=int, nargs="+",
                            help="seeds of the pairwise stage, a subset of --seeds (default: all of them)")  # fmt: skip

    args = seeded_bench_arguments(__doc__.splitlines()[0], PROFILES, "fidelity-rm", argv, pairwise_seeds_option)
    profile, work, seeds = PROFILES[args.profile], args.work, args.seeds
    pairwise_seeds = args.pairwise_seeds or seeds
    if not set(pairwise_seeds) <= set(seeds):
        raise SystemExit(f"--pairwise-seeds {pairwise_seeds} must be among --seeds {seeds}")
    coca = {s: coca_stage(s, profile, work) for s in seeds}
    referee, referee_seed = work / "pairwise" / "referee", 1000 + max(seeds)  # a split no policy trains against
    referee_summary = rm_command(referee, "train", "--kind", "pairwise", "--model", profile["model"], "--data", HH,
                                 "--seed", str(referee_seed), *profile["rm"])  # fmt: skip
    pairwise = {s: pairwise_stage(s, args.steps, profile, work, referee) for s in pairwise_seeds}
    base_win = cached(work / "results" / "pairwise-base.json", lambda: win_rate(profile["model"], referee, profile))
    data = hacking_data(profile, work, work / "coca" / f"plain-{seeds[0]}")
    hacking = {arm: {s: hacking_stage(arm, s, args.steps, profile, work, data[arm]) for s in seeds}
               for arm in HACKING_ARMS}  # fmt: skip

    def over_seeds(values):
        return mean_se([v for v in values if v is not None])

    def win(seed: int, arm: str) -> float:
        return pairwise[seed]["runs"][arm]["referee"]["mean_win_probability"]

    result = {
        "profile": args.profile,
        "command": " ".join(["python bench/fidelity_rm.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": profile["model"],
        "seeds": seeds,
        "pairwise_seeds": pairwise_seeds,
        "coca": {
            arm: {
                how: over_seeds([coca[s][arm][how]["accuracy"] for s in seeds]) for how in ("as_is", "drop", "reorder")
            }
            for arm in ("plain", "pretrained")
        },
        "pairwise": {
            "accuracy": {
                arm: over_seeds([pairwise[s][arm]["accuracy"] for s in pairwise_seeds]) for arm in ("bt", "judge")
            },
            "judge_minus_bt_accuracy": over_seeds(
                [pairwise[s]["judge"]["accuracy"] - pairwise[s]["bt"]["accuracy"] for s in pairwise_seeds]
            ),
            "calibration_error": {
                arm: over_seeds([calibration_error(pairwise[s][arm]["reliability"]) for s in pairwise_seeds])
                for arm in ("bt", "judge")
            },
            "reliability": {
                arm: pooled_reliability([pairwise[s][arm]["reliability"] for s in pairwise_seeds])
                for arm in ("bt", "judge")
            },
            "referee": {"seed": referee_seed, "held_out_accuracy": referee_summary["held_out_accuracy"]},
            "referee_base_win_probability": base_win["mean_win_probability"],  # the policy before either RL
            "referee_win_probability": {
                arm: over_seeds([win(s, arm) for s in pairwise_seeds]) for arm in ("pairwise_ppo", "ppo_bt")
            },
            "pairwise_ppo_minus_ppo_bt_win_probability": over_seeds(
                [win(s, "pairwise_ppo") - win(s, "ppo_bt") for s in pairwise_seeds]
            ),
        },
        "hacking": {
            arm: {
                key: over_seeds([hacking_gap(run)[key] for run in runs.values()])
                for key in ("train_mean", "eval", "eval_judge_fooled", "eval_verifier_accuracy")
            }
            for arm, runs in hacking.items()
        },
        "per_seed": {"coca": coca, "pairwise": pairwise, "hacking": hacking},
    }
    write_result(args.out, f"fidelity_rm_{args.profile}", result, plot, ("coca", "pairwise"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
