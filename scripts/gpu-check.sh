#!/usr/bin/env bash
# The GPU checks on a machine that has CUDA torch, transformers and peft but no package index: installs the
# wheels of .whl/ (scripts/wheelhouse.sh, about 3.3 MB) with pip --no-index into a --target folder put on
# PYTHONPATH (made for this run: new, private, removed at the end; the system Python's own packages stay
# untouched), then runs `pytest -m gpu` and `bench/train_side.py --profile gpu` (where that file exists), each
# within its time budget: 8 minutes in all by default (GPU_CHECK_BUDGET_S). Every result is JSON under OUT,
# with the device's name: OUT/gpu_check.json (each step's status), OUT/device.json, OUT/pytest.json,
# OUT/train_side/.
#   usage: scripts/gpu-check.sh OUT      (PYTHON=... for another interpreter)
# Exit code 0 when no step failed or ran out of time. The steps themselves: scripts/gpu_check.py.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: scripts/gpu-check.sh OUT" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
exec "${PYTHON:-python3}" scripts/gpu_check.py run "$1"
