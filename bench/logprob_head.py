"""The chunked LM head alone: forward + backward seconds and page faults per call (one JSON object).

    python bench/logprob_head.py [--tokens 1150] [--vocab 49152] [--hidden 576] [--chunk 512] [--repeats 8]

``reasonrl.models.logprob_head.token_logprobs`` over random hidden states [tokens, hidden] (bf16, as autocast
hands them over) and a random fp32 head [vocab, hidden] computed in bf16 — SmolLM2-135M's head and the answer
tokens of one update of `bench/vs_trl.py`'s job by default — with a gradient for the hidden states and the
weight, as the policy update runs it.  Reported: each call's seconds, the median and best after the first, and
the minor page faults per call (``ru_minflt``: on the CPU every fresh block this large is mapped and zeroed anew).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1150)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    from reasonrl.models.logprob_head import token_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    hidden = torch.randn(args.tokens, args.hidden, requires_grad=True)
    targets = torch.randint(0, args.vocab, (args.tokens,))
    seconds, faults = [], []
    for _ in range(args.repeats):
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        logprobs, _ = token_logprobs(
            hidden.to(torch.bfloat16), head, targets, compute_dtype=torch.bfloat16, chunk_tokens=args.chunk
        )
        logprobs.sum().backward()
        seconds.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        head.weight.grad = hidden.grad = None
    print(json.dumps({
        "settings": vars(args),
        "threads": torch.get_num_threads(),
        "seconds": [round(s, 4) for s in seconds],
        "median_seconds": statistics.median(seconds[1:]),
        "best_seconds": min(seconds[1:]),
        "page_faults_per_call": statistics.median(faults[1:]),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
