"""Data parallelism on the CPU: step time at 1 and N processes, and what each kind of collective moves per step.

    python bench/scale.py [--steps 4] [--nproc 2] [--preset dapo] [--out FILE] [key=value ...]

Prints one JSON object.  The preset runs three times on the same short configuration (``OVERRIDES``:
4 prompts × 4 samples, 32-token cap, 2 optimiser steps per rollout, 4 held-out prompts, evaluation only
after the last step; the model is ``model.name_or_path``'s default, SmolLM2-135M-Instruct), one run after
the other: one process with torch's default threads (one per core), one process with one thread
(OMP_NUM_THREADS=1), and ``python -m torch.distributed.run --standalone --nproc-per-node N`` (torchrun;
gloo on the CPU, every rank an FSDP2 shard of the policy, torchrun's one thread per rank).  The 1-minute
load average before and after each run is recorded: on a shared machine, threads of one process stall
when another program takes a core, and one-thread processes do not.

1. Time: medians over steps 2 … steps−1 of each run's metrics.jsonl (perf/step_seconds, perf/generate_seconds,
   perf/logprob_seconds, perf/update_seconds, perf/weight_sync_seconds, rollout/tokens_generated,
   perf/tokens_per_second).  Step 1 warms up; the last step also evaluates and, with N processes, runs
   under the profiler, so neither is in the medians.
2. Communication: the N-process run's last step runs under torch.profiler (CPU, record_shapes) on every
   rank.  gloo runs each collective on a worker thread as a ``gloo:<op>`` event carrying its input's
   shape and dtype; its duration there (start to end of the work, so it includes waiting for the slower
   rank) is the collective's time.  Each was enqueued by a ``c10d::<op>`` call on the training thread, in
   the same order; that call is classed by the named ranges around it: FSDP2's own
   ``FSDP::post_backward_reduce`` (gradient reduce-scatter) and ``FSDP::all_gather`` (parameters unsharded
   before a forward or backward), and ranges this script wraps around ``engine_weights`` (the weight sync:
   ``full_state_dict`` gathers the whole model for the rollout engine), ``ShardedEngine.generate`` (its one
   collective: the all-gather of the completions), the log-prob stage and the policy update.  Anything
   else (log-prob sums, metric sums, micro-batch counts, the gradient norm) is ``other``.
   Bytes per collective: the full tensor (all-gather: N × the input shard; all-reduce and broadcast: the
   input) and the bytes a ring algorithm sends from each rank, (N−1)/N × full for an all-gather or
   reduce-scatter and 2(N−1)/N × full for an all-reduce.  Seconds: gloo's durations summed on rank 0,
   and the sum over collectives of the smallest duration on any rank (most of the wait for a late rank
   removed).  ``model_equivalents`` = full bytes ÷ the policy's parameter bytes.
3. Estimate: ``ESTIMATE_SETUPS`` (bandwidths and latencies assumed, not measured) applied to the measured
   per-step model equivalents and collective counts: t = Σ_kind ring factor(N) × equivalents × P × bytes
   per parameter ÷ bandwidth + calls × latency, with the same forward/backward passes per rank as here.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
from common import cpu_model

OVERRIDES = [
    "rollout.rollout_prompts=4",
    "rollout.samples_per_prompt=4",
    "rollout.max_response_tokens=32",
    "train.minibatch_sequences=8",
    "data.eval_prompts=4",
    f"run.eval_every={10**6}",
    f"run.save_every={10**6}",
]
TIMING = {
    "step_seconds": "perf/step_seconds",
    "generate_seconds": "perf/generate_seconds",
    "score_seconds": "perf/score_seconds",
    "logprob_seconds": "perf/logprob_seconds",
    "update_seconds": "perf/update_seconds",
    "weight_sync_seconds": "perf/weight_sync_seconds",
    "tokens_generated": "rollout/tokens_generated",
    "tokens_per_second": "perf/tokens_per_second",
}
PARITY = ("rollout/tokens_generated", "reward/accuracy", "loss/policy", "train/grad_norm")
LABELS = {  # the ranges this script wraps around library calls in the worker
    "weight_sync": "bench::weight_sync",
    "rollout": "bench::rollout",
    "logprobs": "bench::logprobs",
    "update": "bench::update",
}
DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "unsigned char": 1,
    "signed char": 1,
    "bool": 1,
}
RING_FACTOR = {"all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n}
RING_FACTOR["all_reduce"] = lambda n: 2 * (n - 1) / n
RING_FACTOR["broadcast"] = lambda n: 1.0
GRADIENT_OP = "reduce_scatter"  # what FSDP2 asks for; gloo may run it as something else (reported)
ESTIMATE_SETUPS = {
    "135M, 8 GPUs in one node (NVLink)": {"parameters": None, "ranks": 8, "gb_per_s": 350.0, "latency_us": 20.0},
    "135M, 2 nodes x 8 GPUs (100 Gb/s between nodes)": {
        "parameters": None,
        "ranks": 16,
        "gb_per_s": 12.5,
        "latency_us": 50.0,
    },
    "7B, 8 GPUs in one node (NVLink)": {"parameters": 7.0e9, "ranks": 8, "gb_per_s": 350.0, "latency_us": 20.0},
    "7B, 2 nodes x 8 GPUs (100 Gb/s between nodes)": {
        "parameters": 7.0e9,
        "ranks": 16,
        "gb_per_s": 12.5,
        "latency_us": 50.0,
    },
}
ESTIMATE_ASSUMPTIONS = [
    "bandwidths and latencies are assumptions, not measurements: 350 GB/s is a typical NCCL bus bandwidth "
    "for all-gather/reduce-scatter among 8 H100s on NVLink; 12.5 GB/s is the line rate of one 100 Gb/s link "
    "per node, which a ring spanning two nodes crosses (no protocol overhead counted, so a lower bound)",
    "ring collectives: all-gather and reduce-scatter send (N-1)/N x the full tensor from each rank, all-reduce "
    "2(N-1)/N x; time = those bytes / bandwidth + calls x latency; no overlap with compute (an upper bound "
    "where FSDP prefetching hides all-gathers behind compute)",
    "the same code path as measured: fp32 parameters all-gathered and fp32 gradients reduced (shard_module sets "
    "no mixed-precision policy), fp32 full weights gathered for the engine; bf16 would halve the parameter and "
    "weight-sync bytes",
    "the same work per rank as measured: as many FSDP forward/backward passes (micro-batches) per step and the "
    "same number of collective calls; the 135M model's measured parameter count, 7.0e9 for the 7B model",
    "the gradient reduction is a true reduce-scatter, (N-1)/N, as NCCL runs it (gloo's is in communication.kinds)",
    "the rollout all-gather of completions is not scaled with the model: it carries tokens, not weights",
]


# --- the worker (one process, or one torchrun rank) ------------------------------------------------


def _labelled(fn, label: str):
    """``fn`` run inside a profiler range named ``label``."""
    from torch.profiler import record_function

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return wrapper


def _profiled_events(prof) -> list[dict]:
    """The profiler's collectives (gloo work, c10d calls) and the named ranges around them."""
    rows = []
    for event in prof.profiler.kineto_results.events():
        name = event.name()
        if not name.startswith(("gloo:", "c10d::", "bench::", "FSDP::")):
            continue
        row = {"name": name, "thread": event.start_thread_id(), "start": event.start_ns(), "end": event.end_ns()}
        if name.startswith("gloo:"):
            row["shapes"], row["dtypes"] = event.shapes(), event.dtypes()
        rows.append(row)
    return rows


def worker(args: argparse.Namespace) -> None:
    """Train ``args.preset`` in ``args.run_dir`` (rank 0 writes metrics.jsonl); the step ``args.profile_step``
    runs under torch.profiler and each rank writes what it saw to ``comm_rank<R>.json`` there."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from reasonrl.config import load_config
    from reasonrl.training import backend, loop
    from reasonrl.training.placement import parallel
    from reasonrl.training.update import step

    backend.FSDP2Ranks.engine_weights = _labelled(backend.FSDP2Ranks.engine_weights, LABELS["weight_sync"])
    loop.logprob_stage = _labelled(loop.logprob_stage, LABELS["logprobs"])
    parallel.ShardedEngine.generate = _labelled(parallel.ShardedEngine.generate, LABELS["rollout"])
    step.PolicyUpdater.update = _labelled(step.PolicyUpdater.update, LABELS["update"])
    rl_step, rank, run_dir = loop.rl_step, int(os.environ.get("RANK", "0")), Path(args.run_dir)

    def profiled_rl_step(run, number, phase=lambda name: None):
        if number != args.profile_step:
            return rl_step(run, number, phase)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            metrics = rl_step(run, number, phase)
        first = next(run.model.parameters())
        record = {
            "rank": rank,
            "step": number,
            "threads": torch.get_num_threads(),
            "parameters": sum(p.numel() for p in run.model.parameters()),
            "parameter_bytes_each": first.element_size(),
            "events": _profiled_events(prof),
        }
        (run_dir / f"comm_rank{rank}.json").write_text(json.dumps(record))
        return metrics

    loop.rl_step = profiled_rl_step
    cfg = load_config(args.preset, args.overrides)
    loop.fit(cfg, run_dir, preset=args.preset, show_progress=False)
    (run_dir / f"threads_rank{rank}.json").write_text(json.dumps(torch.get_num_threads()))


# --- the analysis --------------------------------------------------------------------------------


def _gloo_op(name: str) -> str:
    return name.removeprefix("gloo:")


def _input_bytes(event: dict) -> int:
    total = 0
    for dims, dtype in zip(event["shapes"], event["dtypes"], strict=True):
        if dims and dtype in DTYPE_BYTES:
            numel = 1
            for d in dims:
                numel *= d
            total += numel * DTYPE_BYTES[dtype]
        elif dims:
            raise ValueError(f"unknown dtype {dtype!r} in {event['name']}")
    return total


def _kind(call: dict, ranges: list[dict]) -> tuple[str, str]:
    """(kind, stage) of a c10d call from the named ranges that enclose it on its thread."""
    around = {
        r["name"].split(" (")[0]
        for r in ranges
        if r["thread"] == call["thread"] and r["start"] <= call["start"] and call["end"] <= r["end"]
    }
    stage = next((s for s, label in LABELS.items() if label in around), "step")
    if LABELS["weight_sync"] in around:
        return "weight_sync", stage
    if LABELS["rollout"] in around:
        return "rollout_gather", stage
    if "FSDP::post_backward_reduce" in around:
        return "gradient_reduce_scatter", stage
    if "FSDP::all_gather" in around:
        return "parameter_all_gather", stage
    return "other", stage


def classify(record: dict, world_size: int) -> list[dict]:
    """One row per collective of a rank's profiled step, in issue order: kind, stage, gloo op, bytes, seconds."""
    events = record["events"]
    work = sorted((e for e in events if e["name"].startswith("gloo:")), key=lambda e: e["start"])
    calls = sorted((e for e in events if e["name"].startswith("c10d::")), key=lambda e: e["start"])
    ranges = [e for e in events if e["name"].startswith(("bench::", "FSDP::"))]
    if len(work) != len(calls):
        raise RuntimeError(f"rank {record['rank']}: {len(calls)} c10d calls but {len(work)} gloo collectives")
    rows = []
    for call, done in zip(calls, work, strict=True):
        op = _gloo_op(done["name"])
        shard = _input_bytes(done)
        full = shard * world_size if op == "all_gather" else shard
        kind, stage = _kind(call, ranges)
        rows.append(
            {
                "kind": kind,
                "stage": stage,
                "call": call["name"],
                "gloo_op": op,
                "full_bytes": full,
                "ring_bytes_sent": full * RING_FACTOR.get(op, lambda n: 0.0)(world_size),
                "seconds": (done["end"] - done["start"]) / 1e9,
            }
        )
    return rows


SUMMED = ("calls", "full_bytes", "ring_bytes_sent_per_rank", "seconds_rank0", "seconds_min_over_ranks")


def _signature(rows: list[dict]) -> list[tuple]:
    return [(row["kind"], row["gloo_op"], row["full_bytes"]) for row in rows]


def communication(records: list[dict]) -> dict:
    """Bytes, calls and seconds per kind of collective over the profiled step (rank 0's sizes)."""
    world_size = len(records)
    per_rank = [classify(r, world_size) for r in sorted(records, key=lambda r: r["rank"])]
    if any(_signature(rows) != _signature(per_rank[0]) for rows in per_rank):
        raise RuntimeError("the ranks issued different collectives in the profiled step")
    parameter_bytes = records[0]["parameters"] * records[0]["parameter_bytes_each"]
    kinds: dict[str, dict] = {}
    for i, row in enumerate(per_rank[0]):
        k = kinds.setdefault(row["kind"], {key: 0 for key in SUMMED} | {"ops": {}, "stages": {}})
        k["calls"] += 1
        k["full_bytes"] += row["full_bytes"]
        k["ring_bytes_sent_per_rank"] += row["ring_bytes_sent"]
        k["seconds_rank0"] += row["seconds"]
        k["seconds_min_over_ranks"] += min(rows[i]["seconds"] for rows in per_rank)
        op = f"{row['call']} -> gloo:{row['gloo_op']}"
        k["ops"][op] = k["ops"].get(op, 0) + 1
        stage = k["stages"].setdefault(row["stage"], {"calls": 0, "full_bytes": 0})
        stage["calls"] += 1
        stage["full_bytes"] += row["full_bytes"]
    for k in kinds.values():
        k["model_equivalents"] = round(k["full_bytes"] / parameter_bytes, 4)
        k["measured_gb_per_s"] = round(k["ring_bytes_sent_per_rank"] / max(1e-9, k["seconds_min_over_ranks"]) / 1e9, 3)
    return {
        "world_size": world_size,
        "profiled_step": records[0]["step"],
        "threads_per_rank": records[0]["threads"],
        "parameters": records[0]["parameters"],
        "parameter_bytes": parameter_bytes,
        "kinds": dict(sorted(kinds.items())),
        "total": {key: sum(k[key] for k in kinds.values()) for key in SUMMED},
    }


def estimate(comm: dict) -> dict:
    """Communication seconds per step for ``ESTIMATE_SETUPS``, from the measured equivalents and calls."""
    model_kinds = ("parameter_all_gather", "gradient_reduce_scatter", "weight_sync")
    ops = {"parameter_all_gather": "all_gather", "gradient_reduce_scatter": GRADIENT_OP, "weight_sync": "all_gather"}
    bytes_each = comm["parameter_bytes"] / comm["parameters"]
    out = {}
    for name, setup in ESTIMATE_SETUPS.items():
        params = setup["parameters"] or comm["parameters"]
        n, bandwidth, latency = setup["ranks"], setup["gb_per_s"] * 1e9, setup["latency_us"] * 1e-6
        seconds = {}
        for kind in model_kinds:
            measured = comm["kinds"].get(kind)
            if measured is None:
                continue
            sent = RING_FACTOR[ops[kind]](n) * measured["model_equivalents"] * params * bytes_each
            seconds[kind] = {
                "gb_sent_per_rank": round(sent / 1e9, 3),
                "seconds": round(sent / bandwidth + measured["calls"] * latency, 4),
            }
        gather = comm["kinds"].get("rollout_gather")
        if gather is not None:  # the same completions, gathered over n ranks
            sent = RING_FACTOR["all_gather"](n) * gather["full_bytes"]
            seconds["rollout_gather"] = {
                "gb_sent_per_rank": round(sent / 1e9, 6),
                "seconds": round(sent / bandwidth + gather["calls"] * latency, 4),
            }
        out[name] = {
            **setup,
            "parameters": params,
            "kinds": seconds,
            "seconds_per_step": round(sum(s["seconds"] for s in seconds.values()), 3),
        }
    return {"assumptions": ESTIMATE_ASSUMPTIONS, "setups": out}


def timing(records: list[dict], steps: int) -> dict:
    """Medians over the steps that are neither the first nor the last, and the step and generation
    seconds of every step."""
    middle = [r for r in records if 1 < r["step"] < steps]
    return {name: statistics.median(r[key] for r in middle) for name, key in TIMING.items()} | {
        "steps_in_median": [r["step"] for r in middle],
        "every_step_seconds": [round(r["perf/step_seconds"], 2) for r in records],
        "every_step_generate_seconds": [round(r["perf/generate_seconds"], 2) for r in records],
    }


# --- the driver ----------------------------------------------------------------------------------


def launch(run: str, run_dir: Path, args: argparse.Namespace, overrides: list[str], log: Path) -> None:
    """One training run of this script's worker (``run`` is a key of ``runs(args)``)."""
    nproc, threads = runs(args)[run]
    script = [str(Path(__file__).resolve()), "--worker", str(run_dir), "--preset", args.preset]
    script += ["--profile-step", str(args.steps if nproc > 1 else -1), *overrides]
    env = dict(os.environ) | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
    if nproc == 1:
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *script]
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}); its output:\n{log.read_text()[-4000:]}")


def runs(args: argparse.Namespace) -> dict[str, tuple[int, int | None]]:
    """The runs compared: name -> (processes, OMP_NUM_THREADS; None = torch's default, one per core).
    torchrun gives each rank one thread; one process with one thread is the same work per thread, and
    unlike two threads it does not stall when another program takes a core."""
    return {"1_process": (1, None), "1_process_1_thread": (1, 1), f"{args.nproc}_processes": (args.nproc, None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--preset", default="dapo")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--worker", metavar="RUN_DIR", dest="run_dir", help=argparse.SUPPRESS)
    parser.add_argument("--profile-step", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.run_dir:
        worker(args)
        return
    if args.steps < 3:
        parser.error("--steps must be at least 3 (the first and the last step are not timed)")
    from reasonrl.training.record.metrics import read_metrics

    overrides = [*OVERRIDES, f"train.rollout_steps={args.steps}", *args.overrides]
    metrics, load, threads = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs(args):
            run_dir = Path(tmp) / run
            before = os.getloadavg()[0]
            launch(run, run_dir, args, overrides, Path(tmp) / f"{run}.log")
            load[run] = {"load_average_1min_before": before, "load_average_1min_after": os.getloadavg()[0]}
            metrics[run] = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]
            threads[run] = json.loads((run_dir / "threads_rank0.json").read_text())
        profiled_dir = Path(tmp) / f"{args.nproc}_processes"
        records = [json.loads((profiled_dir / f"comm_rank{r}.json").read_text()) for r in range(args.nproc)]
    comm = communication(records)
    profiled = metrics[f"{args.nproc}_processes"][-1]
    comm["profiled_step_seconds"] = {
        "step_seconds (with evaluation and profiler)": profiled["perf/step_seconds"],
        "weight_sync_seconds": profiled["perf/weight_sync_seconds"],
        "update_seconds": profiled["perf/update_seconds"],
    }
    result = {
        "preset": args.preset,
        "overrides": overrides,
        "steps": args.steps,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "timing": {
            run: timing(metrics[run], args.steps) | load[run] | {"torch_threads": threads[run]} for run in metrics
        },
        "parity": {key: {run: [r.get(key) for r in metrics[run]] for run in metrics} for key in PARITY},
        "communication": comm,
        "estimate": estimate(comm),
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
