"""Paper fidelity: VC-PPO, VAPO (with its ablation ladder) and T-PPO, arms x seeds x a fixed step budget.

    python bench/fidelity.py --profile cpu [--arms ARM ...] [--work DIR] [--out DIR] [--keep-models]

What it runs (arms, profiles and targets live in bench/fidelity.yaml, fixed before any run):
  rm      once, cached: the initial policy samples GSM8K training problems; each wrong answer is paired
          with a right answer to the same problem (the policy's own, else the problem's reference solution
          in the answer format) and `reasonrl rm train` fits a Bradley-Terry outcome model on the pairs.
          Every value-family critic starts from it (critic.init=reward_model).
  race    per seed: rollout-only throughput on the policy's own length distribution, synchronous calls
          (every response to its end) vs T-PPO's pool (one window per call, finished slots refilled):
          completed responses per second of generation.
  runs    per (arm, seed): `python -m reasonrl train PRESET ...` in its own process and run directory.
Each finished stage or run leaves a result file under WORK; a harness started again (after a kill,
or to add arms) skips what is finished, continues unfinished runs from their last checkpoint (reasonrl's
own resume) and re-runs the rest.  After every stage it rewrites OUT/fidelity_PROFILE.json (the
configuration, per-arm final accuracy and mechanism metrics as mean +- standard error over seeds,
and each target's measurement and verdict) and OUT/fidelity_PROFILE.png.

Profiles: smoke (tiny-random, under a minute: the test suite runs it), cpu (the 2-core project
machine: about 5 hours on a quiet machine, the core arms first; docs/benchmarks.md has the timing),
gpu (one CUDA GPU with vLLM).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also when this file is imported
from common import ROOT, child_env, mean_se

CONFIG = Path(__file__).with_name("fidelity.yaml")
FAMILY_PRESET = {"value": "ppo", "tppo": "t_ppo"}  # the preset a family's shared stages (rm, race) load
PRUNED = ("checkpoints", "critic_pretrained", "final")  # a finished run's large files (--keep-models keeps them)


# ---------------------------------------------------------------------------------------------- config


def load_harness_config(path: Path) -> tuple[dict[str, Any], str]:
    """The YAML configuration and its sha256."""
    text = path.read_text()
    return yaml.safe_load(text), hashlib.sha256(text.encode()).hexdigest()


def selected_arms(config: dict, profile: dict, only: list[str] | None) -> list[str]:
    """The profile's arms (``all`` = every arm), restricted to ``only``; unknown names are an error."""
    arms = list(config["arms"]) if profile["arms"] == "all" else list(profile["arms"])
    unknown = sorted(set(only or []) - set(arms))
    if unknown:
        raise SystemExit(f"fidelity: arm(s) {', '.join(unknown)} not in this profile; choose from {', '.join(arms)}")
    return [a for a in arms if not only or a in only]


def per_arm(value: Any, arm: str) -> Any:
    """A family setting that may differ per arm ({arm: value})."""
    return value[arm] if isinstance(value, dict) else value


def window_tokens(cap: int) -> int:
    """T-PPO's window: a third of the cap (the paper's 8K of 24K), rounded up so three windows reach it."""
    return math.ceil(cap / 3)


def train_overrides(config: dict, profile: dict, arm: str, seed: int, work: Path) -> list[str]:
    """Every `reasonrl train` override of one run, in the order of bench/fidelity.yaml's header."""
    from reasonrl.config import load_config

    spec = config["arms"][arm]
    family = profile[spec["family"]]
    prompts, samples = family["prompts"], family["samples"]
    shape = (prompts, samples) if spec["sampling"] == "group" else (prompts * samples, 1)
    cap = family["cap"]
    overrides = [*profile["common"], *config["reward_overrides"]]
    overrides += [
        f"rollout.max_response_tokens={cap}",
        f"train.rollout_steps={per_arm(family['steps'], arm)}",
        f"run.eval_every={per_arm(family['eval_every'], arm)}",
        f"run.save_every={family['save_every']}",
        *family.get("overrides", []),
        f"rollout.rollout_prompts={shape[0]}",
        f"rollout.samples_per_prompt={shape[1]}",
    ]
    if spec["family"] == "value":
        overrides += ["critic.init=reward_model", f"critic.path={work / 'rm'}"]
    if spec["family"] == "tppo":
        overrides.append(f"algo.window_tokens={window_tokens(cap)}")
    overrides += spec.get("overrides", [])
    pretrain = family.get("value_pretrain_steps")
    if pretrain is not None and load_config(spec["preset"], overrides).algo.value_pretrain_steps > 0:
        overrides.insert(len(overrides) - len(spec.get("overrides", [])), f"algo.value_pretrain_steps={pretrain}")
    return [*overrides, f"run.seed={seed}"]


def family_config(config: dict, profile: dict, family: str, seed: int):
    """A reasonrl Config with a family's model, data, cap and engine settings (for the rm and race stages)."""
    from reasonrl.config import load_config

    settings = profile[family]
    overrides = [*profile["common"], *config["reward_overrides"], f"rollout.max_response_tokens={settings['cap']}"]
    overrides += [o for o in settings.get("overrides", []) if not o.startswith(("train.", "algo."))]
    if family == "tppo":
        overrides.append(f"algo.window_tokens={window_tokens(settings['cap'])}")
    return load_config(FAMILY_PRESET[family], [*overrides, f"run.seed={seed}"])


# ---------------------------------------------------------------------------------------------- workers


def _generation_parts(cfg):
    """Tokenizer, engine, prompt encoder, compute dtype and device of ``cfg``, built as training builds them."""
    import torch

    from reasonrl.config.plan import vllm_engine_options
    from reasonrl.data.prompts import PromptEncoder
    from reasonrl.models.load import compute_dtype, load_model, load_tokenizer, resolve_device
    from reasonrl.rollout import build_engine

    device, dtype = resolve_device(cfg.model.device), compute_dtype(cfg.model.dtype)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    model = load_model(cfg.model.name_or_path, torch.float32, None, device)
    engine = build_engine(cfg.rollout.engine, model, tokenizer, vllm_engine_options(cfg), dtype=dtype)
    encoder = PromptEncoder(tokenizer, cfg.data.prompt_template, cfg.rollout.max_prompt_tokens, cfg.data.system_prompt)
    return tokenizer, engine, encoder, dtype, device


def reference_response(solution: str, template: str) -> str:
    """A GSM8K reference solution ("... <<48/2=24>> ... #### 72") as a response in the prompt's answer format."""
    body, _, final = re.sub(r"<<[^>]*>>", "", solution).rpartition("####")
    final = final.strip()
    ending = {"answer_line": f"Answer: {final}", "boxed": f"The final answer is \\boxed{{{final}}}."}
    return f"{body.strip()}\n{ending.get(template, final)}"


def worker_rm(config: dict, profile: dict, work: Path) -> None:
    """Sample, pair correct with incorrect answers, and train the outcome model with `reasonrl rm train`."""
    from reasonrl.cli import main as reasonrl_main
    from reasonrl.data.prompts import prompt_messages
    from reasonrl.data.source import TrainingStream
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.scored import sample_and_score
    from reasonrl.training.run_inputs import build_scorer, data_spec

    settings, out = profile["rm"], work / "rm"
    cfg = family_config(config, profile, "value", settings["seed"])
    pairs_path = out / "pairs.jsonl"
    if not pairs_path.exists():
        tokenizer, engine, encoder, dtype, device = _generation_parts(cfg)
        scorer = build_scorer(cfg, dtype, device)
        examples = TrainingStream(data_spec(cfg), settings["seed"]).take(settings["prompts"])
        params = SamplingParams(
            cfg.rollout.max_response_tokens, cfg.rollout.temperature, cfg.rollout.top_p, seed=settings["seed"]
        )
        started = time.perf_counter()
        try:
            scored = sample_and_score(engine, tokenizer, scorer, encoder, examples, params, repeats=settings["samples"])
        finally:
            scorer.close()
        texts = tokenizer.batch_decode([c.token_ids for c in scored.completions], skip_special_tokens=True)
        by_id: dict[str, tuple[Any, list[str], list[str]]] = {}
        for example, text, result in zip(scored.examples, texts, scored.results, strict=True):
            _, right, wrong = by_id.setdefault(example.id, (example, [], []))
            (right if result.correct else wrong).append(text)
        rows, from_reference = [], 0
        for example, right, wrong in by_id.values():
            prompt = prompt_messages(example, cfg.data.prompt_template, cfg.data.system_prompt)
            for k, rejected in enumerate(wrong):
                if right:
                    chosen = right[k % len(right)]
                else:
                    chosen = reference_response(
                        str(example.fields.get("answer", example.answer)), cfg.data.prompt_template
                    )
                    from_reference += 1
                rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        correct = sum(r.correct for r in scored.results)
        out.mkdir(parents=True, exist_ok=True)
        summary = {
            "prompts": len(by_id),
            "samples": len(texts),
            "sample_accuracy": correct / max(1, len(texts)),
            "pairs": len(rows),
            "pairs_chosen_from_own_samples": len(rows) - from_reference,
            "pairs_chosen_from_reference_solutions": from_reference,
            "sampling_seconds": time.perf_counter() - started,
        }
        (out / "pairs_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        _write_atomic(pairs_path, "".join(json.dumps(row) + "\n" for row in rows))
    args = ["rm", "train", "--kind", "bt", "--model", cfg.model.name_or_path, "--data", str(pairs_path)]
    args += ["--out", str(out), "--steps", str(settings["steps"]), "--batch-pairs", str(settings["batch_pairs"])]
    args += ["--eval-pairs", str(settings["eval_pairs"]), "--seed", str(settings["seed"])]
    args += ["--max-prompt-tokens", str(cfg.rollout.max_prompt_tokens)]
    args += ["--max-response-tokens", str(cfg.rollout.max_response_tokens + 1)]  # + EOS
    if reasonrl_main(args) != 0:
        raise SystemExit("fidelity: reasonrl rm train failed")


def _length_stats(lengths: list[int], cap: int) -> dict[str, float]:
    ordered = sorted(lengths)
    quantile = lambda q: float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])  # noqa: E731
    return {
        "mean": statistics.fmean(ordered),
        "p50": quantile(0.5),
        "p90": quantile(0.9),
        "max": float(ordered[-1]),
        "at_cap_fraction": sum(n >= cap for n in ordered) / len(ordered),
    }


def race_side(lengths: list[int], seconds: float, tokens: int, utilisation: list[float], cap: int) -> dict[str, Any]:
    """One side of the rollout race: completed responses, generation time, tokens, calls, slot use, lengths."""
    return {
        "completed": len(lengths),
        "generation_seconds": seconds,
        "tokens": tokens,
        "calls": len(utilisation),
        "slot_utilisation": statistics.fmean(utilisation),
        "lengths": _length_stats(lengths, cap),
    }


def worker_race(config: dict, profile: dict, work: Path, seed: int) -> dict[str, Any]:
    """Completed responses per second of generation: synchronous calls vs T-PPO's pool, same engine and slots.

    One untimed call first (the engine's one-off warm-up, and a first look at the length distribution);
    the pool is then run untimed for as many windows as a capped response needs, so the timed part
    measures it in its steady state (slots of every age), not filling up from empty.  Both modes draw
    prompts from their own copy of the same seeded stream; the mode that goes first alternates by seed.
    """
    from reasonrl.data.source import TrainingStream
    from reasonrl.rollout import SamplingParams
    from reasonrl.rollout.tppo_pool import PoolSequence, RolloutPool, slot_utilisation
    from reasonrl.training.run_inputs import data_spec

    cfg = family_config(config, profile, "tppo", seed)
    family, goal = profile["tppo"], profile["race"]["completed"]
    prompts, samples, cap = family["prompts"], family["samples"], family["cap"]
    window, slots = window_tokens(cap), prompts * samples
    _, engine, encoder, _, _ = _generation_parts(cfg)
    calls = iter(range(10**9))

    def params(max_new_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p, seed=seed * 100_003 + next(calls)
        )

    def encoded(stream: TrainingStream, count: int) -> list:
        batch = []
        while len(batch) < count:
            example = stream.take(1)[0]
            if (ids := encoder(example)) is not None:
                batch.append((example, ids))
        return batch

    def synchronous() -> dict[str, Any]:
        stream, lengths, seconds, tokens, utilisation = TrainingStream(data_spec(cfg), seed), [], 0.0, 0, []
        while len(lengths) < goal:
            batch = [ids for _, ids in encoded(stream, prompts) for _ in range(samples)]
            started = time.perf_counter()
            out = engine.generate(batch, params(cap))
            seconds += time.perf_counter() - started
            lengths += [len(c.token_ids) for c in out]
            tokens += sum(len(c.token_ids) for c in out)
            utilisation.append(slot_utilisation([len(c.token_ids) for c in out])[0])
        return race_side(lengths, seconds, tokens, utilisation, cap)

    def pool() -> dict[str, Any]:
        stream, rollout_pool = TrainingStream(data_spec(cfg), seed), RolloutPool(slots, window, cap)

        def new_group(index: int) -> list[PoolSequence]:
            example, ids = encoded(stream, 1)[0]
            return [PoolSequence(example, ids, index) for _ in range(samples)]

        for _ in range(math.ceil(cap / window)):  # untimed: fill the pool to its steady state
            rollout_pool.refill(new_group)
            rollout_pool.advance(engine, params(window))
        lengths, seconds, tokens, reprefill, utilisation, windows = [], 0.0, 0, 0, [], []
        while len(lengths) < goal:
            rollout_pool.refill(new_group)
            reprefill += sum(len(s.prompt_ids) + len(s.token_ids) for s in rollout_pool.active if s.token_ids)
            started = time.perf_counter()
            advanced = rollout_pool.advance(engine, params(window))
            seconds += time.perf_counter() - started
            finished = [s for s in advanced.sequences if not s.running]
            lengths += [len(s.token_ids) for s in finished]
            windows += [s.windows for s in finished]
            tokens += sum(advanced.new_tokens)
            utilisation.append(slot_utilisation(advanced.new_tokens)[0])
        return race_side(lengths, seconds, tokens, utilisation, cap) | {
            "reprefill_tokens": reprefill,
            "windows_per_response": statistics.fmean(windows),
        }

    warm = engine.generate(
        [ids for _, ids in encoded(TrainingStream(data_spec(cfg), seed + 10_000), slots)], params(cap)
    )
    modes = {"synchronous": synchronous, "pool": pool}
    order = list(modes) if seed % 2 == 0 else list(reversed(modes))
    measured = {name: modes[name]() for name in order}
    for result in measured.values():
        result["completed_per_generation_second"] = result["completed"] / result["generation_seconds"]
        result["tokens_per_generation_second"] = result["tokens"] / result["generation_seconds"]
    return {
        "seed": seed,
        "slots": slots,
        "cap": cap,
        "window": window,
        "order": order,
        "warmup_lengths": _length_stats([len(c.token_ids) for c in warm], cap),
        "modes": measured,
        "pool_over_synchronous": measured["pool"]["completed_per_generation_second"]
        / measured["synchronous"]["completed_per_generation_second"],
    }


# ---------------------------------------------------------------------------------------------- run results


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def run_result(run_dir: Path, arm: str, seed: int, overrides: list[str], patterns: list[str]) -> dict[str, Any]:
    """What the harness keeps of a finished run: accuracy, its curve against training time, mechanism metrics."""
    from reasonrl.config import load_config
    from reasonrl.training.record.metrics import read_metrics

    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = load_config(run_dir / "config.yaml")
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if r.get("step", 0) >= 1]
    responses = cfg.rollout.rollout_prompts * cfg.rollout.samples_per_prompt
    clock, curve = 0.0, [[0.0, 0, summary["accuracy_before"]]]
    finished = 0.0
    for r in steps:
        clock += r["perf/step_seconds"] - (r.get("perf/eval_seconds") or 0.0)
        finished += r.get("rollout/finished_sequences", responses)
        if r.get("eval/accuracy") is not None:
            curve.append([clock, r["step"], r["eval/accuracy"]])
    metrics = {}
    keys = sorted({k for r in steps for k in r if any(fnmatch.fnmatchcase(k, p) for p in patterns)})
    for key in keys:
        values = [r[key] for r in steps if _numeric(r.get(key))]
        if values:
            metrics[key] = {"first": values[0], "mean": statistics.fmean(values), "last": values[-1]}
    return {
        "arm": arm,
        "seed": seed,
        "overrides": overrides,
        "steps": len(steps),
        "eval_prompts": cfg.data.eval_prompts,
        "accuracy_before": summary["accuracy_before"],
        "final_accuracy": summary["accuracy_after"],
        "accuracy_curve": curve,  # [training seconds (evaluation excluded), step, held-out accuracy]
        "train_seconds": clock,
        "wall_seconds": summary["wall_seconds"],
        "finished_responses": finished,
        "finished_per_train_second": finished / clock if clock else None,
        "peak_rss_gb": summary.get("peak_rss_gb"),
        # the machine's load over the run's steps: above the run's threads, its timings are inflated
        "load_average_max": max((r["perf/load_average"] for r in steps if "perf/load_average" in r), default=None),
        "value_pretrain": {k: v for k, v in summary.items() if k.startswith("value_pretrain")},
        "metrics": metrics,
    }


# ---------------------------------------------------------------------------------------------- statistics


def verdict(d: float | None, se: float | None, n: int, threshold: float) -> str:
    """The rule of bench/fidelity.yaml's `targets` header."""
    if d is None or se is None or n < 2:
        return "not testable"
    if d - 2 * se > threshold:
        return "reproduced"
    return "partly" if d > threshold else "not reproduced"


def _run_value(run: dict | None, metric: str, stat: str) -> float | None:
    if run is None:
        return None
    if metric in run and not isinstance(run[metric], dict):
        return run[metric]
    return run["metrics"].get(metric, {}).get(stat)


def _seconds_to(curve: list[list[float]], accuracy: float) -> float:
    """Training seconds of the first evaluation at or above ``accuracy`` (inf if none)."""
    return next((seconds for seconds, _, a in curve if a >= accuracy), math.inf)


def target_values(measure: dict, runs: dict[tuple[str, int], dict], races: dict[int, dict], seeds: list[int]):
    """Per seed: the quantity a target compares (None where it cannot be computed)."""
    kind, metric, stat = measure["kind"], measure.get("metric"), measure.get("stat", "mean")
    out: dict[int, float | None] = {}
    for seed in seeds:
        value = None
        if kind == "within":
            run = runs.get((measure["arm"], seed))
            a, b = _run_value(run, metric, stat), _run_value(run, measure["minus"], stat)
            value = a - b if a is not None and b is not None else None
        elif metric.startswith("race/"):
            race = races.get(seed)
            if race is not None:
                key = metric.removeprefix("race/")
                value = race["modes"][measure["a"]][key] / race["modes"][measure["b"]][key]
        elif metric == "seconds_to_sync_best_accuracy":  # a: the synchronous run, whose best accuracy is the bar
            a, b = runs.get((measure["a"], seed)), runs.get((measure["b"], seed))
            if a is not None and b is not None:
                best = max(acc for _, _, acc in a["accuracy_curve"][1:])
                if best > a["accuracy_before"]:  # no learning, nothing to time
                    value = _seconds_to(a["accuracy_curve"], best) / _seconds_to(b["accuracy_curve"], best)
        else:
            a = _run_value(runs.get((measure["a"], seed)), metric, stat)
            b = _run_value(runs.get((measure["b"], seed)), metric, stat)
            if a is not None and b is not None:
                value = a - b if kind == "difference" else (a / b if b else None)
        out[seed] = value
    return out


def evaluate_targets(config: dict, runs: dict, races: dict, seeds: list[int]) -> list[dict[str, Any]]:
    evaluated = []
    for target in config["targets"]:
        per_seed = target_values(target["measure"], runs, races, seeds)
        stats = mean_se([v for v in per_seed.values() if v is not None])
        evaluated.append(
            {
                **target,
                "per_seed": {str(s): v for s, v in per_seed.items()},
                "d": stats["mean"],
                "se": stats["se"],
                "n": stats["n"],
                "verdict": verdict(stats["mean"], stats["se"], stats["n"], target["threshold"]),
            }
        )
    return evaluated


def arm_summaries(config: dict, arms: list[str], runs: dict, seeds: list[int]) -> dict[str, Any]:
    out = {}
    for arm in arms:
        done = [runs[(arm, s)] for s in seeds if (arm, s) in runs]
        keys = sorted({k for r in done for k in r["metrics"]})
        out[arm] = {
            **{k: v for k, v in config["arms"][arm].items() if k != "priority"},
            "seeds_done": [r["seed"] for r in done],
            **{
                key: mean_se([r[key] for r in done])
                for key in ("final_accuracy", "accuracy_before", "train_seconds", "finished_per_train_second")
            },
            "metrics": {
                key: {
                    stat: mean_se([r["metrics"][key][stat] for r in done if key in r["metrics"]])
                    for stat in ("first", "mean", "last")
                }
                for key in keys
            },
        }
    return out


def race_summary(races: dict[int, dict]) -> dict[str, Any] | None:
    if not races:
        return None
    modes = ("synchronous", "pool")
    keys = ("completed_per_generation_second", "tokens_per_generation_second", "slot_utilisation")
    return {
        "pool_over_synchronous": mean_se([r["pool_over_synchronous"] for r in races.values()]),
        **{f"{m}/{k}": mean_se([r["modes"][m][k] for r in races.values()]) for m in modes for k in keys},
        "per_seed": {str(s): r for s, r in sorted(races.items())},
    }


# ---------------------------------------------------------------------------------------------- plot


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, runs = result["arms"], result["runs"]
    value_arms = [a for a, s in arms.items() if s["family"] == "value" and s["final_accuracy"]["n"]]
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))

    def bars(ax, names, getter, title, ylabel):
        stats = [getter(arms[n]) for n in names]
        shown = [(n, s) for n, s in zip(names, stats, strict=True) if s and s["n"]]
        if not shown:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        for i, (_, s) in enumerate(shown):
            ax.bar(i, s["mean"], yerr=s["se"] or 0, color="tab:blue" if i else "tab:grey", alpha=0.6, capsize=3)
            ax.plot([i] * len(s["values"]), s["values"], "k.", ms=4)
        ax.set_xticks(range(len(shown)), [n for n, _ in shown], rotation=60, ha="right", fontsize=7)
        ax.set(title=title, ylabel=ylabel)
        ax.grid(alpha=0.3, axis="y")

    metric = lambda key, stat: lambda s: s["metrics"].get(key, {}).get(stat)  # noqa: E731
    bars(axes[0, 0], value_arms, lambda s: s["final_accuracy"], "value family: final held-out accuracy", "accuracy")
    before = mean_se([v for a in value_arms for v in arms[a]["accuracy_before"]["values"]])
    if before["n"]:
        axes[0, 0].axhline(before["mean"], color="black", ls="--", lw=0.8, label="before training")
        axes[0, 0].legend(fontsize=7)
    bars(
        axes[0, 1],
        value_arms,
        metric("critic/value_error_first_token", "first"),
        "|V(s0) - G| at the first token, RL step 1",
        "value error",
    )
    bars(
        axes[0, 2],
        value_arms,
        metric("critic/advantage_first_10pct", "first"),
        "mean advantage, first 10% of tokens, RL step 1",
        "advantage",
    )
    race = result.get("race")
    ax = axes[1, 0]
    if race and race["synchronous/completed_per_generation_second"]["n"]:
        for i, mode in enumerate(("synchronous", "pool")):
            s = race[f"{mode}/completed_per_generation_second"]
            ax.bar(i, s["mean"], yerr=s["se"] or 0, color=("tab:grey", "tab:red")[i], alpha=0.6, capsize=3)
            ax.plot([i] * len(s["values"]), s["values"], "k.", ms=4)
        ax.set_xticks([0, 1], ["synchronous", "T-PPO pool"])
    ax.set(title="rollout race: completed responses / generation second", ylabel="responses / s")
    ax.grid(alpha=0.3, axis="y")
    ax = axes[1, 1]
    for key, run in runs.items():
        if run["arm"] in ("t_ppo", "t_ppo_sync"):
            seconds, _, accuracy = zip(*run["accuracy_curve"], strict=True)
            colour = "tab:red" if run["arm"] == "t_ppo" else "tab:grey"
            ax.plot([s / 60 for s in seconds], accuracy, marker="o", color=colour, label=key, alpha=0.7)
    ax.set(title="T-PPO vs synchronous twin", xlabel="training minutes (evaluation excluded)", ylabel="accuracy")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    ax = axes[1, 2]
    ax.axis("off")
    number = lambda x: "   -   " if x is None else f"{x:7.3f}"  # noqa: E731
    lines = [f"{t['verdict']:>15}  {number(t['d'])} ± {number(t['se'])}  {t['id']}" for t in result["targets"]]
    ax.text(
        0,
        1,
        "targets (fixed before the runs): verdict, d ± SE\n\n" + "\n".join(lines),
        va="top",
        family="monospace",
        fontsize=7,
    )
    fig.suptitle(f"paper fidelity, profile {result['profile']}: {result['description']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- harness


def _describe(measure: dict) -> str:
    stat = f"[{measure['stat']}]" if "stat" in measure else ""
    if measure["kind"] == "within":
        return f"{measure['arm']}: {measure['metric']}{stat} − {measure['minus']}{stat}"
    operator = "−" if measure["kind"] == "difference" else "÷"
    return f"{measure['metric']}{stat}: {measure['a']} {operator} {measure['b']}"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def markdown_report(result: dict[str, Any]) -> str:
    """Per paper, a table of its targets: claim, measure, d ± SE over the seeds, per seed, verdict."""
    done = f"{result['runs_done']} of {result['runs_planned']} runs"
    lines = [f"`{result['profile']}` profile, {done}, {result['updated']}"]
    for paper in dict.fromkeys(t["paper"] for t in result["targets"]):
        lines += ["", f"**{paper}**", "", "| target | claim | measure | d ± SE (n) | per seed | threshold | verdict |"]
        lines.append("|---|---|---|---|---|---|---|")
        for t in (t for t in result["targets"] if t["paper"] == paper):
            per_seed = ", ".join(_number(v) for v in t["per_seed"].values())
            spread = f"{_number(t['d'])} ± {_number(t['se'])} ({t['n']})"
            row = [t["id"], t["claim"], _describe(t["measure"]), spread, per_seed, f"{t['threshold']:g}", t["verdict"]]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(text)
    scratch.replace(path)


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.config, self.sha256 = load_harness_config(args.config)
        if args.profile not in self.config["profiles"]:
            raise SystemExit(f"fidelity: unknown profile {args.profile!r}; choose {', '.join(self.config['profiles'])}")
        self.args, self.profile = args, self.config["profiles"][args.profile]
        self.work = args.work or ROOT / "runs" / f"fidelity-{args.profile}"
        self.out = args.out
        self.seeds = list(self.profile["seeds"])
        self.arms = selected_arms(self.config, self.profile, args.arms)  # what this invocation runs
        self.profile_arms = selected_arms(self.config, self.profile, None)  # what the report covers
        self.logs = self.work / "logs"
        self.failed: list[str] = []

    def check_work_dir(self) -> None:
        """A work directory belongs to one profile and one version of the configuration (targets fixed before runs)."""
        stamp = self.work / "harness.json"
        mine = {"profile": self.args.profile, "config_sha256": self.sha256}
        if stamp.exists():
            theirs = json.loads(stamp.read_text())
            if theirs != mine:
                started = f"{theirs['profile']} / config {theirs['config_sha256'][:12]}"
                raise SystemExit(
                    f"fidelity: {self.work} was started with {started}, not {mine['profile']} / "
                    f"{mine['config_sha256'][:12]} (targets are fixed before runs); give another --work or delete it"
                )
        else:
            _write_atomic(stamp, json.dumps(mine, indent=2) + "\n")

    def child(self, name: str, command: list[str]) -> bool:
        """Run one stage or run in its own process, output to logs/NAME.log; True when it succeeded."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        started = time.perf_counter()
        with log.open("a") as handle:
            handle.write(f"\n$ {' '.join(command)}\n")
            handle.flush()
            code = subprocess.run(
                command, stdout=handle, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT
            ).returncode
        seconds = time.perf_counter() - started
        status = "done" if code == 0 else f"FAILED (exit {code}; see {log})"
        print(f"fidelity: {name}: {status} in {seconds:.0f} s", file=sys.stderr, flush=True)
        if code != 0:
            self.failed.append(name)
        return code == 0

    def worker(self, *extra: str) -> list[str]:
        command = [sys.executable, str(Path(__file__).resolve()), "--profile", self.args.profile]
        return [*command, "--config", str(self.args.config), "--work", str(self.work), *extra]

    def stage_rm(self) -> None:
        if (self.work / "rm" / "summary.json").exists():
            print("fidelity: rm: finished before, skipped", file=sys.stderr)
            return
        self.child("rm", self.worker("--worker", "rm"))

    def stage_race(self, seed: int) -> None:
        path = self.work / "race" / f"seed{seed}.json"
        if path.exists():
            print(f"fidelity: race seed {seed}: finished before, skipped", file=sys.stderr)
            return
        self.child(f"race-seed{seed}", self.worker("--worker", "race", "--seed", str(seed)))

    def stage_run(self, arm: str, seed: int) -> None:
        name = f"{arm}-seed{seed}"
        result_path, run_dir = self.work / "results" / f"{name}.json", self.work / "runs" / name
        if result_path.exists():
            print(f"fidelity: {name}: finished before, skipped", file=sys.stderr)
            return
        if self.config["arms"][arm]["family"] == "value" and not (self.work / "rm" / "summary.json").exists():
            print(f"fidelity: {name}: skipped, the reward model (stage rm) is missing", file=sys.stderr)
            self.failed.append(name)
            return
        overrides = train_overrides(self.config, self.profile, arm, seed, self.work)
        if not (run_dir / "summary.json").exists():
            if run_dir.exists() and not any((run_dir / "checkpoints").glob("step-*")):
                shutil.rmtree(run_dir)  # killed before its first checkpoint: start it again
            location = [f"run.output_dir={run_dir.parent}", f"run.name={name}"]
            command = [sys.executable, "-m", "reasonrl", "train", self.config["arms"][arm]["preset"]]
            if not self.child(name, [*command, *overrides, *location, "--quiet"]):
                return
        result = run_result(run_dir, arm, seed, overrides, self.config["mechanism_metrics"])
        _write_atomic(result_path, json.dumps(result, indent=2) + "\n")
        if not self.args.keep_models:
            for part in PRUNED:
                shutil.rmtree(run_dir / part, ignore_errors=True)

    def plan(self) -> list[tuple[str, Any]]:
        """Stages in order: the reward model, the race, then the runs by priority (core arms first), seed, arm."""
        families = {self.config["arms"][a]["family"] for a in self.arms}
        steps: list[tuple[str, Any]] = [("rm", None)] if "value" in families else []
        steps += [("race", s) for s in self.seeds] if "tppo" in families else []
        order = sorted(
            ((self.config["arms"][a].get("priority", 0), s, i, a) for i, a in enumerate(self.arms) for s in self.seeds)
        )
        return steps + [("run", (a, s)) for _, s, _, a in order]

    def run(self) -> int:
        self.check_work_dir()
        # `kill HARNESS` stops the running child too (subprocess.run kills it on the way out); its run
        # continues from its last checkpoint next time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        for kind, item in self.plan():
            if kind == "rm":
                self.stage_rm()
            elif kind == "race":
                self.stage_race(item)
            else:
                self.stage_run(*item)
            self.report()
        if self.failed:
            print(f"fidelity: failed: {', '.join(self.failed)}; run the same command again to retry", file=sys.stderr)
        return 1 if self.failed else 0

    def report(self) -> dict[str, Any]:
        """Aggregate whatever has finished into OUT/fidelity_PROFILE.json and .png."""
        runs = {}
        for arm in self.profile_arms:  # every finished run, whatever --arms this invocation ran
            for seed in self.seeds:
                path = self.work / "results" / f"{arm}-seed{seed}.json"
                if path.exists():
                    runs[(arm, seed)] = json.loads(path.read_text())
        races = {}
        for seed in self.seeds:
            path = self.work / "race" / f"seed{seed}.json"
            if path.exists():
                races[seed] = json.loads(path.read_text())
        rm = {}
        for name in ("pairs_summary", "summary"):
            path = self.work / "rm" / f"{name}.json"
            if path.exists():
                rm[name] = json.loads(path.read_text())
        result = {
            "profile": self.args.profile,
            "description": self.profile["description"],
            "config_file": str(self.args.config),
            "config_sha256": self.sha256,
            "config": {k: v for k, v in self.config.items() if k != "profiles"} | {"profile": self.profile},
            "work_dir": str(self.work),
            "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
            "seeds": self.seeds,
            "runs_done": len(runs),
            "runs_planned": len(self.profile_arms) * len(self.seeds),
            "reward_model": rm,
            "race": race_summary(races),
            "arms": arm_summaries(self.config, self.profile_arms, runs, self.seeds),
            "targets": evaluate_targets(self.config, runs, races, self.seeds),
            "runs": {f"{arm}-seed{seed}": run for (arm, seed), run in runs.items()},
        }
        self.out.mkdir(parents=True, exist_ok=True)
        stem = self.out / f"fidelity_{self.args.profile}"
        _write_atomic(stem.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
        plot(result, stem.with_suffix(".png"))
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu", help="smoke, cpu or gpu (bench/fidelity.yaml)")
    parser.add_argument("--arms", nargs="+", help="only these arms of the profile")
    parser.add_argument("--work", type=Path, help="run directories and per-run results (default runs/fidelity-PROFILE)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the JSON and PNG go")
    parser.add_argument("--config", type=Path, default=CONFIG, help=argparse.SUPPRESS)
    parser.add_argument("--keep-models", action="store_true", help="keep each run's checkpoints and final model")
    parser.add_argument(
        "--markdown", action="store_true", help="print OUT/fidelity_PROFILE.json's targets as tables; runs nothing"
    )
    parser.add_argument("--worker", choices=("rm", "race"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_report(json.loads((args.out / f"fidelity_{args.profile}.json").read_text())), end="")
        return 0
    harness = Harness(args)
    if args.worker == "rm":
        worker_rm(harness.config, harness.profile, harness.work)
    elif args.worker == "race":
        result = worker_race(harness.config, harness.profile, harness.work, args.seed)
        _write_atomic(harness.work / "race" / f"seed{args.seed}.json", json.dumps(result, indent=2) + "\n")
    else:
        return harness.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
