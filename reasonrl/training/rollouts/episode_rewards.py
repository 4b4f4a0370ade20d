"""An environment run's rewards at each episode's end, as TRL sums them: the environment's own reward, the run's
reward functions called with the episodes' environments, and the verifier where neither speaks.

``EpisodeRewards.score`` reads top to bottom (docs/environments.md, "Rewards"):
1. the reward functions of ``reward.functions`` (TRL's ``reward_funcs``): each called once for the step's
   episodes, in this process, with TRL's keywords: ``environments`` (each episode's instance, in row order),
   ``completions`` (each episode's messages after the prompt: assistant turns, tool answers), ``completion_ids``,
   ``trainer_state`` and the rows' columns; a call that raises or runs out of ``reward.timeout_seconds`` per
   episode fails that function for the step's episodes (counted, as a scorer's failures are);
2. the verifier on the final turn, where ``reward.functions`` lists ``verifier``, or where there are no reward
   functions and the environment gives no reward of its end (``Environment.finish`` returned None);
3. per episode: the end's reward = the environment's (weight 1, as TRL adds ``get_reward``) + the reward scale
   (``reward.incorrect_score`` + span · Σ wᵢ·fᵢ; the verifier's score alone when there are no functions);
   solved = the verifier's verdict where it scored, else a function's verdict (verl's ``acc``), else whether
   the episode's whole return is positive.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reasonrl.config.schema import RewardConfig
from reasonrl.data.examples import Example
from reasonrl.data.loaders import DataError
from reasonrl.reward.custom import EpisodeRecords, RewardTerm, combined_result, reward_terms, sample_payload
from reasonrl.reward.verifier_protocol import RewardResult, Scorer, ScoringContext
from reasonrl.rollout.multiturn.episodes import Conversation, Failure, contained

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeScore:
    """What an episode's end earns: the reward added on its last turn, and whether it counts as solved."""

    end_reward: float
    correct: bool
    result: RewardResult
    """The scorers' account (``info["terms"]``, ``info["term_errors"]``) that the step's error checks count."""


def completion_messages(conversation: Conversation, prompt_messages: int) -> list[dict[str, Any]]:
    """An episode's completion as TRL gives it to reward functions: its messages after the ``prompt_messages``
    of its prompt (assistant turns and what was answered to them), the last turn included."""
    messages = [dict(m) for m in conversation.messages[prompt_messages:]]
    turns = conversation.turns()
    if turns and (not messages or messages[-1].get("content") != turns[-1].text or messages[-1]["role"] != "assistant"):
        messages.append({"role": "assistant", "content": turns[-1].text})
    return messages


class EpisodeRewards:
    """The end rewards of an environment run's episodes (the module docstring): ``terms`` of ``reward.functions``
    (the verifier term scored by ``scorer``, the run's built-in scorer)."""

    def __init__(self, reward: RewardConfig, scorer: Scorer, max_steps: int) -> None:
        self.reward, self.scorer, self.max_steps = reward, scorer, max_steps
        self.terms: list[RewardTerm] = reward_terms(reward.functions, reward.weights)
        self.failed: set[str] = set()

    def score(
        self, rows: Sequence[Example], conversations: Sequence[Conversation], prompt_messages: Sequence[int], step: int
    ) -> list[EpisodeScore]:
        """Each episode's ``EpisodeScore`` (a failed episode: 0, not solved)."""
        live = [i for i, x in enumerate(conversations) if not x.error]
        # 1. the reward functions, each once for the step's episodes
        values = {term.name: self.function_results(term, rows, conversations, prompt_messages, live, step)
                  for term in self.terms if term.function is not None}  # fmt: skip
        # 2. the verifier on the final turns that need it
        listed = any(term.function is None for term in self.terms)
        judged = [i for i in live if listed or (not self.terms and conversations[i].final_reward is None)]
        verdicts = dict(zip(judged, self.verifier_results(rows, conversations, judged), strict=True))
        # 3. per episode
        scores = [
            EpisodeScore(0.0, False, RewardResult(0.0, False, {"environment_error": x.error})) for x in conversations
        ]
        for i in live:
            per_term = {name: results[live.index(i)] for name, results in values.items()}
            scores[i] = self.combine(conversations[i], per_term, verdicts.get(i))
        return scores

    def function_results(
        self,
        term: RewardTerm,
        rows: Sequence[Example],
        conversations: Sequence[Conversation],
        prompt_messages: Sequence[int],
        live: Sequence[int],
        step: int,
    ) -> list[RewardResult]:
        """One call of ``term``'s function for the episodes ``live``: its result per episode (a failed call:
        an error result each)."""
        if not live:
            return []
        assert term.function is not None
        function = term.function
        episodes = EpisodeRecords(
            [conversations[i].state for i in live],
            [completion_messages(conversations[i], prompt_messages[i]) for i in live],
        )
        context = ScoringContext(
            tuple(tuple(t for s in conversations[i].segments if s.generated for t in s.token_ids) for i in live),
            step,
            self.max_steps,
        )
        responses = [conversations[i].turns()[-1].text if conversations[i].turns() else "" for i in live]
        examples = [rows[i] for i in live]
        samples = [sample_payload(e) for e in examples]
        references = [e.answer for e in examples]

        def call() -> list[RewardResult]:
            if function.batched:
                return function.score_batch(responses, references, samples, context, episodes)
            return [function(r, ref, s) for r, ref, s in zip(responses, references, samples, strict=True)]

        (outcome,) = contained([call], self.reward.timeout_seconds * len(live))
        if isinstance(outcome, Failure):
            if term.name not in self.failed:  # the first failure of each function is logged, later ones counted
                self.failed.add(term.name)
                log.warning("reward function '%s' failed on step %d's episodes: %s", term.name, step, outcome.error)
            return [RewardResult(0.0, False, {"error": outcome.error})] * len(live)
        return outcome

    def verifier_results(
        self, rows: Sequence[Example], conversations: Sequence[Conversation], judged: Sequence[int]
    ) -> list[RewardResult]:
        """The built-in scorer's result for each episode ``judged`` (its final turn against the row's answer)."""
        if not judged:
            return []
        unanswered = next((rows[i] for i in judged if not rows[i].answer), None)
        if unanswered is not None:
            raise DataError(
                f"row {unanswered.id} has no answer, and its episode's end has no reward but the verifier's: the "
                "environment gave none (no get_reward, no reward attribute) and reward.functions is empty "
                "(reward_funcs in Python); give reward functions, a get_reward method, or rows with an answer "
                "(data.answer_field)"
            )
        return self.scorer.score_examples(
            [rows[i] for i in judged], [conversations[i].turns()[-1].text for i in judged]
        )

    def combine(
        self, conversation: Conversation, per_term: dict[str, RewardResult], verdict: RewardResult | None
    ) -> EpisodeScore:
        """An episode's end reward and verdict from the environment's reward, its functions' and the verifier's."""
        reward, environment = self.reward, conversation.final_reward or 0.0
        span = reward.correct_score - reward.incorrect_score
        if not self.terms:  # no functions: the environment's reward, or the verifier's score on the scale
            if verdict is None:
                solved = environment + sum(conversation.rewards) > 0
                return EpisodeScore(environment, solved, RewardResult(environment, solved))
            return EpisodeScore(environment + reward.incorrect_score + span * verdict.score, verdict.correct, verdict)
        results = [verdict if term.function is None else per_term[term.name] for term in self.terms]
        combined = combined_result(self.terms, results)  # type: ignore[arg-type]
        end = environment + reward.incorrect_score + span * combined.score
        solved = combined.correct if combined.info["verdict_from"] else end + sum(conversation.rewards) > 0
        return EpisodeScore(end, solved, RewardResult(combined.score, solved, combined.info))
