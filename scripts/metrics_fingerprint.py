"""Fixed-seed 3-step runs of grpo, vapo, t_ppo, pag, an environment (guess_number) and an asynchronous grpo run on
tiny-random; their learning metrics as one JSON object.

    python scripts/metrics_fingerprint.py OUT.json [--work DIR]
    python scripts/metrics_fingerprint.py --compare BEFORE.json AFTER.json

A refactor that must not change behaviour writes the fingerprint before and after and compares them:
every metric of every step is kept except wall-clock timings, rates and memory (``perf/`` keys and
``*_seconds``), which differ from run to run whatever the code.  The runs use the project's own command
(``reasonrl train``), a reward that varies with the response length (``bench/rewards.py``: the tiny random model
solves nothing, so the built-in verifier's zeros would leave every update out) and the tiny random model; a few
seconds each on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

RUNS = {
    "grpo": [],
    "vapo": ["algo.value_pretrain_steps=2"],
    "t_ppo": ["algo.window_tokens=4"],
    "pag": ["rollout.max_response_tokens=48", "rollout.max_conversation_tokens=1200", "train.microbatch_tokens=4096"],
    # an environment's episodes (the shipped game; its own dataset)
    "guess_number": [
        "rollout.max_response_tokens=16",
        "train.microbatch_tokens=4096",
        "rollout.max_prompt_tokens=1024",
    ],
    # the producer up to one version ahead (its own process)
    "grpo_async": ["rollout.max_staleness=1"],
}
PRESETS = {"grpo_async": "grpo"}  # a run named apart from its preset
COMMON = [
    "model.name_or_path=tiny-random",
    "rollout.rollout_prompts=4",
    "rollout.samples_per_prompt=4",
    "rollout.max_response_tokens=12",
    "train.minibatch_sequences=8",
    "train.microbatch_tokens=512",
    "data.eval_prompts=8",
    "reward.workers=1",
    "train.rollout_steps=3",
    "run.eval_every=3",
    "run.save_every=100",
    "run.seed=7",
    # a reward that varies with the response (the tiny model never solves a task): every step takes its update
    "reward.functions=[bench/rewards.py:response_length]",
    "train.constant_reward_stop_steps=0",
]


def varies_by_run(key: str) -> bool:
    """Timings, rates and memory: what two runs of the same code never agree on."""
    return key.startswith("perf/") or key.endswith(("_seconds", "_per_second", "/seconds")) or "memory" in key


def fingerprint(work: Path) -> dict[str, list[dict]]:
    from reasonrl.cli import main

    result = {}
    for preset, overrides in RUNS.items():
        argv = ["train", PRESETS.get(preset, preset), *COMMON, *overrides, f"run.output_dir={work}",
                f"run.name={preset}", "--quiet"]  # fmt: skip
        if main(argv) != 0:
            sys.exit(f"{preset}: the run failed")
        lines = (work / preset / "metrics.jsonl").read_text().splitlines()
        result[preset] = [{k: v for k, v in json.loads(line).items() if not varies_by_run(k)} for line in lines]
    return result


def compare(before: dict, after: dict) -> list[str]:
    """Every difference between two fingerprints, one line each."""
    differences = []
    for preset in sorted(set(before) | set(after)):
        a, b = before.get(preset, []), after.get(preset, [])
        if len(a) != len(b):
            differences.append(f"{preset}: {len(a)} records before, {len(b)} after")
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            for key in sorted(set(x) | set(y)):
                if x.get(key) != y.get(key):
                    differences.append(f"{preset} record {index} {key}: {x.get(key)!r} -> {y.get(key)!r}")
    return differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        differences = compare(*(json.loads(p.read_text()) for p in args.compare))
        print(json.dumps({"identical": not differences, "differences": differences[:50]}, indent=2))
        sys.exit(1 if differences else 0)
    work = args.work or Path(tempfile.mkdtemp(prefix="fingerprint-"))
    result = fingerprint(work)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(json.dumps({preset: len(records) for preset, records in result.items()}))


if __name__ == "__main__":
    main()
