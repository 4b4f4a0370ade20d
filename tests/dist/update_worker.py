"""One policy update of a fixed batch, for every loss aggregation mode; run once alone and once under
``torchrun --nproc-per-node 2`` by tests/dist/test_torchrun.py, which compares the updated weights.

    python tests/dist/update_worker.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch

from reasonrl.algo.aggregate import AGGREGATION_MODES
from reasonrl.algo.presets import AlgoSpec
from reasonrl.models.load import load_model
from reasonrl.training.placement.parallel import full_state_dict, init_from_environment, shard_module
from reasonrl.training.update.policy import TokenLogprobs
from reasonrl.training.update.step import PolicyUpdater
from tests.train.test_step import rollout_batch


def updated_weights(mode: str, parallel, batch) -> dict[str, torch.Tensor]:
    """SGD with lr 1 from the same start: the weight change is the gradient."""
    torch.manual_seed(0)
    policy = TokenLogprobs(load_model("tiny-random"), temperature=1.0, compute_dtype=torch.float32)
    if parallel.active:
        shard_module(policy, parallel)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    updater = PolicyUpdater(
        policy,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
        AlgoSpec(loss_agg=mode, eps_high=0.28, nll_weight=0.1),
        minibatch_sequences=len(batch),
        epochs=1,
        microbatch_tokens=40,  # several micro-batches per rank, and not as many on each rank
        grad_clip=None,
        loss_agg_constant=16.0,
        parallel=parallel,
    )
    metrics = updater.update(batch, seed=0)
    weights = full_state_dict(policy) if parallel.active else policy.state_dict()
    return {"weights": weights, "metrics": metrics}


def main() -> None:
    out = Path(sys.argv[1])
    parallel = init_from_environment()
    batch = rollout_batch(seed=3, rows=8)
    tokens = parallel.gather(int(batch.select(list(parallel.share(len(batch)))).policy_loss_mask.sum()))
    for mode in AGGREGATION_MODES:
        result = updated_weights(mode, parallel, batch)
        if parallel.is_main:
            torch.save(result, out / f"{mode}-world{parallel.world_size}.pt")
    if parallel.is_main:
        (out / f"tokens-world{parallel.world_size}.json").write_text(json.dumps(tokens))


if __name__ == "__main__":
    main()
