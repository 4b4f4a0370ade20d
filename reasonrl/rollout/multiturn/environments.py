"""The shipped game environments, and the environment a run names (``rollout.environment``).

- ``countdown``: reach the target number (``data/countdown.py``) with a calculator tool called in the chat
  template's own format (``rollout/multiturn/tool_calls.py``); the calculator parses the expression and evaluates
  numbers, + - * / and parentheses only, never running the text.  The environment rewards the end: 1 when
  the final turn's ``<answer>`` uses the given numbers (each at most once) and equals the target, by its
  own check, else 0.
- ``guess_number``: guess the secret number of the row (``data/guess_number.py``); after each wrong guess the
  environment says "higher" or "lower".  The turn that guesses it is rewarded 1 and ends the game.
- ``python``: the python tool (``rollout/multiturn/conversations.ToolRule``; the same as ``rollout.multiturn=tool``).

A user's environment is a class named ``module:Class`` or ``path/to/file.py:Class``, loaded like
``reward.functions`` (``reward/custom.load_named``: loading it is the user's choice; nothing generated is
ever loaded or run) and built with no arguments; docs/environments.md says what it implements.  A TRL
``environment_factory`` class (``reset`` and tool methods, no ``step`` or ``finish``) is played through
``rollout/multiturn/trl_environments.TRLEnvironment``.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from reasonrl.data.countdown import ExpressionError, Puzzle, calculate
from reasonrl.data.examples import Example
from reasonrl.data.guess_number import HIGHEST, LOWEST
from reasonrl.errors import ReasonRLError
from reasonrl.reward.custom import RewardFunctionError, load_named
from reasonrl.rollout.multiturn.conversations import ToolRule, answer_tool_calls
from reasonrl.rollout.multiturn.episodes import ROLE_POLICY, Conversation, Environment, Injection, Observation, Step
from reasonrl.rollout.multiturn.openenv_environments import OPENENV_PREFIX, OpenEnvEnvironment
from reasonrl.rollout.multiturn.tool_calls import FunctionTool, ToolOutput
from reasonrl.rollout.multiturn.trl_environments import TRLEnvironmentError, is_trl_environment, trl_environment

WHOLE_NUMBER = re.compile(r"\d+")
PROTOCOL = ("reset", "step", "finish")  # what an environment class must have (an Environment subclass has all)


class EnvironmentLoadError(ReasonRLError, ValueError):
    """An environment that cannot be named, imported or used, with what to do about it."""


def calculator(expression: str) -> ToolOutput:
    """The calculator tool: the exact value of an arithmetic expression, or why it is not one."""
    try:
        return ToolOutput(calculate(expression))
    except ExpressionError as exc:
        return ToolOutput(f"Error: {exc}", failed=True)


CALCULATOR = FunctionTool(
    "calculator",
    "Evaluate an arithmetic expression exactly: numbers, + - * / and parentheses.",
    {"expression": {"type": "string", "description": "The expression, for example (3 + 5) * 2"}},
    calculator,
)


@dataclass(frozen=True)
class Countdown(Environment):
    """Countdown with a calculator: a turn that calls the calculator gets each call's result and the policy goes
    on, at most ``max_tool_calls`` calls (``answer_tool_calls``); a turn without one is the final answer, rewarded
    by ``finish``."""

    max_tool_calls: int = 2
    tools: ClassVar = (CALCULATOR.schema,)

    def reset(self, row: Example) -> Observation:
        return Observation(row.messages, state=Puzzle.from_reference(row.answer))

    def step(self, episode: Conversation) -> Step:
        return answer_tool_calls(episode, {CALCULATOR.name: CALCULATOR}, self.max_tool_calls)

    def finish(self, episode: Conversation) -> float:
        return float(episode.state.solved_by(episode.turns()[-1].text))


def last_whole_number(text: str) -> int | None:
    """The last whole number written in ``text`` (at most 9 digits), or None."""
    numbers = [match.group() for match in WHOLE_NUMBER.finditer(text)]
    return int(numbers[-1]) if numbers and len(numbers[-1]) <= 9 else None


@dataclass(frozen=True)
class GuessNumber(Environment):
    """Guess the number: each turn's last whole number is a guess; a right one is rewarded 1 and ends the game,
    a wrong one is answered "higher" or "lower" (a turn with no number is asked for one)."""

    def reset(self, row: Example) -> Observation:
        return Observation(row.messages, state=int(row.answer))

    def step(self, episode: Conversation) -> Step:
        guess, secret = last_whole_number(episode.turns()[-1].text), episode.state
        if guess == secret:
            return Step(reward=1.0)
        if guess is None:
            return Step(Injection(f"Reply with one whole number between {LOWEST} and {HIGHEST}.", ROLE_POLICY))
        return Step(Injection(f"{guess} is too {'low' if guess < secret else 'high'}. Guess again.", ROLE_POLICY))

    def finish(self, episode: Conversation) -> float:
        return 0.0  # the reward came with the right guess


SHIPPED: dict[str, type] = {"python": ToolRule, "countdown": Countdown, "guess_number": GuessNumber}
GIVEN_PREFIX = "object:"
"""``rollout.environment=object:<what>`` names a factory object given to ``reasonrl.train(environment=...)`` that no
name can import (a ``functools.partial``, a callable instance): it lives in that process only."""
GIVEN: dict[str, Any] = {}
"""This process's factory objects by their ``rollout.environment`` (``given_environment``)."""


def given_environment(factory: Any) -> str:
    """The ``rollout.environment`` of a factory object this process holds (the same for an equal partial, so a
    run continued by the same call is the same run)."""
    inner = getattr(factory, "func", factory)
    name = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__name__)}"
    arguments = [
        *map(repr, getattr(factory, "args", ())),
        *(f"{k}={v!r}" for k, v in getattr(factory, "keywords", {}).items()),
    ]
    key = f"{GIVEN_PREFIX}{name}({', '.join(arguments)})"
    GIVEN[key] = factory
    return key


@functools.cache  # loaded once per process: a TRL factory is called once to describe its tools, as TRL does
def environment_class(name: str) -> type:
    """The class of ``rollout.environment=name``: a shipped one, an OpenEnv server's (``openenv:<url>``), or the
    user's ``module:Class`` or ``path/to/file.py:Class`` (raises EnvironmentLoadError saying why it cannot be used)."""
    if name in SHIPPED:
        return SHIPPED[name]
    if name.startswith(OPENENV_PREFIX):
        return OpenEnvEnvironment
    if name.startswith(GIVEN_PREFIX):
        if name not in GIVEN:
            raise EnvironmentLoadError(
                f"rollout.environment={name} is an object given to reasonrl.train(environment=...) in another process; "
                "a process of its own (a command line, an asynchronous producer process) cannot rebuild it: give a "
                "class or function by name ('module:Class'), or call reasonrl.train with the object again"
            )
        named = GIVEN[name]
    else:
        try:
            named = load_named(name, os.getcwd(), "environment")
        except RewardFunctionError as exc:
            raise EnvironmentLoadError(str(exc)) from None
    if is_trl_environment(named):
        try:
            return trl_environment(named)
        except TRLEnvironmentError as exc:
            raise EnvironmentLoadError(f"environment {name!r}: {exc}") from None
    missing = [method for method in PROTOCOL if not callable(getattr(named, method, None))]
    if not isinstance(named, type) or missing:
        raise EnvironmentLoadError(
            f"environment {name!r} is not a class with reset, step and finish (missing: {', '.join(missing)}); "
            "subclass reasonrl.rollout.multiturn.episodes.Environment, or give a TRL environment_factory (a class "
            "with reset and tool methods and no step or finish, or a function that makes one) (docs/environments.md)"
        )
    tools = getattr(named, "tools", ())
    if not isinstance(tools, list | tuple) or not all(isinstance(tool, dict) for tool in tools):
        raise EnvironmentLoadError(f"environment {name!r}: tools must be a class attribute, a list of function schemas")
    return named
