"""Multi-turn rollouts: conversations whose generated turns alternate with injected ones.

``run_conversations`` generates one turn for every live conversation in one engine call (any engine:
fast, hf, vllm), then asks the conversation's ``TurnRule`` what comes next: a user message to inject
(a verify or revise template, a tool's output) with the role of the turn to generate after it, or
the end.  Injected text is rendered with the tokenizer's chat template; its tokens are fed to the
model but never trained on (``conversation_tensors`` marks them).  A conversation also ends at a
limit of generated turns or of response tokens (generated + injected).

PAG's rule (arXiv 2506.10406 §3, "selective revision") is ``PAGRule``: answer, verify the answer,
and revise only after a "wrong" verdict.  ``DirectRevisionRule`` is its Direct MultiTurn baseline
(always revise, no verify turn).  ``ToolRule`` runs a python tool called with a fenced python block or,
where the chat template has one, its own tool-call format (``<tool_call>{json}</tool_call>``); the calls
of one turn of every conversation run together, and a call that cannot be read or fails is answered with
an error message (counted in ``Conversation.tool_errors``), never an error of the run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from reasonrl.algo.pag import VERDICT_CORRECT, VERDICT_UNPARSED, VERDICT_WRONG
from reasonrl.data.control_tokens import control_tokens
from reasonrl.rollout.engine_protocol import RolloutEngine, SamplingParams, extended

ROLE_INJECTED = -1
ROLE_POLICY = 0  # an attempt at the answer
ROLE_VERIFIER = 1  # the policy judging its previous attempt

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

INJECTED_TURN_TOKENS = 128  # room left per injected turn in the default conversation cap

VERDICT_PATTERN = re.compile(r"The answer is (correct|wrong)\.\s*\Z")
FENCED_CALL = ("```python\n", "```")  # a fenced python block ending the turn
# a chat template's tool call ending the turn (the Hermes format of Qwen2.5/3, SmolLM3, Hermes models)
NATIVE_CALL = ("<tool_call>", "</tool_call>")
NATIVE_CALL_ERROR = 'Error: a tool call must be {"name": "python", "arguments": {"code": "<program>"}}'
# the python tool as a function schema, what `apply_chat_template(tools=...)` renders into the prompt
PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python program and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program to run."}},
            "required": ["code"],
        },
    },
}
TOOL_OUTPUT_CHARS = 1000  # a tool's output is cut to this many characters before it is injected


class MultiTurnError(ValueError):
    """A conversation that cannot be continued, with what to do about it."""


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


@dataclass
class Segment:
    """A run of tokens of one conversation: a generated turn, or injected text."""

    token_ids: list[int]
    logprobs: list[float]  # the engine's, per token; 0 for injected tokens
    role: int  # ROLE_POLICY / ROLE_VERIFIER for a generated turn, ROLE_INJECTED otherwise
    text: str  # the generated turn decoded (special tokens skipped), or the injected user message
    finish_reason: str | None = None  # a generated turn's: "stop" or "length"

    @property
    def generated(self) -> bool:
        return self.role != ROLE_INJECTED


@dataclass
class Conversation:
    """One prompt's conversation: its chat so far, the segments after the prompt, and what comes next."""

    prompt_ids: list[int]  # chat-formatted, ending with the assistant header
    messages: list[dict[str, str]]  # the chat the prompt rendered (system and user messages)
    stream: int = 0  # sampling stream index: the same conversation samples the same turns in any batch
    next_role: int = ROLE_POLICY
    segments: list[Segment] = field(default_factory=list)
    tools: list[dict] | None = None  # the tool schemas the prompt rendered (a template's tool-call format)
    done: bool = False
    end: str = ""  # why it ended: "rule", "turn_limit" or "token_limit"
    tool_errors: int = 0  # its tool calls that failed (unparseable, crashed, timed out...), each told to the model

    @property
    def response_length(self) -> int:
        """Tokens after the prompt, generated and injected."""
        return sum(len(s.token_ids) for s in self.segments)

    def turns(self, role: int | None = None) -> list[Segment]:
        """The generated turns, in order (only those of ``role`` when given)."""
        return [s for s in self.segments if s.generated and (role is None or s.role == role)]

    def token_ids(self) -> list[int]:
        """The prompt and every segment: what the model reads to generate the next turn."""
        return extended(self.prompt_ids, [t for s in self.segments for t in s.token_ids])  # a prompt keeps its images


@dataclass(frozen=True)
class Injection:
    """A message to append (a user message, or a tool's output), and the role of the turn generated after it."""

    text: str
    next_role: int
    message_role: str = "user"  # the chat role it is rendered as: "user", or "tool" for a native tool call
    tool_error: bool = False  # the message reports a tool call that failed


class TurnRule(Protocol):
    """Decides, after each generated turn, what a conversation does next."""

    def after(self, conversation: Conversation) -> Injection | None:
        """The message to inject after the conversation's last generated turn, or None to end it."""
        ...

    def after_each(self, conversations: Sequence[Conversation]) -> list[Injection | None]:
        """``after`` of each conversation, in order: the driver asks once per turn, so a rule that runs
        tools can run the turn's calls together."""
        return [self.after(c) for c in conversations]


@dataclass(frozen=True)
class PAGRule(TurnRule):
    """PAG's selective revision (§3): attempt → verify → (only after "wrong") revise → verify → ...

    At most ``max_attempts`` policy turns, and no verify turn after the last one (the release's
    default).  An unparsed verdict ends the conversation in training (reward 0, no revision) and counts
    as "wrong" at evaluation (``revise_unparsed``), as the release does."""

    max_attempts: int = 2
    revise_unparsed: bool = False

    def after(self, conversation: Conversation) -> Injection | None:
        last = conversation.turns()[-1]
        if last.role == ROLE_POLICY:
            if len(conversation.turns(ROLE_POLICY)) >= self.max_attempts:
                return None
            return Injection(PAG_VERIFY_PROMPT, ROLE_VERIFIER)
        verdict = parse_verdict(last.text)
        if verdict == VERDICT_WRONG or (verdict == VERDICT_UNPARSED and self.revise_unparsed):
            return Injection(PAG_REVISE_PROMPT, ROLE_POLICY)
        return None


@dataclass(frozen=True)
class DirectRevisionRule(TurnRule):
    """PAG's Direct MultiTurn baseline: revise after every attempt, up to ``max_attempts``, never verify."""

    max_attempts: int = 2

    def after(self, conversation: Conversation) -> Injection | None:
        if len(conversation.turns(ROLE_POLICY)) >= self.max_attempts:
            return None
        return Injection(DIRECT_REVISE_PROMPT, ROLE_POLICY)


def native_tool_format(tokenizer) -> bool:
    """Whether the tokenizer's chat template has a tool-call format: it renders ``tools`` and
    ``<tool_call>`` blocks (Hermes style: Qwen2.5/3, SmolLM3, Hermes models).  SmolLM2's has none."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    return "tools" in template and "<tool_call>" in template


@dataclass(frozen=True)
class ToolCall:
    """A python tool call that ends a turn: its code, or why the call cannot run."""

    code: str | None
    native: bool  # the chat template's format (the output goes back as a "tool" message), else a fenced block
    error: str = ""


def python_call(text: str) -> ToolCall | None:
    """The python tool call that ends ``text``, or None: a fenced python block, or a chat template's
    ``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>``.  A native call that is not
    that JSON is still a call, whose output is an error message saying what was expected.  Never raises,
    and takes time linear in the text: generated text decides nothing about how its parsing ends."""
    fenced = _block_ending(text, *FENCED_CALL)
    if fenced is not None:
        return ToolCall(fenced, native=False)
    native = _block_ending(text, *NATIVE_CALL)
    if native is None:
        return None
    try:
        return ToolCall(_native_code(native.strip()), native=True)
    except Exception:  # whatever the JSON makes the decoder raise (deep nesting: RecursionError) is a bad call
        return ToolCall(None, native=True, error=NATIVE_CALL_ERROR)


def _block_ending(text: str, opening: str, closing: str) -> str | None:
    """What lies between the first ``opening`` and the ``closing`` that ends ``text`` (trailing whitespace
    allowed), or None.  Two string searches: a lazy regex tried from every opening is quadratic."""
    body = text.rstrip()
    if not body.endswith(closing):
        return None
    body = body[: -len(closing)]
    start = body.find(opening)
    return None if start < 0 else body[start + len(opening) :]


def _native_code(payload: str) -> str:
    """The program of a native call's JSON ``payload``; raises unless it is a python call with a string
    of code (arguments as an object or as a JSON string) that is valid unicode (no lone surrogate)."""
    call = json.loads(payload)
    arguments = call["arguments"]
    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    code = arguments["code"]
    if call["name"] != "python" or not isinstance(code, str):
        raise TypeError("not a call of the python tool")
    code.encode()
    return code


@dataclass(frozen=True)
class ToolOutput:
    """What a tool call printed, or the error message in its place; ``failed`` when the call crashed, timed
    out, flooded its output or never ran."""

    text: str
    failed: bool = False


@dataclass(frozen=True)
class ToolRule(TurnRule):
    """A python tool: a turn that ends with a tool call (``python_call``) gets its output (cut to
    ``TOOL_OUTPUT_CHARS``) as the next turn, and the policy goes on; at most ``max_tool_calls`` per
    conversation.  A turn without a call ends it.  ``run_python`` runs the programs of one turn of every
    conversation together (sandboxed, under one time budget: ``train/conversation_stage.sandboxed_python``).  A call
    that cannot be read or that fails comes back as an error message (``Injection.tool_error``), never as
    an error of the run.  A fenced block's output comes back as a user message, a native call's as a
    "tool" message (what the template expects)."""

    run_python: Callable[[Sequence[str]], Sequence[ToolOutput]]
    max_tool_calls: int = 2

    def after(self, conversation: Conversation) -> Injection | None:
        return self.after_each([conversation])[0]

    def after_each(self, conversations: Sequence[Conversation]) -> list[Injection | None]:
        calls = [self._call(c) for c in conversations]
        outputs = iter(self.run_python([call.code for call in calls if call is not None and call.code is not None]))
        injections: list[Injection | None] = []
        for call in calls:
            if call is None:
                injections.append(None)
                continue
            output = next(outputs) if call.code is not None else ToolOutput(call.error, failed=True)
            injections.append(self._injection(call.native, output))
        return injections

    def _call(self, conversation: Conversation) -> ToolCall | None:
        """The call that ends the conversation's last turn, or None (no call, or no calls left)."""
        if sum(not s.generated for s in conversation.segments) >= self.max_tool_calls:
            return None
        return python_call(conversation.turns()[-1].text)

    @staticmethod
    def _injection(native: bool, output: ToolOutput) -> Injection:
        text = output.text[:TOOL_OUTPUT_CHARS]
        if native:
            return Injection(text, ROLE_POLICY, message_role="tool", tool_error=output.failed)
        return Injection(f"Output:\n```\n{text}\n```", ROLE_POLICY, tool_error=output.failed)


def injected_ids(tokenizer, conversation: Conversation, injection: Injection) -> tuple[list[int], list[dict[str, str]]]:
    """The tokens that close the last generated turn and open the next one after ``injection``'s
    message, rendered by the chat template (with the conversation's tools); and the chat with both
    messages added.

    The template renders the whole chat twice, with the injected message and without it; the difference
    is the new turn and the assistant header.  Before it goes whatever the template puts after an
    assistant message (e.g. "<|im_end|>\\n"), less the stop token the model already generated.
    """
    last = conversation.turns()[-1]
    chat = [*conversation.messages, {"role": "assistant", "content": last.text}]
    with_message = [*chat, {"role": injection.message_role, "content": injection.text}]
    controls = control_tokens(tokenizer)  # what the messages spell stays text: a tool's output cannot open a turn
    if not tokenizer.chat_template:  # plain text models: blank lines between turns
        return controls.text_ids(f"\n\n{injection.text}\n\n"), with_message
    tools = conversation.tools
    closed = controls.render(chat, tools)
    opened = controls.render(with_message, tools, generation_prompt=True)
    if not opened.startswith(closed):
        raise MultiTurnError(
            "the model's chat template renders earlier turns differently once a turn is added; "
            "multi-turn rollouts need a template that only appends"
        )
    marked_text = controls.mark(last.text)
    content_end = closed.rfind(marked_text) + len(marked_text) if last.text else len(closed)
    after_assistant = closed[content_end:]
    if last.finish_reason == "stop" and last.token_ids:
        emitted = tokenizer.decode(last.token_ids[-1:], skip_special_tokens=False)
        after_assistant = after_assistant.removeprefix(emitted)
    return controls.encode(after_assistant + opened[len(closed) :]), with_message


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of every conversation's ``turn``-th generated turn (0-based)."""
    return None if seed is None else seed * 1_000 + turn


def run_conversations(
    engine: RolloutEngine,
    tokenizer,
    conversations: Sequence[Conversation],
    rule: TurnRule,
    params: SamplingParams,
    *,
    max_turns: int,
    max_response_tokens: int | None = None,
) -> list[Conversation]:
    """Generate every conversation to its end, one turn of all live conversations per engine call.

    ``params.max_new_tokens`` caps each turn; ``max_response_tokens`` caps a conversation's tokens
    after its prompt (generated and injected; None = no cap), ``max_turns`` its generated turns.  Conversation i's
    turn t samples from stream ``conversations[i].stream`` with seed ``turn_seed(params.seed, t)``,
    whatever else is in the call.
    """
    cap = max_response_tokens if max_response_tokens is not None else float("inf")
    for turn in range(max_turns):
        live = [c for c in conversations if not c.done]
        if not live:
            break
        # 1. one engine call per remaining-token budget (all equal until a conversation nears the cap)
        budgets: dict[int, list[Conversation]] = {}
        for c in live:
            budgets.setdefault(int(min(params.max_new_tokens, cap - c.response_length)), []).append(c)
        for budget, group in budgets.items():
            call = dataclasses.replace(
                params,
                max_new_tokens=budget,
                seed=turn_seed(params.seed, turn),
                request_indices=tuple(c.stream for c in group),
            )
            completions = engine.generate([c.token_ids() for c in group], call)
            texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
            for c, completion, text in zip(group, completions, texts, strict=True):
                c.segments.append(
                    Segment(completion.token_ids, completion.logprobs, c.next_role, text, completion.finish_reason)
                )
        # 2. the rule decides (for all at once: their tool calls run together); the injected turn must
        # leave room for at least one generated token
        for c, injection in zip(live, rule.after_each(live), strict=True):
            if injection is None:
                c.done, c.end = True, "rule"
                continue
            c.tool_errors += injection.tool_error
            if turn + 1 >= max_turns:
                c.done, c.end = True, "turn_limit"
                continue
            ids, c.messages = injected_ids(tokenizer, c, injection)
            if c.response_length + len(ids) >= cap:
                c.done, c.end = True, "token_limit"
                continue
            c.segments.append(Segment(ids, [0.0] * len(ids), ROLE_INJECTED, injection.text))
            c.next_role = injection.next_role
    for c in conversations:
        if not c.done:
            c.done, c.end = True, "turn_limit"
    return list(conversations)


@dataclass
class ConversationTensors:
    """A batch of finished conversations as the trainer's [B, T] response tensors (right-padded)."""

    response_ids: Tensor  # [B, T] long: every token after the prompt, generated and injected
    response_mask: Tensor  # [B, T] bool: generated tokens only (injected ones are read, never trained)
    rollout_logprobs: Tensor  # [B, T] float: the engine's, 0 at injected tokens
    role_ids: Tensor  # [B, T] long: ROLE_POLICY / ROLE_VERIFIER per generated token, ROLE_INJECTED elsewhere
    turn_ids: Tensor  # [B, T] long: the generated turn's index (0-based), -1 at injected and padding tokens
    turn_ends: list[list[int]]  # per conversation: the position of each generated turn's last token


def conversation_tensors(conversations: Sequence[Conversation], pad_token_id: int) -> ConversationTensors:
    """Stack finished conversations into right-padded [B, T] tensors."""
    width = max(1, max(c.response_length for c in conversations))
    shape = (len(conversations), width)
    ids = torch.full(shape, pad_token_id, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.bool)
    logprobs = torch.zeros(shape)
    roles = torch.full(shape, ROLE_INJECTED, dtype=torch.long)
    turns = torch.full(shape, -1, dtype=torch.long)
    ends: list[list[int]] = []
    for row, c in enumerate(conversations):
        position, turn, row_ends = 0, 0, []
        for s in c.segments:
            span = slice(position, position + len(s.token_ids))
            ids[row, span] = torch.tensor(s.token_ids, dtype=torch.long)
            logprobs[row, span] = torch.tensor(s.logprobs)
            if s.generated and s.token_ids:
                mask[row, span] = True
                roles[row, span] = s.role
                turns[row, span] = turn
                row_ends.append(span.stop - 1)
            turn += s.generated
            position = span.stop
        ends.append(row_ends)
    return ConversationTensors(ids, mask, logprobs, roles, turns, ends)
