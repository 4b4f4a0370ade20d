"""Where the training side's time goes: repeated timings and an operator profile of one update per case.

    python bench/train_side_trace.py --out DIR [--smoke] [--budget-seconds S]

``bench/train_side.py`` times each pass once per answer cap; this script takes a few of its cases (listed in
``CASES``), runs each pass once to warm up on the full batch (kernels, the allocator's blocks, AdamW's
states), then ``REPEATS`` timed times, and profiles one more update with ``torch.profiler`` (operators by
self device time on the GPU, self CPU time on the CPU). Each case runs in its own process. Writes
DIR/train_side_trace.json (timings, peak memory, the memory plan's prediction) and DIR/trace_<case>.txt
(the profiler's table), at most 8 files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import child_env
from gpu_step import device_description
from train_side import (
    PROMPT_TOKENS,
    SMOKE_PROMPT_TOKENS,
    ReasonrlPasses,
    Sweep,
    TokenCounter,
    model_config,
    pass_flops,
    rollout_rows,
)
from train_side_trl import TrlPasses

REPEATS = 3
# (shape, implementation, cap, rows, gradient checkpointing): the 1.5B target at 4k with checkpointing
# on both sides (TRL's default), and the 0.5B cap where packed lanes ran slowest on the H100 without it.
CASES = (
    ("qwen2.5-1.5b", "reasonrl", 4096, 16, True),
    ("qwen2.5-1.5b", "reasonrl_padded", 4096, 16, True),
    ("qwen2.5-1.5b", "trl", 4096, 16, True),
    ("qwen2.5-0.5b", "reasonrl", 1024, 16, False),
    ("qwen2.5-0.5b", "reasonrl_padded", 1024, 16, False),
)


def case_name(case: tuple) -> str:
    shape, implementation, cap, _, checkpointing = case
    return f"{shape}_{implementation}_{cap}{'_ckpt' if checkpointing else ''}"


def run_case(case: tuple, smoke: bool, out: Path) -> dict:
    """One case in this process: warm-up, REPEATS timings of each pass, one profiled update."""
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl.config.plan import attention_implementation
    from reasonrl.models.load import compute_dtype

    shape, implementation, cap, rows, checkpointing = case
    cap = 64 if smoke else cap
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prompt_tokens = SMOKE_PROMPT_TOKENS if smoke else PROMPT_TOKENS
    attention = attention_implementation("auto", device.type, cap + prompt_tokens[1])
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(model_config(shape, smoke), attn_implementation=attention).eval()
    if checkpointing and implementation != "trl":
        model.gradient_checkpointing_enable()
    dtype = compute_dtype("auto")
    sweep = Sweep(shape, implementation, (cap,), rows, gradient_checkpointing=checkpointing)
    passes = (TrlPasses if implementation == "trl" else ReasonrlPasses)(
        model, device, dtype, implementation != "reasonrl_padded", sweep
    )
    counter = TokenCounter(model)
    line = {"case": case_name(case), "shape": shape, "implementation": implementation, "cap": cap, "rows": rows,
            "gradient_checkpointing": checkpointing, "attention": attention}  # fmt: skip
    line |= passes.configure(cap, rows, prompt_tokens)
    batch = rollout_rows(cap, rows, model.config.vocab_size, prompt_tokens)
    lengths = (batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).tolist()
    line["real_tokens"] = sum(lengths)
    peak = device_description(device.type)["peak_bf16_flops"]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for name, run, training in (("logprob", passes.logprob_pass, False), ("update", passes.update, True)):
        run(batch)  # 1. warm-up on the full batch
        seconds, peaks = [], []
        for _ in range(REPEATS):  # 2. timed repeats
            counter.reset()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            sync()
            start = time.perf_counter()
            run(batch)
            sync()
            seconds.append(time.perf_counter() - start)
            peaks.append(torch.cuda.max_memory_allocated(device) / 1024**3 if device.type == "cuda" else None)
        best = min(seconds)
        flops = pass_flops(model, lengths, training)
        line[name] = {"seconds": seconds, "tokens_per_second_best": sum(lengths) / best,
                      "tokens_per_second_median": sum(lengths) / statistics.median(seconds),
                      "mfu_best": flops / best / peak if peak else None,
                      "peak_memory_gb": max(peaks) if peaks[0] else None,
                      "pad_fraction": 1 - sum(lengths) / counter.tokens, "microbatches": counter.calls}  # fmt: skip
    # 3. one profiled update
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as profile:
        passes.update(batch)
        sync()
    line["profiled_update"] = {"wall_seconds": time.perf_counter() - start}
    events = profile.key_averages()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    (out / f"trace_{case_name(case)}.txt").write_text(events.table(sort_by=sort, row_limit=30) + "\n")
    if device.type == "cuda":  # the kernels' own time once: a CPU op's device time is its kernels' again
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        line["profiled_update"]["device_busy_seconds"] = sum(e.self_device_time_total for e in kernels) / 1e6
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny models on whatever device there is")
    parser.add_argument("--budget-seconds", type=float, default=0, help="0 = no limit")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)  # worker: index into CASES
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.case is not None:
        print(json.dumps(run_case(CASES[args.case], args.smoke, args.out)), flush=True)
        return 0
    started = time.monotonic()
    result = {"date": datetime.date.today().isoformat(), "command": " ".join(["python", *sys.argv]),
              "repeats": REPEATS, "cases": [], "problems": []}  # fmt: skip
    for index, case in enumerate(CASES):
        left = args.budget_seconds - (time.monotonic() - started) - 5 if args.budget_seconds else None
        if left is not None and left < 20:
            result["problems"].append({"case": case_name(case), "why": "no time left in the budget"})
            continue
        command = [sys.executable, __file__, "--out", str(args.out), "--case", str(index)]
        try:
            done = subprocess.run([*command, *(["--smoke"] if args.smoke else [])], capture_output=True, text=True,
                                  timeout=left, env=child_env())  # fmt: skip
        except subprocess.TimeoutExpired:
            result["problems"].append({"case": case_name(case), "why": "stopped at the time budget"})
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            result["problems"].append({"case": case_name(case), "why": done.stderr[-1500:]})
        else:
            result["cases"].append(json.loads(lines[-1]))
        (args.out / "train_side_trace.json").write_text(json.dumps(result, indent=2) + "\n")
    result["seconds"] = round(time.monotonic() - started, 1)
    (args.out / "train_side_trace.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
