"""Preference transcripts (HH-RLHF) as chat messages, and their prompts as RL examples with an anchor."""

from __future__ import annotations

import re
from typing import Any

from reasonrl.data.examples import Example, RowError

_TURN = re.compile(r"\n\n(Human|Assistant): ")


def parse_transcript(text: str) -> list[dict[str, str]]:
    """HH-RLHF ``\\n\\nHuman: ...\\n\\nAssistant: ...`` text -> chat messages."""
    parts = _TURN.split(text)
    roles = {"Human": "user", "Assistant": "assistant"}
    return [{"role": roles[parts[i]], "content": parts[i + 1].strip()} for i in range(1, len(parts) - 1, 2)]


def conversation_text(messages: list[dict[str, str]]) -> str:
    """A conversation as one request: the message itself, or 'User: ... / Assistant: ...' lines."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


def hh_prompt_example(split: str, location: str, row: dict[str, Any], index: int) -> Example:
    """An HH-RLHF pair as an RL prompt: the dialogue before the last reply (as chat messages, and flattened as
    ``question``), the human-chosen reply as the anchor (task_type "reference": the router sends it to the
    pairwise judge / GenRM, or with the bt route to the Bradley-Terry model, which reads the messages as
    it was trained on them)."""
    messages = parse_transcript(str(row.get("chosen", "")))
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        raise RowError(f"{location}: 'chosen' is not an HH transcript ending with an Assistant turn")
    dialogue = messages[:-1]  # the policy answers the real multi-turn chat; judges read it as text
    reply = messages[-1]["content"]
    return Example(f"hh-rlhf:{index}", conversation_text(dialogue), reply, "reference", tuple(dialogue))
