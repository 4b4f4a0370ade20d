"""Every canonical solution of the built-in HumanEval and MBPP through the code verifier (one JSON object).

    python bench/sandbox_canonical.py [--workers 2] [--limit N] [--timeout 3]

Each solution is sent as a model would send it (a fenced block) to ``CodeVerifier()`` with its
defaults (``--timeout`` raises the per-test limit, and the whole run's with it, for a machine too slow
for a solution's own CPU time: MBPP 123's test needs 4.8 s of CPU outside any sandbox on the 2-core AMD EPYC
VM of 2026-11-26), in a ``SandboxPool``-like thread pool.  Prints the task and test counts, how many passed,
the wall time, the isolation layers, and every task that did not pass (with its verdict's detail).
A sandbox change must keep this at 100%.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

from reasonrl.data.code_tasks import MBPP_SPLITS, humaneval_example, mbpp_example
from reasonrl.data.loaders import read_rows
from reasonrl.reward.code import CodeVerifier
from reasonrl.reward.sandbox import isolation_support


def _rows(name: str) -> list[dict]:
    return [row for _, row in read_rows(Path(str(resources.files("reasonrl.data") / "builtin" / name)))]


def canonical_jobs(limit: int | None = None) -> list[tuple[str, str, str]]:
    """(task id, response, reference) for every built-in HumanEval and MBPP task, with its canonical solution."""
    jobs = []
    for index, row in enumerate(_rows("humaneval-test.jsonl.gz")):
        example = humaneval_example("test", "humaneval", row, index)
        jobs.append((example.id, f"```python\n{row['prompt']}{row['canonical_solution']}\n```", example.answer))
    for row in _rows("mbpp.jsonl.gz"):
        split = next(name for name, ids in MBPP_SPLITS.items() if int(row["task_id"]) in ids)
        example = mbpp_example(split, "mbpp", row, 0)
        jobs.append((example.id, f"```python\n{row['code']}\n```", example.answer))
    return jobs[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument("--timeout", type=float, default=None, help="per-test seconds (default: the verifier's)")
    args = parser.parse_args()
    verifier = CodeVerifier() if args.timeout is None else CodeVerifier(args.timeout, args.timeout + 4.0)
    jobs = canonical_jobs(args.limit)
    started = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda job: verifier(job[1], job[2]), jobs))
    wall = time.perf_counter() - started
    failures = [
        {"task": task, "status": r.info["status"], "detail": r.info["detail"]}
        for (task, _, _), r in zip(jobs, results, strict=True)
        if not r.correct
    ]
    print(
        json.dumps(
            {
                "tasks": len(jobs),
                "tests": sum(r.info.get("tests", 0) for r in results),
                "tasks_passed": len(jobs) - len(failures),
                "pass_rate": (len(jobs) - len(failures)) / len(jobs),
                "wall_seconds": round(wall, 1),
                "workers": args.workers,
                "test_timeout_seconds": verifier.limits.timeout_s,
                "isolation": isolation_support().launcher,
                "failures": failures,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
