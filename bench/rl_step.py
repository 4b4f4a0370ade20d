"""Time the RL step of the demo configuration (DAPO, arithmetic, smollm2-135m) and print one JSON object.

    python bench/rl_step.py [--steps 3] [--preset dapo] [key=value ...]

Reports, per rollout step (median over the steps), the seconds spent generating, scoring, computing
log-probs and updating, tokens generated per second, the share of the trainer's forward tokens that
were padding (``perf/pad_fraction``), its micro-batches, and the run's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from reasonrl.config import load_config
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics

PHASES = {
    "generate": "perf/generate_seconds",
    "score": "perf/score_seconds",
    "logprob": "perf/logprob_seconds",
    "update": "perf/update_seconds",
    "step": "perf/step_seconds",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--preset", default="dapo")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = [f"train.rollout_steps={args.steps}", "data.eval_prompts=8", f"run.eval_every={10**6}", *args.overrides]
    cfg = load_config(args.preset, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        summary = fit(cfg, Path(tmp), preset=args.preset, show_progress=False)
        steps = [r for r in read_metrics(Path(tmp) / "metrics.jsonl") if r["step"] > 0]
    median = {name: statistics.median(r[key] for r in steps) for name, key in PHASES.items()}
    tokens = statistics.median(r["rollout/tokens_generated"] for r in steps)
    print(
        json.dumps(
            {
                "preset": args.preset,
                "overrides": overrides,
                "model": cfg.model.name_or_path,
                "steps": len(steps),
                "seconds_per_step": median["step"],
                "seconds": {k: v for k, v in median.items() if k != "step"},
                "tokens_generated_per_step": tokens,
                "generated_tokens_per_second": tokens / median["generate"],
                "step_tokens_per_second": tokens / median["step"],
                "generation_passes_per_step": statistics.median(r["rollout/generation_passes"] for r in steps),
                "pad_fraction": statistics.median(r["perf/pad_fraction"] for r in steps),
                "microbatches_per_step": statistics.median(r["perf/microbatches"] for r in steps),
                "peak_rss_gb": summary["peak_rss_gb"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
