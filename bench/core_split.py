"""What splitting a machine's cores between two processes costs each of them: the premise of asynchronous
rollouts on a CPU (a producer and a trainer, one thread each, on two cores).

    python bench/core_split.py [--steps 3] [--out bench/results/core_split_cpu.json] [key=value ...]

Runs ``bench/rl_step.py`` (the main job's RL step, or the overrides given) three ways, one after the other:

- ``all_cores``: one process with torch's default threads, alone on the machine (a synchronous run);
- ``one_core``: one process with one thread, pinned to core 0, alone;
- ``one_core_beside_another``: two such processes at once, pinned to cores 0 and 1 (each core busy, as
  when a producer and a trainer run side by side).

Prints and writes one JSON object: each run's per-phase medians (generation, scoring, log-probs, update, step)
and the ratios that answer the question: ``one_core_over_all_cores`` (what one thread loses against all of
them) and ``beside_over_one_core`` (what a busy neighbour core costs on top). A thread count changes the
numerics, so runs sample different tokens: ``generate_per_token`` compares generation per generated token.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, child_env, cpu_model


def rl_step(steps: int, overrides: list[str], core: int | None) -> subprocess.Popen:
    """bench/rl_step.py as a child, pinned to ``core`` with one thread, or free with torch's default threads."""
    command = [sys.executable, str(ROOT / "bench" / "rl_step.py"), "--steps", str(steps), *overrides]
    env = child_env()
    if core is not None:
        command = ["taskset", "-c", str(core), *command]
        env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"bench/rl_step.py failed with exit code {process.returncode}")
    return json.loads(out[out.index("{") :])


def ratios(run: dict, baseline: dict) -> dict[str, float]:
    """RUN's seconds over BASELINE's, per phase, for the whole step, and for generation per generated token."""
    out = {"step": run["seconds_per_step"] / baseline["seconds_per_step"]}
    out |= {phase: run["seconds"][phase] / baseline["seconds"][phase] for phase in baseline["seconds"]}
    per_token = [r["seconds"]["generate"] / r["tokens_generated_per_step"] for r in (run, baseline)]
    return out | {"generate_per_token": per_token[0] / per_token[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "core_split_cpu.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("bench/core_split.py needs at least two cores")
    runs = {
        "all_cores": finished(rl_step(args.steps, args.overrides, None)),
        "one_core": finished(rl_step(args.steps, args.overrides, 0)),
    }
    pair = [rl_step(args.steps, args.overrides, core) for core in (0, 1)]
    runs["one_core_beside_another"], runs["its_neighbour"] = [finished(p) for p in pair]
    result = {
        "date": datetime.date.today().isoformat(),
        "command": "python bench/core_split.py " + " ".join(sys.argv[1:]),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "runs": runs,
        "one_core_over_all_cores": ratios(runs["one_core"], runs["all_cores"]),
        "beside_over_one_core": ratios(runs["one_core_beside_another"], runs["one_core"]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("machine", "one_core_over_all_cores", "beside_over_one_core")}, indent=2))


if __name__ == "__main__":
    main()
