"""pass@k with and without FIRE sampling (one JSON object).

    python bench/fire_passk.py [--model smollm2-135m] [--k 8] [--limit 100]

For each dataset (the arithmetic eval split and a GSM8K test slice, both shipped with reasonrl),
samples k answers per problem at temperature 1 with the regular sampler and with FIRE (first token
at temperature 30, top-k 16; authors' defaults), same seed, and reports greedy_pass@1, avg@k,
maj@k and pass@k for both.
"""

from __future__ import annotations

import argparse
import json

from reasonrl.jobs.evaluate import EvalSettings, run_eval

DATASETS = {"arithmetic": 64, "gsm8k": 320}  # dataset -> max new tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--gsm8k-limit", type=int, default=50)
    args = parser.parse_args()
    result: dict = {"model": args.model, "k": args.k}
    for dataset, max_new_tokens in DATASETS.items():
        limit = args.gsm8k_limit if dataset == "gsm8k" else args.limit
        for label, fire in (("regular", False), ("fire", True)):
            metrics = run_eval(
                EvalSettings(args.model, dataset, k=args.k, max_new_tokens=max_new_tokens, limit=limit, fire=fire)
            )
            keys = ("problems", "greedy_pass@1", "avg@k", "maj@k", "pass@k")
            result[f"{dataset}_{label}"] = {key: metrics[key] for key in keys}
        result[f"{dataset}_pass@k_gain"] = result[f"{dataset}_fire"]["pass@k"] - result[f"{dataset}_regular"]["pass@k"]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
