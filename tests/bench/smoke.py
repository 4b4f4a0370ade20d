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
