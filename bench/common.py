"""What the benchmark scripts share: statistics over seeds and the environment of their child processes."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def mean_se(values: list[float | None]) -> dict[str, Any]:
    """Mean and standard error (sample std / sqrt(n)) over seeds, ignoring missing values; None where undefined."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    mean = statistics.fmean(values) if values else None
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= 2 else None
    return {"mean": mean, "se": se, "n": len(values), "values": values}


def cpu_model() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it ("unknown" where it cannot be read)."""
    path = Path("/proc/cpuinfo")
    lines = path.read_text().splitlines() if path.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def child_env() -> dict[str, str]:
    """This environment with the repository on PYTHONPATH: what a `python -m reasonrl` child runs in."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def seeded_bench_arguments(description: str, profiles: dict, name: str, argv: list[str] | None, add_arguments=None):
    """The options of a per-seed fidelity benchmark: --profile, --seeds, --steps, --work (default
    runs/NAME-PROFILE) and --out, and any that ``add_arguments(parser)`` adds, parsed from ``argv``."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--profile", choices=sorted(profiles), default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=10, help="RL steps of every run")
    parser.add_argument("--work", type=Path, help=f"runs and per-run results (default runs/{name}-PROFILE)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    args.work = args.work or ROOT / "runs" / f"{name}-{args.profile}"
    return args


def reasonrl(*arguments: str) -> str:
    """Run ``python -m reasonrl ARGUMENTS`` in its own process, from the repository; its stdout."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "reasonrl", *arguments]
    done = subprocess.run(command, env=child_env(), cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:  # the child's own error, not only its exit status
        sys.stderr.write(done.stderr[-4000:])
        done.check_returncode()
    return done.stdout


def cached(path: Path, produce) -> dict:
    """``produce()``'s JSON, computed once: a stage whose file exists is not run again."""
    import json

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(produce(), indent=2) + "\n")
    return json.loads(path.read_text())


def write_result(out: Path, stem: str, result: dict, plot, shown: tuple[str, ...]) -> None:
    """OUT/STEM.json and OUT/STEM.png (``plot(result, path)``), and the ``shown`` keys printed as JSON."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / f"{stem}.png")
    print(json.dumps({k: result[k] for k in shown}, indent=2))
