"""Multi-turn rollouts: episodes whose generated turns alternate with what an environment injects.

``start_conversations`` asks the ``Environment`` (``rollout/multiturn/episodes.py``) for each episode's first
observation; ``run_conversations`` then generates one turn for every live conversation in one engine call
(any engine: fast, hf, vllm) and asks the environment what comes next: a message to inject (a verify or
revise template, a tool's output, a game's feedback) with the role of the turn to generate after it, or the
end, and the turn's reward.  Token in, token out: a generated turn enters the conversation as the engine's
token ids, never decoded and encoded again; injected text is rendered with the tokenizer's chat template,
and what it spells is tokenised as plain text (``data/control_tokens.py``: it can never become a special or
template token).  Injected tokens are fed to the model but never trained on (``conversation_tensors`` marks
them).  A conversation also ends at a limit of generated turns or of response tokens (generated + injected).

PAG's rule (arXiv 2506.10406 §3, "selective revision") is the environment ``PAGRule``
(``rollout/multiturn/pag_rules.py``): answer, verify the answer, and revise only after a "wrong" verdict.
``DirectRevisionRule`` is its Direct MultiTurn baseline (always revise, no verify turn). ``ToolRule`` runs a python
tool called with a fenced python block or the chat template's own tool-call format
(``rollout/multiturn/tool_calls.py``); the calls of one turn of every conversation run together, and a call that
cannot be read or fails is answered with an error message (counted in ``Conversation.tool_errors``), never an error
of the run. The calls a turn makes in the template's format are answered together, a "tool" message each, in order
(``tool_answers``; ``answer_tool_calls`` for an environment's ``FunctionTool``s), as TRL answers them. The shipped
game environments are in ``rollout/multiturn/environments.py``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from reasonrl.data.control_tokens import control_tokens
from reasonrl.data.examples import Example
from reasonrl.data.prompts import chat_token_ids
from reasonrl.reward.verifier_protocol import reward_number
from reasonrl.rollout.engine_protocol import RolloutEngine, SamplingParams
from reasonrl.rollout.multiturn.episodes import (
    ROLE_INJECTED,
    ROLE_POLICY,
    Conversation,
    Environment,
    Failure,
    Injection,
    Segment,
    Step,
    contained,
)
from reasonrl.rollout.multiturn.tool_calls import (
    TOOL_NAME_CHARS,
    TOOL_OUTPUT_CHARS,
    FunctionTool,
    ToolOutput,
    block_ending,
    call_tool,
    function_calls,
    native_tool_format,
)

INJECTED_TURN_TOKENS = 128  # room left per injected turn in the default conversation cap

FENCED_CALL = ("```python\n", "```")  # a fenced python block ending the turn
NATIVE_CALL_ERROR = 'Error: a tool call must be {"name": "python", "arguments": {"code": "<program>"}}'
CALLS_SPENT = "Error: this episode's tool calls are spent; this call was not run"
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
ENVIRONMENT_TIMEOUT_S = 60.0  # one turn's environment steps, all together (rollout.environment_timeout_seconds)


class MultiTurnError(ValueError):
    """A conversation that cannot be continued, with what to do about it."""


@dataclass(frozen=True)
class ToolCall:
    """A python tool call of a turn: the name it calls, its code, or why the call cannot run."""

    name: str
    code: str | None
    native: bool  # the chat template's format (the output goes back as a "tool" message), else a fenced block
    error: str = ""


def python_calls(text: str) -> list[ToolCall]:
    """The python tool calls of ``text``, in order, or [] (the turn is an answer): a fenced python block that
    ends it, or the calls of the chat template's format (``tool_calls.function_calls``), each ``{"name":
    "python", "arguments": {"code": ...}}``.  A native call that is not that is still a call, whose output is
    an error message saying what was expected.  Never raises, and takes time linear in the text: generated
    text decides nothing about how its parsing ends."""
    fenced = block_ending(text, *FENCED_CALL)
    if fenced is not None:
        return [ToolCall("python", fenced, native=False)]
    calls = []
    for call in function_calls(text):
        code = call.arguments.get("code")
        if call.error or call.name != "python" or not isinstance(code, str):
            calls.append(ToolCall(call.name, None, native=True, error=NATIVE_CALL_ERROR))
        else:
            calls.append(ToolCall(call.name, code, native=True))
    return calls


def fenced_answer(output: ToolOutput) -> Step:
    """The step that answers a fenced python block with its output (cut to ``TOOL_OUTPUT_CHARS``) in a user
    message, and lets the policy go on."""
    text = f"Output:\n```\n{output.text[:TOOL_OUTPUT_CHARS]}\n```"
    return Step(Injection(text, ROLE_POLICY, tool_error=output.failed, tool_call=True))


@dataclass(frozen=True)
class ToolAnswers(Injection):
    """The "tool" messages that answer the calls of one turn, one per call in the order of the calls
    (``messages``), injected together: the chat template renders them as it renders consecutive tool messages
    (Qwen's: one user turn of ``<tool_response>`` blocks).  ``text`` is their contents (the injected segment's
    text); ``calls`` the calls that ran (each counts toward the episode's limit), ``errors`` the calls answered
    with an error."""

    messages: tuple[dict[str, str], ...] = ()
    calls: int = 0
    errors: int = 0


def tool_answers(names: Sequence[str], outputs: Sequence[ToolOutput]) -> Step:
    """The step that answers the calls of a turn in the chat template's format (``names``: the tool each names, in
    order), as TRL does: a "tool" message per call, with the output of each call that ran (``outputs``: those of
    the first calls, each cut to ``TOOL_OUTPUT_CHARS``), and for each call past them, which the episode's limit
    left unrun, ``CALLS_SPENT``; the policy goes on."""
    answers = [*outputs, *[ToolOutput(CALLS_SPENT, failed=True)] * (len(names) - len(outputs))]
    messages = tuple(
        {"role": "tool", "name": name[:TOOL_NAME_CHARS], "content": answer.text[:TOOL_OUTPUT_CHARS]}
        for name, answer in zip(names, answers, strict=True)
    )
    text = "\n\n".join(message["content"] for message in messages)
    errors = sum(answer.failed for answer in answers)
    return Step(
        ToolAnswers(
            text,
            ROLE_POLICY,
            message_role="tool",
            tool_error=errors > 0,
            tool_call=True,
            messages=messages,
            calls=len(outputs),
            errors=errors,
        )
    )


def answer_tool_calls(episode: Conversation, tools: Mapping[str, FunctionTool], max_tool_calls: int) -> Step:
    """What follows a turn of an environment whose ``tools`` the policy calls in the chat template's format: each
    of the turn's calls (``function_calls``) answered by its tool (``call_tool``), in order, in a message of its
    own (``tool_answers``); at most ``max_tool_calls`` calls run per episode, and a call past them is told so.
    A turn without a call, or one made once the episode's calls are spent, is the end."""
    if episode.tool_calls >= max_tool_calls:
        return Step()
    calls = function_calls(episode.turns()[-1].text)
    if not calls:
        return Step()
    outputs = [call_tool(tools, call) for call in calls[: max_tool_calls - episode.tool_calls]]
    return tool_answers([call.name for call in calls], outputs)


@dataclass(frozen=True)
class ToolRule(Environment):
    """The python tool, as an environment: a turn that calls it (``python_calls``) gets the output of each call,
    a fenced block's as the next user message (``fenced_answer``), the calls in the chat template's format each
    in a "tool" message (``tool_answers``), and the policy goes on; at most ``max_tool_calls`` calls run per
    conversation (a call past them is told so).  A turn without a call ends it; the row's verifier scores that
    final turn.  ``run_python`` runs programs in the code sandbox (``train/conversation_stage.sandboxed_python``):
    the driver runs the steps of one turn of every conversation together, so their programs (all a turn's) run
    together, under one time budget.  A call that cannot be read or that fails comes back as an error message
    (``Injection.tool_error``), never as an error of the run."""

    run_python: Callable[[Sequence[str]], Sequence[ToolOutput]]
    max_tool_calls: int = 2
    tools: ClassVar[Sequence[dict]] = (PYTHON_TOOL,)

    def step(self, episode: Conversation) -> Step:
        if episode.tool_calls >= self.max_tool_calls:
            return Step()
        calls = python_calls(episode.turns()[-1].text)
        if not calls:
            return Step()
        run = calls[: self.max_tool_calls - episode.tool_calls]
        ran = iter(self.run_python([call.code for call in run if call.code is not None]))
        outputs = [next(ran) if call.code is not None else ToolOutput(call.error, failed=True) for call in run]
        if not calls[0].native:
            return fenced_answer(outputs[0])
        return tool_answers([call.name for call in calls], outputs)


def injected_messages(injection: Injection) -> list[dict[str, str]]:
    """The chat messages ``injection`` appends: a tool answer per call of ``ToolAnswers``, else its one message."""
    if isinstance(injection, ToolAnswers):
        return list(injection.messages)
    return [{"role": injection.message_role, "content": injection.text}]


def injected_ids(tokenizer, conversation: Conversation, injection: Injection) -> tuple[list[int], list[dict[str, str]]]:
    """The tokens that close the last generated turn and open the next one after ``injection``'s
    messages, rendered by the chat template (with the conversation's tools); and the chat with the last
    turn and those messages added.

    The template renders the whole chat twice, with the injected messages and without them; the difference
    is the new turn(s) and the assistant header.  Before it goes whatever the template puts after an
    assistant message (e.g. "<|im_end|>\\n"), less the stop token the model already generated.
    """
    last = conversation.turns()[-1]
    chat = [*conversation.messages, {"role": "assistant", "content": last.text}]
    with_message = [*chat, *injected_messages(injection)]
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


def start_conversations(
    environment: Environment,
    tokenizer,
    rows: Sequence[Example],
    *,
    max_prompt_tokens: int,
    timeout_s: float = ENVIRONMENT_TIMEOUT_S,
) -> list[Conversation]:
    """Episode i on ``rows[i]`` (its ``messages``: the chat that asks it), sampling from stream i: the
    environment's first observation (its ``reset``, all episodes together within ``timeout_s``), rendered with
    its tools where the chat template has a tool-call format.  An episode whose ``reset`` fails, or whose
    observation is longer than ``max_prompt_tokens``, starts from the row's chat and ends, failed, after its
    first turn."""
    offered = getattr(environment, "tools", ())
    tools = list(offered) if offered and native_tool_format(tokenizer) else None
    encoded: dict[str, list[int]] = {}  # the G episodes of a row mostly start from the same chat

    def prompt_ids(messages: Sequence[dict[str, str]]) -> list[int]:
        key = json.dumps(list(messages), sort_keys=True)
        if key not in encoded:
            encoded[key] = chat_token_ids(tokenizer, list(messages), tools)
        return encoded[key]

    observations = contained([lambda row=row: environment.reset(row) for row in rows], timeout_s)
    conversations = []
    for stream, (row, observation) in enumerate(zip(rows, observations, strict=True)):
        try:
            if isinstance(observation, Failure):
                raise ValueError(observation.error)
            ids = prompt_ids(observation.messages)
            if len(ids) > max_prompt_tokens:
                raise ValueError(f"its first observation is {len(ids)} tokens > rollout.max_prompt_tokens")
            start = Conversation(ids, list(observation.messages), stream, tools=tools, state=observation.state)
        except Exception as exc:  # a bad observation: the episode starts from the row's chat, failed
            ids, error = prompt_ids(row.messages), f"reset: {exc}"
            start = Conversation(ids, list(row.messages), stream, tools=tools, error=error)
        conversations.append(start)
    return conversations


def run_conversations(
    engine: RolloutEngine,
    tokenizer,
    conversations: Sequence[Conversation],
    environment: Environment,
    params: SamplingParams,
    *,
    max_turns: int,
    max_response_tokens: int | None = None,
    timeout_s: float = ENVIRONMENT_TIMEOUT_S,
) -> list[Conversation]:
    """Generate every conversation to its end, one turn of all live conversations per engine call.

    ``params.max_new_tokens`` caps each turn; ``max_response_tokens`` caps a conversation's tokens
    after its prompt (generated and injected; None = no cap), ``max_turns`` its generated turns.  Conversation i's
    turn t samples from stream ``conversations[i].stream`` with seed ``turn_seed(params.seed, t)``,
    whatever else is in the call.  After each turn the environment's ``step`` of every live conversation
    runs, all together within ``timeout_s``; at the end its ``finish`` of each (likewise).  A step or finish
    that raises or runs out of time, and an episode whose start failed, ends the episode (``Conversation.fail``).
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
            for c, completion, text in zip(group, completions, texts, strict=True):  # the engine's tokens, as generated
                c.segments.append(
                    Segment(completion.token_ids, completion.logprobs, c.next_role, text, completion.finish_reason)
                )
        # 2. the environment answers every turn at once (their tool calls run together); the injected turn
        # must leave room for at least one generated token
        for c in live:
            if c.error:  # its start failed
                c.fail(c.error)
        live = [c for c in live if not c.done]
        steps = contained([lambda c=c: checked_step(environment.step(c)) for c in live], timeout_s)
        for c, step in zip(live, steps, strict=True):
            take_step(tokenizer, c, step, last_turn=turn + 1 >= max_turns, cap=cap)
    for c in conversations:
        if not c.done:
            c.done, c.end = True, "turn_limit"
    finishing = [c for c in conversations if not c.error]
    rewards = contained([lambda c=c: reward_value(environment.finish(c)) for c in finishing], timeout_s)
    for c, reward in zip(finishing, rewards, strict=True):
        if isinstance(reward, Failure):
            c.fail(f"finish: {reward.error}")
        else:
            c.final_reward = reward
    return list(conversations)


def take_step(tokenizer, c: Conversation, step: Step | Failure, *, last_turn: bool, cap: float) -> None:
    """The environment's answer to the conversation's last turn: its reward recorded, then the end (the
    environment's, a failure, the turn cap, or an injection past the token cap) or the injected message."""
    if isinstance(step, Failure):
        c.fail(f"step: {step.error}")
        return
    c.rewards.append(step.reward or 0.0)
    injection = step.injection
    if injection is None:
        c.done, c.end = True, "rule"
        return
    calls, errors = answered_calls(injection)
    c.tool_errors += errors
    if last_turn:
        c.done, c.end = True, "turn_limit"
        return
    try:
        ids, messages = injected_ids(tokenizer, c, injection)
    except MultiTurnError:  # the chat template cannot do multi-turn at all: the run's error
        raise
    except Exception as exc:  # what the environment injected cannot be rendered
        c.fail(f"step: its message cannot be rendered ({type(exc).__name__}: {exc})")
        return
    if c.response_length + len(ids) >= cap:
        c.done, c.end = True, "token_limit"
        return
    c.messages = messages
    c.segments.append(Segment(ids, [0.0] * len(ids), ROLE_INJECTED, injection.text))
    c.next_role, c.tool_calls = injection.next_role, c.tool_calls + calls


def answered_calls(injection: Injection) -> tuple[int, int]:
    """The tool calls ``injection`` answers that count toward the episode's limit, and those it answers with an
    error."""
    if isinstance(injection, ToolAnswers):
        return injection.calls, injection.errors
    return int(injection.tool_call), int(injection.tool_error)


def reward_value(reward) -> float | None:
    """An environment's reward as a float (None stays None); raises for anything but a number the batch holds
    (``reward_number``: finite in float32)."""
    return None if reward is None else reward_number(reward)


def checked_step(step) -> Step:
    """An environment's ``step`` result, checked: a Step, its reward a finite number or None, its injection an
    Injection of text; raises otherwise (the episode then fails, not the run)."""
    if not isinstance(step, Step):
        raise TypeError(f"step returned {step!r}, not a Step"[:200])
    injection = step.injection
    if injection is not None and not (isinstance(injection, Injection) and isinstance(injection.text, str)):
        raise TypeError(f"a Step's injection is an Injection of text, not {step.injection!r}"[:200])
    return Step(step.injection, reward_value(step.reward))


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
