"""One RL step on a GPU, split into its stages, for grpo and vapo, and TRL's GRPOTrainer on the same work.

    python bench/gpu_step.py [--steps 4] [--response-tokens 512] [--out bench/results/gpu_step.json]

For each preset (``grpo``, ``vapo``) on the embedded model (SmolLM2-135M-Instruct) with the policy on
CUDA and vLLM generating, colocated in sleep mode (``model.device=cuda rollout.engine=vllm``; ``--engine hf``
generates with transformers' ``generate`` on the same GPU instead, for a machine without vLLM), and
answers of up to ``--response-tokens`` tokens (``rollout.max_response_tokens``; the arithmetic task's
answers stop earlier when the model ends them), it reports the median over the steps after the first
(vLLM's start-up and CUDA-graph capture land in the first) of:

- seconds per step, and its split into generate / score / log-prob / values / update / critic update;
- rollout tokens/s (generated tokens ÷ generate seconds) and update tokens/s (prompt + response tokens of
  the trained batch × epochs ÷ update seconds);
- model-FLOP utilisation of the update: 6 · parameters · tokens processed ÷ update seconds ÷ the
  device's peak dense bf16 FLOP/s (attention FLOPs left out, as in the usual 6N estimate);
- peak GPU memory (``torch.cuda.max_memory_allocated`` of the trainer; vLLM's own pool is not in it).

Then ``bench/vs_trl.py --device cuda`` runs reasonrl's grpo and TRL 1.16's ``GRPOTrainer`` (vLLM
colocated) on identical work; ``speedup_per_step`` = TRL ÷ reasonrl seconds per step.
Needs a CUDA device and the ``gpu`` and ``bench`` extras (``bash scripts/bootstrap.sh bench`` on an
NVIDIA machine).  ``--device cpu`` runs the same measurements on the CPU with the fast engine, to check
the script, not to quote.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Peak dense bf16 tensor-core FLOP/s (vendor data sheets; SXM parts).
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}

GPU_MEMORY = "perf/peak_gpu_memory_gb"
STAGES = {
    "generate": "perf/generate_seconds",
    "score": "perf/score_seconds",
    "logprob": "perf/logprob_seconds",
    "values": "perf/value_seconds",
    "update": "perf/update_seconds",
    "critic_update": "perf/critic_update_seconds",
}


def device_description(device: str) -> dict:
    import platform

    import torch

    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
        return {"device": name, "peak_bf16_flops": peak, "torch": torch.__version__, "cuda": torch.version.cuda}
    return {"device": f"CPU ({platform.processor() or platform.machine()})", "peak_bf16_flops": None}


def default_engine(device: str) -> str:
    """vLLM on a GPU where it is installed, else transformers' generate; the fast engine on the CPU."""
    import importlib.util

    if device == "cpu":
        return "fast"
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def run_preset(preset: str, args: argparse.Namespace) -> dict:
    from reasonrl.config import load_config
    from reasonrl.models.load import load_model
    from reasonrl.training.loop import fit
    from reasonrl.training.record.metrics import read_metrics

    overrides = [
        f"model.device={args.device}",
        f"rollout.engine={args.engine}",
        f"rollout.max_response_tokens={args.response_tokens}",
        f"train.rollout_steps={args.steps}",
        "data.eval_prompts=8",
        f"run.eval_every={10**6}",
        f"run.save_every={10**6}",
        *args.overrides,
    ]
    cfg = load_config(preset, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        fit(cfg, Path(tmp), preset=preset, show_progress=False)
        records = [r for r in read_metrics(Path(tmp) / "metrics.jsonl") if r["step"] > 0]
    timed_steps = records[1:] or records  # the first step carries vLLM's start-up
    median = lambda key: statistics.median(r.get(key, 0.0) for r in timed_steps)  # noqa: E731
    parameters = sum(p.numel() for p in load_model(cfg.model.name_or_path).parameters())
    epochs = cfg.train.epochs_per_rollout
    update_tokens = median("perf/batch_tokens") * epochs
    update_flops = 6 * parameters * update_tokens
    peak = device_description(args.device)["peak_bf16_flops"]
    step_seconds = [r["perf/step_seconds"] - r.get("perf/eval_seconds", 0.0) for r in timed_steps]
    return {
        "preset": preset,
        "engine": args.engine,
        "overrides": overrides,
        "parameters": parameters,
        "steps_timed": len(timed_steps),
        "seconds_per_step": statistics.median(step_seconds),
        "seconds": {name: median(key) for name, key in STAGES.items() if any(key in r for r in timed_steps)},
        "response_length_mean": median("rollout/response_length"),
        "rollout_tokens_per_second": median("rollout/tokens_generated") / max(1e-9, median("perf/generate_seconds")),
        "update_tokens_per_second": update_tokens / max(1e-9, median("perf/update_seconds")),
        "update_mfu": update_flops / median("perf/update_seconds") / peak if peak else None,
        "peak_gpu_memory_gb": max((r[GPU_MEMORY] for r in records if GPU_MEMORY in r), default=None),
        "peak_rss_gb": max(r["perf/peak_rss_gb"] for r in records),
    }


def write_partial(result: dict, out: Path | None) -> None:
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--response-tokens", type=int, default=512)
    parser.add_argument("--presets", default="grpo,vapo")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument(
        "--engine",
        choices=["vllm", "hf", "paged", "fast"],
        default=None,
        help="rollout engine (default: vllm on cuda where it is installed, else hf; fast on the cpu); paged: "
        "transformers' continuous batching, and TRL's use_transformers_paged",
    )
    parser.add_argument("--trl-steps", type=int, default=6, help="steps of the TRL comparison (0 = skip it)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for the reasonrl runs")
    args = parser.parse_args()
    args.engine = args.engine or default_engine(args.device)
    if args.worker:  # one preset per process: each gets a fresh GPU and its own peak memory
        print(json.dumps(run_preset(args.worker, args)))
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("bench/gpu_step.py needs a CUDA device (or --device cpu to check the script)")
    result: dict = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        **device_description(args.device),
        "response_tokens": args.response_tokens,
        "engine": args.engine,
        "presets": {},
    }
    passthrough = [
        f"--steps={args.steps}",
        f"--response-tokens={args.response_tokens}",
        f"--device={args.device}",
        f"--engine={args.engine}",
    ]
    for preset in args.presets.split(","):
        command = [sys.executable, __file__, "--worker", preset, *passthrough, *args.overrides]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        if done.returncode == 0:
            result["presets"][preset] = json.loads(done.stdout.strip().splitlines()[-1])
        else:  # keep the other presets' numbers; the worker's error is on stderr above
            result["presets"][preset] = {"error": f"exit status {done.returncode}"}
        write_partial(result, args.out)  # a run stopped later keeps what it measured so far
    if args.trl_steps:
        vs_trl = Path(__file__).with_name("vs_trl.py")
        command = [
            sys.executable,
            str(vs_trl),
            f"--steps={args.trl_steps}",
            f"--max-new-tokens={args.response_tokens}",
            f"--device={args.device}",
            f"--engine={args.engine}",
        ]
        output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
        comparison = json.loads(output[output.index("{") :])
        result["vs_trl"] = comparison
        result["speedup_per_step"] = comparison["speedup_per_step"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
