"""What each offline step reads (algo.offline): a dataset sampled beforehand (``reasonrl data sample``), its
items in a seeded order, as RolloutBatches with the reference policy's log-probs.

Step ``s`` reads positions (s−1)·k … s·k−1 of a sequence of seeded shuffles of the dataset, one per
epoch, so a resumed run reads exactly what an uninterrupted one would.  The steps that train on them
are ``reasonrl.training.offline_steps``.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import torch

from reasonrl.batch import RolloutBatch, pad_rows
from reasonrl.data.loaders import DataError
from reasonrl.data.offline_dataset import OfflineSample, preference_pairs, read_samples


class OfflineData:
    """The offline dataset of a run: its samples, what each step reads, and the reference log-probs
    (``reference``, filled once by ``offline_steps.compute_reference``).

    DQO's items are responses; DPO's are (chosen, rejected) pairs, ``per_step`` // 2 of them a step.
    """

    def __init__(self, path: str | Path, objective: str, per_step: int, seed: int, vocab_size: int) -> None:
        self.samples = read_samples(path)
        biggest = max(max((*s.prompt_token_ids, *s.response_token_ids)) for s in self.samples)
        if biggest >= vocab_size:
            raise DataError(
                f"{path}: token id {biggest} is outside the model's vocabulary ({vocab_size} tokens); the file was "
                "sampled with another tokenizer: sample it again with this model (`reasonrl data sample --model`)"
            )
        if objective == "dpo":
            pairs = preference_pairs(self.samples)
            if not pairs:
                raise DataError(
                    f"{path}: no prompt has both a correct and a wrong response, so DPO has no pair; sample more "
                    "responses per prompt (--samples-per-prompt) or an easier/harder split"
                )
            self.items: list[tuple[int, ...]] = list(pairs)
            self.per_step = per_step // 2
        else:
            self.items = [(i,) for i in range(len(self.samples))]
            self.per_step = per_step
        self.seed = seed
        self.reference: dict[int, torch.Tensor] = {}
        self.fingerprint = hashlib.sha256(
            repr([(x.id, x.prompt_token_ids, x.response_token_ids) for x in self.samples]).encode()
        ).hexdigest()
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.items)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}  # steps move forward: one epoch's order is enough
        return self._orders[epoch]

    def step_rows(self, step: int) -> list[int]:
        """The sample indices step ``step`` (1-based) trains on; a DPO pair's two rows are adjacent."""
        rows: list[int] = []
        for position in range((step - 1) * self.per_step, step * self.per_step):
            epoch, offset = divmod(position, len(self.items))
            rows.extend(self.items[self._order(epoch)[offset]])
        return rows

    def batch(self, rows: list[int]) -> RolloutBatch:
        """The samples ``rows`` as a batch: behaviour log-probs in ``rollout_logprobs``, the outcome (and
        any process rewards) in ``token_rewards``, the cached reference log-probs in ``ref_logprobs``."""
        samples = [self.samples[i] for i in rows]
        return samples_batch(samples, [self.reference[i] for i in rows] if self.reference else None)


def samples_batch(samples: list[OfflineSample], reference: list[torch.Tensor] | None = None) -> RolloutBatch:
    """Offline samples as a RolloutBatch (prompts left-padded, responses right-padded)."""
    prompts = [s.prompt_token_ids for s in samples]
    responses = [s.response_token_ids for s in samples]
    width, prompt_width = max(map(len, responses)), max(map(len, prompts))
    response_mask = pad_rows([[1] * len(r) for r in responses], width, False, torch.bool)
    rewards = torch.tensor([s.reward for s in samples])
    prompts_seen: dict[str, int] = {}
    token_rewards = torch.zeros(len(samples), width)
    for row, sample in enumerate(samples):
        token_rewards[row, len(sample.response_token_ids) - 1] = sample.reward  # the outcome on the last token
        for index, value in sample.process_rewards:
            token_rewards[row, index] += value
    ref = None if reference is None else pad_rows([r.tolist() for r in reference], width, False, torch.float)
    return RolloutBatch(
        prompt_ids=pad_rows(prompts, prompt_width, True, torch.long),
        prompt_mask=pad_rows([[1] * len(p) for p in prompts], prompt_width, True, torch.bool),
        response_ids=pad_rows(responses, width, False, torch.long),
        response_mask=response_mask,
        policy_loss_mask=response_mask.clone(),
        value_loss_mask=response_mask.clone(),
        rollout_logprobs=pad_rows([s.behaviour_logprobs for s in samples], width, False, torch.float32),
        rewards=rewards,
        correct=torch.tensor([s.correct for s in samples]),
        truncated=torch.tensor([s.truncated for s in samples]),
        group_ids=torch.tensor([prompts_seen.setdefault(s.example_id, len(prompts_seen)) for s in samples]),
        token_rewards=token_rewards,
        ref_logprobs=ref,
    )
