"""Run a fidelity benchmark's smoke profile the way a user runs the script."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_smoke(script: str, work: Path, out: Path) -> subprocess.CompletedProcess:
    """``python bench/SCRIPT --profile smoke --seeds 0 --steps 1 --work WORK --out OUT`` (15 minutes at most)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, str(ROOT / "bench" / script), "--profile", "smoke", "--seeds", "0", "--steps", "1"]
    command += ["--work", str(work), "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)


def smoke_result(script: str, work: Path, out: Path) -> dict:
    """``run_smoke``, checked: exit status 0 and a PNG beside the JSON; returns the JSON result."""
    import json

    done = run_smoke(script, work, out)
    assert done.returncode == 0, done.stderr[-3000:]
    stem = f"{Path(script).stem}_smoke"
    assert (out / f"{stem}.png").stat().st_size > 0
    return json.loads((out / f"{stem}.json").read_text())
