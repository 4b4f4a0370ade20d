"""The policy update's forward + backward on a real batch, per CPU attention layout (one JSON object).

    python bench/update_attention.py [--attention lanes eager sdpa] [--repeats 6] [--microbatch-tokens 768]

Runs `bench/vs_trl.py`'s reasonrl job (GRPO, SmolLM2-135M-Instruct, 8 prompts x 4 answers of at most 64 tokens,
shared prompts, bf16 autocast on fp32 weights) for two steps and keeps the batch its second update trained on;
then, for each ``--attention`` (``model.attention``: lanes = every op but attention on the read tokens alone;
eager or sdpa = the whole model over lanes as wide as the longest segment), loads the policy and times the
update's forward and backward over that batch: its micro-batches under one ``weight_casts_kept`` block, the
PPO-clip loss of each backpropagated, as ``PolicyUpdater`` runs them (no optimiser step: it is the same work for
every layout).  The layouts take turns, each repeat in the other order (this VM's speed drifts within minutes);
reported: each layout's seconds per repeat, the median without the first (warm-up) repeat, micro-batches and the
tokens its forwards computed, and each layout's median over the first's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

JOB = [
    "rollout.rollout_prompts=8",
    "rollout.samples_per_prompt=4",
    "rollout.max_response_tokens=64",
    "rollout.max_prompt_tokens=256",
    "model.device=cpu",
    "rollout.engine=fast",
    "train.minibatch_sequences=32",
    "train.lr=1e-5",
    "train.rollout_steps=2",
    "run.seed=0",
    "algo.kl_placement=none",
    "algo.loss_agg=token-mean",
    "model.gradient_checkpointing=false",
    "data.eval_prompts=8",
    f"run.eval_every={10**6}",
    f"run.save_every={10**6}",
]


def second_update_batch():
    """The batch the vs-TRL job's second policy update trains on."""
    from reasonrl.config import load_config
    from reasonrl.training.loop import fit
    from reasonrl.training.update.step import PolicyUpdater

    batches = []
    update = PolicyUpdater.update

    def kept(self, batch, *args, **kwargs):
        batches.append(batch)
        return update(self, batch, *args, **kwargs)

    PolicyUpdater.update = kept
    try:
        with tempfile.TemporaryDirectory() as tmp:
            fit(load_config("grpo", JOB), Path(tmp), preset="grpo", show_progress=False)
    finally:
        PolicyUpdater.update = update
    return batches[1]


def forward_backward(policy, batch, budget: int) -> tuple[float, int, int]:
    """Seconds of one update's forwards and backwards over ``batch``; its micro-batches and computed tokens."""
    from reasonrl.algo.aggregate import aggregate, count_for_aggregation
    from reasonrl.algo.policy_loss import ppo_clip
    from reasonrl.models.forward import weight_casts_kept

    micros = batch.micro_batches(budget, "cpu", True, policy.share_prompts, policy.lanes)
    computed = sum(m.forward_tokens(True, policy.share_prompts, policy.lanes) for m in micros)
    tokens, seqs = count_for_aggregation(batch.policy_loss_mask)
    start = time.perf_counter()
    with weight_casts_kept(policy.model):
        for micro in micros:
            mask = micro.policy_loss_mask
            logprobs, _ = policy(micro, head_mask=mask)
            per_token, _ = ppo_clip(logprobs, logprobs.detach(), micro.advantages, mask, 0.2, 0.2, None)
            aggregate(per_token, mask, "token-mean", tokens, seqs, None).backward()
    seconds = time.perf_counter() - start
    policy.model.zero_grad(set_to_none=True)
    return seconds, len(micros), computed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", nargs="+", default=["lanes", "eager", "sdpa"])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--microbatch-tokens", type=int, default=768)
    args = parser.parse_args()
    from reasonrl.models.load import load_model
    from reasonrl.training.update.policy import TokenLogprobs

    batch = second_update_batch()
    policies = {}
    for attention in args.attention:
        model = load_model("smollm2-135m", attn_implementation=attention).train()
        policies[attention] = TokenLogprobs(model, 1.0, torch.bfloat16, packed=True, share_prompts=True)
    runs: dict[str, list] = {a: [] for a in args.attention}
    for repeat in range(args.repeats):
        for attention in args.attention if repeat % 2 == 0 else args.attention[::-1]:
            runs[attention].append(forward_backward(policies[attention], batch, args.microbatch_tokens))
    first = statistics.median(s for s, _, _ in runs[args.attention[0]][1:])
    result = {
        "job": JOB,
        "rows": len(batch),
        "threads": torch.get_num_threads(),
        "microbatch_tokens": args.microbatch_tokens,
        **{
            attention: {
                "seconds": [round(s, 3) for s, _, _ in side],
                "median_seconds": statistics.median(s for s, _, _ in side[1:]),
                "microbatches": side[0][1],
                "forward_tokens": side[0][2],
            }
            for attention, side in runs.items()
        },
    }
    result["median_over_first"] = {a: result[a]["median_seconds"] / first for a in args.attention}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
