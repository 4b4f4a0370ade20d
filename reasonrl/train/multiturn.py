"""The multi-turn rollout stage: conversations -> per-turn rewards -> a RolloutBatch (PAG, arXiv 2506.10406).

``ConversationCollector.collect`` reads top to bottom as PAG's rollout and reward (§3, eq 1):
1. sample ``rollout_prompts`` prompts, G conversations each;
2. generate them turn by turn (``run_conversations``: attempt, verify, revise only after "wrong");
3. score every attempt with the task's verifier;
4. reward every turn on its own last token: an attempt acc_t + α·(acc_t − acc_{t−1}) (the revision
   bonus), a verify turn 1 when its verdict matches the truth of the attempt it judges;
5. stack the conversations: injected tokens are in no loss and cut the GAE chain
   (``algo.gae_mask_mode=reset``), and RoleAdvNorm whitens each role apart (``advantage_norm=role_whiten``).
"""

from __future__ import annotations

import torch

from reasonrl.algo.pag import pag_attempt_rewards, pag_verify_rewards
from reasonrl.batch import RolloutBatch, pad_rows
from reasonrl.data.loaders import DataError
from reasonrl.rollout.multiturn import (
    INJECTED_TURN_TOKENS,
    ROLE_POLICY,
    Conversation,
    DirectRevisionRule,
    PAGRule,
    conversation_tensors,
    parse_verdict,
    run_conversations,
)
from reasonrl.timing import timed
from reasonrl.train.rollout import Generated, RolloutCollector, finished_stats, hash_seed


def turn_rule(protocol: str, max_attempts: int, evaluation: bool = False):
    """The TurnRule of ``rollout.multiturn``."""
    if protocol == "pag":
        return PAGRule(max_attempts, revise_unparsed=evaluation)
    if protocol == "direct":
        return DirectRevisionRule(max_attempts)
    raise ValueError(f"no multi-turn rule for rollout.multiturn={protocol!r}")


def conversation_token_cap(max_attempts: int, max_response_tokens: int, cap: int | None) -> int:
    """rollout.max_conversation_tokens, or its default: 2·attempts − 1 turns plus 128 tokens per injected turn."""
    turns = 2 * max_attempts - 1
    return cap if cap is not None else turns * max_response_tokens + (turns - 1) * INJECTED_TURN_TOKENS


class ConversationCollector:
    """Produces each step's batch of multi-turn conversations (``rollout.multiturn``), reusing the
    synchronous collector's engine, stream, prompt encoder and scorer."""

    def __init__(self, synchronous: RolloutCollector) -> None:
        self.synchronous, self.alpha = synchronous, synchronous.cfg.algo.revision_bonus
        rollout = synchronous.cfg.rollout
        self.rule = turn_rule(rollout.multiturn, rollout.max_attempts)
        self.max_turns = 2 * rollout.max_attempts - 1
        self.token_cap = conversation_token_cap(
            rollout.max_attempts, rollout.max_response_tokens, rollout.max_conversation_tokens
        )

    def collect(self, step: int, seed_step: int | None = None) -> tuple[RolloutBatch, dict[str, float]]:
        c, generated = self.synchronous, Generated()
        # 1. prompts, G conversations each (stream = row: a conversation samples the same in any batch)
        examples = [e for e in c.stream.take(c.plan.prompts_per_generation_pass, step) if c.encoder(e) is not None]
        if not examples:
            raise DataError(
                f"every prompt of the step is longer than rollout.max_prompt_tokens={c.encoder.max_prompt_tokens}"
            )
        examples = examples[: c.cfg.rollout.rollout_prompts]
        rows = [e for e in examples for _ in range(c.group_size)]
        conversations = [Conversation(c.encoder(e), c.encoder.messages(e), stream=i) for i, e in enumerate(rows)]
        # 2. generate turn by turn
        params = c.sampling_params(hash_seed(c.cfg.run.seed, step if seed_step is None else seed_step, 1))
        with timed(generated.timing, "perf/generate_seconds"):
            run_conversations(
                c.engine, c.tokenizer, conversations, self.rule, params,
                max_turns=self.max_turns, max_response_tokens=self.token_cap,
            )  # fmt: skip
        generated.calls.append([len(t.token_ids) for x in conversations for t in x.turns()])
        # 3. every attempt through the verifier
        attempts = [x.turns(ROLE_POLICY) for x in conversations]
        flat = [(row, a) for row, turns in enumerate(attempts) for a in turns]
        with timed(generated.timing, "perf/score_seconds"):
            results = c.pool.score_examples([rows[row] for row, _ in flat], [a.text for _, a in flat])
        generated.results += results
        # 4. per-turn rewards on each turn's last token
        tensors = conversation_tensors(conversations, c.tokenizer.pad_token_id)
        turn_rewards, stats = self.turn_rewards(conversations, tensors.turn_ends, [r.correct for r in results])
        batch = self.batch(conversations, tensors, turn_rewards, results, flat)
        return batch, {
            **stats,
            **finished_stats(batch, torch.ones(len(batch), dtype=torch.bool), results),
            **generated.stats(),
        }

    def turn_rewards(self, conversations, turn_ends, correct: list[bool]) -> tuple[torch.Tensor, dict[str, float]]:
        """[B, T] rewards at each generated turn's last token (PAG eq 1), and PAG's rollout metrics."""
        most = max(len(x.turns(ROLE_POLICY)) for x in conversations)
        acc = torch.zeros(len(conversations), most)
        attempt_mask = torch.zeros(len(conversations), most, dtype=torch.bool)
        verdicts = torch.zeros(len(conversations), most, dtype=torch.long)
        judged = torch.zeros(len(conversations), most)  # truth of the attempt a verify turn judges
        verify_mask = torch.zeros(len(conversations), most, dtype=torch.bool)
        flat = iter(correct)
        for row, x in enumerate(conversations):
            attempt = -1
            for turn in x.turns():
                if turn.role == ROLE_POLICY:
                    attempt += 1
                    acc[row, attempt], attempt_mask[row, attempt] = float(next(flat)), True
                else:  # ROLE_VERIFIER judges attempt `attempt`
                    verdicts[row, attempt], judged[row, attempt] = parse_verdict(turn.text), acc[row, attempt]
                    verify_mask[row, attempt] = True
        attempt_rewards = pag_attempt_rewards(acc, attempt_mask, self.alpha)  # [B, A]
        verify_rewards = pag_verify_rewards(verdicts, judged, verify_mask)  # [B, A]
        width = max(1, max(x.response_length for x in conversations))
        rewards = torch.zeros(len(conversations), width)
        for row, x in enumerate(conversations):
            attempt = -1
            for turn, end in zip(x.turns(), turn_ends[row], strict=True):
                attempt += turn.role == ROLE_POLICY
                table = attempt_rewards if turn.role == ROLE_POLICY else verify_rewards
                rewards[row, end] = table[row, attempt]
        attempts = attempt_mask.sum(1)
        final = acc[torch.arange(len(acc)), attempts - 1]
        stats = {
            "multiturn/turns_mean": float(sum(len(x.turns()) for x in conversations)) / len(conversations),
            "multiturn/revision_rate": (attempts > 1).float().mean().item(),
            "multiturn/accuracy_t1": acc[:, 0].mean().item(),
            "multiturn/accuracy_final": final.mean().item(),
        }
        if verify_mask.any():
            right = pag_verify_rewards(verdicts, judged, verify_mask)[verify_mask]
            stats["multiturn/verifier_accuracy"] = right.mean().item()
            stats["multiturn/verdict_unparsed_fraction"] = (verdicts[verify_mask] < 0).float().mean().item()
        return rewards, stats

    def batch(self, conversations, tensors, turn_rewards, results, flat) -> RolloutBatch:
        """The conversations as a RolloutBatch: the final attempt's verdict is the row's ``correct``, the
        sum of its turn rewards its ``rewards``."""
        prompts = [x.prompt_ids for x in conversations]
        width = max(len(p) for p in prompts)
        last_result = {row: r for (row, _), r in zip(flat, results, strict=True)}  # later attempts overwrite
        group = torch.arange(len(conversations)) // self.synchronous.group_size
        truncated = torch.tensor(
            [x.end == "token_limit" or x.turns()[-1].finish_reason == "length" for x in conversations]
        )
        return RolloutBatch(
            prompt_ids=pad_rows(prompts, width, True, torch.long),
            prompt_mask=pad_rows([[1] * len(p) for p in prompts], width, True, torch.bool),
            response_ids=tensors.response_ids,
            response_mask=tensors.response_mask,
            policy_loss_mask=tensors.response_mask.clone(),
            value_loss_mask=tensors.response_mask.clone(),
            rollout_logprobs=tensors.rollout_logprobs,
            rewards=turn_rewards.sum(1),
            correct=torch.tensor([last_result[row].correct for row in range(len(conversations))]),
            truncated=truncated,
            group_ids=group,
            turn_rewards=turn_rewards,
            role_ids=tensors.role_ids,
            turn_ids=tensors.turn_ids,
        )
