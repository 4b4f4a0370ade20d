"""PAG's turn rules as environments (arXiv 2506.10406 §3): ``PAGRule``'s selective revision (answer, verify,
revise only after a "wrong" verdict), ``DirectRevisionRule``'s Direct MultiTurn baseline, and the verdict a
verify turn ends with (``parse_verdict``, ``probability_correct``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from reasonrl.algo.pag import VERDICT_CORRECT, VERDICT_UNPARSED, VERDICT_WRONG
from reasonrl.rollout.multiturn.episodes import (
    ROLE_POLICY,
    ROLE_VERIFIER,
    Conversation,
    Environment,
    Injection,
    Segment,
    Step,
)

# The PAG release's prompts (quick_start/qwen1p5b_pag.sh's rollout): verify, then revise after "wrong".
PAG_VERIFY_PROMPT = (
    "Check the math solution step-by-step. If you find a mistake: state the wrong step, explain why it's wrong, "
    "and end your response with 'The answer is wrong'. If all steps are correct, end your response with "
    "'The answer is correct'."
)
PAG_REVISE_PROMPT = (
    "You indicated that your previous answer was wrong. Please provide the correct solution to the math problem."
)
# Direct MultiTurn (PAG's baseline): revise without a verify turn.
DIRECT_REVISE_PROMPT = "Review your previous solution and provide a correct solution to the math problem."
VERDICT_PATTERN = re.compile(r"The answer is (correct|wrong)\.\s*\Z")


def parse_verdict(text: str) -> int:
    """The verdict at the end of a verify turn (PAG §3): ``VERDICT_CORRECT`` or ``VERDICT_WRONG`` when
    the text ends with exactly "The answer is correct." / "The answer is wrong." (trailing whitespace
    allowed), else ``VERDICT_UNPARSED``."""
    match = VERDICT_PATTERN.search(text)
    if match is None:
        return VERDICT_UNPARSED
    return VERDICT_CORRECT if match.group(1) == "correct" else VERDICT_WRONG


def probability_correct(tokenizer, turn: Segment) -> float:
    """PAG's self-verification score of a verify turn: the probability of "correct" at the token where
    the verdict is decided (the first token of its last word), from the turn's log-probs; for a "wrong"
    verdict 1 − the probability of "wrong"; 0 when the verdict is unparsed."""
    verdict = parse_verdict(turn.text)
    if verdict == VERDICT_UNPARSED:
        return 0.0
    match = VERDICT_PATTERN.search(turn.text)
    assert match is not None
    word_start = match.start(1)
    for i in range(len(turn.token_ids)):  # the token whose text reaches into the verdict word
        if len(tokenizer.decode(turn.token_ids[: i + 1], skip_special_tokens=True)) > word_start:
            p = math.exp(turn.logprobs[i])
            return p if verdict == VERDICT_CORRECT else 1.0 - p
    return 0.0


@dataclass(frozen=True)
class PAGRule(Environment):
    """PAG's selective revision (§3), as an environment: attempt → verify → (only after "wrong") revise → verify → ...

    At most ``max_attempts`` policy turns, and no verify turn after the last one (the release's
    default).  An unparsed verdict ends the conversation in training (reward 0, no revision) and counts
    as "wrong" at evaluation (``revise_unparsed``), as the release does.  Its rewards are PAG's (eq 1),
    from the verifier's verdict on every attempt (``training/rollouts/conversation_stage.py``)."""

    max_attempts: int = 2
    revise_unparsed: bool = False

    def step(self, episode: Conversation) -> Step:
        last = episode.turns()[-1]
        if last.role == ROLE_POLICY:
            if len(episode.turns(ROLE_POLICY)) >= self.max_attempts:
                return Step()
            return Step(Injection(PAG_VERIFY_PROMPT, ROLE_VERIFIER))
        verdict = parse_verdict(last.text)
        if verdict == VERDICT_WRONG or (verdict == VERDICT_UNPARSED and self.revise_unparsed):
            return Step(Injection(PAG_REVISE_PROMPT, ROLE_POLICY))
        return Step()


@dataclass(frozen=True)
class DirectRevisionRule(Environment):
    """PAG's Direct MultiTurn baseline: revise after every attempt, up to ``max_attempts``, never verify."""

    max_attempts: int = 2

    def step(self, episode: Conversation) -> Step:
        if len(episode.turns(ROLE_POLICY)) >= self.max_attempts:
            return Step()
        return Step(Injection(DIRECT_REVISE_PROMPT, ROLE_POLICY))
