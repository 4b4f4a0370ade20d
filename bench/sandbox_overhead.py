"""Per-run overhead of the code sandbox (one JSON object).

    python bench/sandbox_overhead.py [--repeats 10]

Times ``run_code`` on a trivial solution with 1 and 10 assert tests, with a fresh process per test
(the default) and with one process for all tests; reports the median wall seconds of each, and
which isolation layers were active.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from reasonrl.reward.sandbox import isolation_support, run_code

SOLUTION = "def add(a, b):\n    return a + b\n"


def median_seconds(tests: str, isolate: bool, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        verdict = run_code(SOLUTION, tests, "add", isolate_tests=isolate)
        times.append(time.perf_counter() - start)
        assert verdict.passed, verdict
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    one = "assert add(1, 2) == 3\n"
    ten = "".join(f"assert add({i}, {i}) == {2 * i}\n" for i in range(10))
    support = isolation_support()
    result = {
        "isolation": {k: v for k, v in vars(support).items() if isinstance(v, bool | str | None)},
        "one_test_seconds": median_seconds(one, True, args.repeats),
        "ten_tests_process_per_test_seconds": median_seconds(ten, True, args.repeats),
        "ten_tests_one_process_seconds": median_seconds(ten, False, args.repeats),
        "repeats": args.repeats,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
