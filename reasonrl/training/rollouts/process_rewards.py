"""Dense line rewards from a process reward model for code responses (arXiv 2410.17621, §3 and §4.3.3).

The unit-test outcome stays the terminal reward; the PRM adds one reward per line on the line's end
token (``reward.prm_dense``), for rows whose task type is ``code`` (the rows the router sends to the
code verifier).  docs/algorithms.md, "Process rewards for code", lists the choices the paper leaves open.
"""

from __future__ import annotations

import torch

from reasonrl.algo.shaping import paper_line_rewards, place_rewards, potential_shaping
from reasonrl.batch import RolloutBatch, pad_rows
from reasonrl.config.schema import RewardConfig
from reasonrl.reward.prm import ProcessRewardModel


class ProcessRewards:
    """``(batch, code_rows) -> (dense_rewards [B, T], metrics)`` for ``reward.prm_dense`` paper | potential."""

    def __init__(self, reward: RewardConfig, prm: ProcessRewardModel) -> None:
        self.reward, self.prm = reward, prm

    def __call__(self, batch: RolloutBatch, code_rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        low, high = self.reward.incorrect_score, self.reward.correct_score
        width = batch.response_ids.shape[1]
        # 1. the lines of every code response
        lengths = batch.response_mask.sum(dim=1).tolist()
        lines = [
            self.prm.lines(batch.response_ids[b, : lengths[b]].tolist()) if code_rows[b] else []
            for b in range(len(batch))
        ]
        # 2. the PRM's score after each line (the state after its end token) and before any, on the reward scale
        states = (
            low
            + (high - low)
            * self.prm.state_scores(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask).cpu()
        )  # [B, T + 1], with the batch (the PRM may sit on the GPU)
        count = max(1, max(map(len, lines)))
        ends = pad_rows([[line.end_token for line in row] for row in lines], count, False, torch.long)  # [B, K]
        valid = pad_rows([[1] * len(row) for row in lines], count, False, torch.bool)  # [B, K]
        rewarded = pad_rows([[not line.neutral for line in row] for row in lines], count, False, torch.bool)
        scores = states.gather(1, ends + 1)  # [B, K]
        # 3. one reward per rewarded line, on its end token
        if self.reward.prm_dense == "paper":
            per_line = paper_line_rewards(
                scores, rewarded, batch.correct, self.reward.prm_lambda_failing, self.reward.prm_lambda_passing
            )
        else:
            per_line = potential_shaping(scores, rewarded, states[:, 0], self.reward.prm_coef)
        dense = place_rewards(per_line, ends, valid & rewarded, width)  # [B, T]
        dense = torch.where(code_rows[:, None], dense, torch.zeros_like(dense))
        return dense, self.stats(batch, code_rows, dense, scores, valid, lines)

    @staticmethod
    def stats(batch, code_rows, dense, scores, valid, lines) -> dict[str, float]:
        """What the dense rewards did: their size and the PRM's view of the code responses."""
        code = code_rows.bool()
        if not code.any():
            return {}
        last = torch.tensor([max(0, len(row) - 1) for row in lines])
        has_lines = valid.any(dim=1) & code
        final = scores.gather(1, last[:, None]).squeeze(1)[has_lines]
        return {
            "reward/prm_dense_mean": dense.sum(dim=1)[code].mean().item(),
            "reward/prm_final_score_mean": final.mean().item() if has_lines.any() else 0.0,
            "reward/prm_lines_mean": valid.sum(dim=1)[code].float().mean().item(),
        }


def all_failed_prompt_stats(batch: RolloutBatch, code_rows: torch.Tensor) -> dict[str, float]:
    """Code prompts with two or more samples that all failed their tests, and the share of them whose
    samples' total rewards (outcome + dense, where there are dense rewards) still differ: the learning
    signal such a prompt gets from its rewards (a PRM's, or partial test passes), arXiv 2410.17621's
    motivation.  Nothing with one sample per prompt (no within-prompt comparison to make)."""
    code = code_rows.bool()
    if not code.any():
        return {}
    totals = batch.rewards + (batch.dense_rewards.sum(dim=1) if batch.dense_rewards is not None else 0.0)
    signalled = all_failed = compared = 0
    for group in batch.group_ids[code].unique():
        rows = (batch.group_ids == group) & code
        if rows.sum() < 2:
            continue
        compared += 1
        if not batch.correct[rows].any():
            all_failed += 1
            signalled += int(totals[rows].max() > totals[rows].min())
    if not compared:
        return {}
    return {
        "reward/all_failed_prompts": float(all_failed),
        "reward/all_failed_prompts_with_signal": signalled / all_failed if all_failed else 0.0,
    }
