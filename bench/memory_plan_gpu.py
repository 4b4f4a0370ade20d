"""The memory plan against peak GPU memory measured by ``bench/train_side.py`` and ``bench/train_side_trace.py``.

    python bench/memory_plan_gpu.py [--results bench/results/train_side_gpu_h100.json ...] [--out FILE]

For each reasonrl configuration of the given result files that fitted, ``plan_memory`` is run on the same
settings (the run's overrides) with ``train.microbatch_tokens`` set to the tokens its largest micro-batch
held (the embedded tokens of the update ÷ its micro-batches), and its total less the rollout engine (the
benchmark holds none) is compared with the update's ``max_memory_allocated``. Nothing runs on the GPU
here: it reads the measurements. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT
from train_side import model_config

RESULTS = ("train_side_gpu_h100.json", "train_side_trace_h100.json")


def measured_points(path: Path) -> list[dict]:
    """The fitted reasonrl configurations of one result file: shape, overrides, tokens per micro-batch, peak."""
    result = json.loads(path.read_text())
    points = []
    for line in result.get("configurations", result.get("cases", [])):
        update = line.get("update")
        if line["implementation"] == "trl" or not update:
            continue
        embedded = line["real_tokens"] / (1 - update["pad_fraction"])
        points.append({"file": path.name, "shape": line["shape"], "implementation": line["implementation"],
                       "cap": line["cap"], "overrides": line["overrides"],
                       "microbatch_tokens": round(embedded / update["microbatches"]),
                       "measured_gib": update["peak_memory_gb"]})  # fmt: skip
    return points


def predicted_gib(point: dict) -> float:
    from reasonrl.config import load_config
    from reasonrl.models.memory_plan import gib, plan_memory

    overrides = [o for o in point["overrides"] if not o.startswith("train.microbatch_tokens=")]
    cfg = load_config("grpo", [*overrides, f"train.microbatch_tokens={point['microbatch_tokens']}"])
    plan = plan_memory(cfg, model_config(point["shape"], False), device_type="cuda")
    return gib(plan.total - plan.components.get("rollout engine", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, nargs="+", default=[ROOT / "bench" / "results" / r for r in RESULTS])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows, problems = [], []
    for point in (p for path in args.results for p in measured_points(path)):
        try:
            predicted = predicted_gib(point)
        except Exception as error:  # a setting this reasonrl refuses (e.g. a budget under one full sequence)
            problems.append({**point, "why": str(error).splitlines()[-1]})
            continue
        ratio = point["measured_gib"] / predicted
        rows.append({**point, "predicted_gib": round(predicted, 2), "measured_over_predicted": round(ratio, 3)})
    within = [r for r in rows if abs(r["measured_over_predicted"] - 1) <= 0.15]
    result = {"points": rows, "not_planned": problems, "within_15_percent": f"{len(within)}/{len(rows)}"}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
