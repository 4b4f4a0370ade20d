#!/usr/bin/env bash
# Download into .whl/ the wheels that scripts/gpu-check.sh installs on a GPU machine without a network:
# what reasonrl and its GPU checks need beyond an image with CUDA torch, transformers and peft
# (the list and the image's assumed packages: scripts/wheelhouse.txt). About 3.3 MB, 10 wheels.
#   usage: scripts/wheelhouse.sh            (wheels for CPython 3.12 on manylinux x86_64)
#          WHEELHOUSE_PYTHON=3.11 scripts/wheelhouse.sh   (for another Python of the target machine)
# .whl/ is emptied first: two versions of one package stop the install there.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-.whl}
TARGET_PYTHON=${WHEELHOUSE_PYTHON:-3.12}

rm -rf "$WHEELHOUSE"
mkdir -p "$WHEELHOUSE"
platforms=()
for platform in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$platform")
done
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
  --python-version "$TARGET_PYTHON" "${platforms[@]}" -d "$WHEELHOUSE" -r scripts/wheelhouse.txt
count=$(find "$WHEELHOUSE" -type f -name '*.whl' | wc -l)
echo "reasonrl: $count wheels for Python $TARGET_PYTHON in $WHEELHOUSE/, $(du -cb "$WHEELHOUSE"/*.whl | tail -1 | cut -f1) bytes"
