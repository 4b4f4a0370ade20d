"""TRL's ``environment_factory`` classes as environments, unchanged (``rollout.environment=module:Class``).

TRL's contract (``GRPOTrainer(environment_factory=...)``): something it calls with no arguments (a class, a
function, a ``functools.partial``) for an instance per episode, with a ``reset(**row)`` that may return a string,
public methods the model calls as tools, and an optional ``get_reward()``; its reward functions get the episodes'
instances (``reward_func(environments, **kwargs)``).  ``TRLEnvironment`` plays it through the ``Environment`` protocol:

- ``tools``: each public method's function schema (of an instance made when the factory is loaded, as TRL makes
  one), written by transformers' ``get_json_schema`` as TRL has it written (a Google-style docstring with a
  description and an ``Args:`` line per argument, a type hint on every argument); ``reset``, ``get_reward`` and
  ``_private`` methods are no tools.  A method it cannot describe is refused when the factory is loaded, before
  any model, naming the method and what it lacks.
- ``reset(row)``: a new instance for the episode (its state), whose ``reset`` gets the row as TRL passes a
  dataset row, its columns as keywords: the row's own columns (``Example.fields``), ``prompt`` the chat the
  episode starts from (a list of {role, content} messages), ``ground_truth`` the reference answer and
  ``data_source``, as reward functions get them.  A string it returns is appended to the last user message.
- ``step(episode)``: each tool call of a turn (``tool_calls.function_calls``: every ``<tool_call>`` block, as
  TRL runs them all) gets the output of the method it names, ``str()`` of what it returns, in a tool message of
  its own, in order (``conversations.answer_tool_calls``); the arguments are checked against the method's schema
  before the method sees them, and a method that raises is answered with the error (``call_tool``).  At most
  ``rollout.max_tool_calls`` calls run per episode; a call past them is told so, and a turn that calls once they
  are spent ends the episode, as does a turn without a call (the answer).
- ``finish(episode)``: the instance's ``get_reward()`` (awaited when it is a coroutine, as TRL allows), added to
  what ``reward.functions`` give (TRL adds it as one more reward function, weight 1); without one, in a run with
  no ``reward.functions``, the instance's ``reward`` attribute (what TRL's reward functions read); else None: the
  reward functions (given the episodes' instances as ``environments``, as TRL gives them) or the row's verifier
  score the episode.

An ``async def`` tool or ``get_reward`` runs on one event loop for all episodes (``EventLoops``), within the
driver's budget: one that runs out of time is cancelled and ends its episode (``OutOfTime``), and a loop that
one leaves blocked (a blocking call inside an ``async def``) is retired, so later calls run on a new loop.

Loading the class is the user's choice (``environment_class``); a tool call's name and arguments are untrusted
data, checked, never run, and what a method returns is injected as plain text (the driver's guarantee).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from reasonrl.data.examples import Example
from reasonrl.rollout.multiturn.conversations import ENVIRONMENT_TIMEOUT_S, answer_tool_calls
from reasonrl.rollout.multiturn.episodes import Conversation, Environment, Observation, OutOfTime, Step, batch_started
from reasonrl.rollout.multiturn.tool_calls import FunctionTool, ToolOutput

NOT_TOOLS = ("reset", "get_reward")
LOOP_CHECK_S = 0.1  # how long a loop has to run a callback after an async call ran out of time, or it is blocked


class TRLEnvironmentError(ValueError):
    """A TRL environment class that cannot be played: why."""


def is_trl_environment(named: Any) -> bool:
    """Whether ``named`` is a TRL ``environment_factory``: a class with ``reset`` and neither of the protocol's
    ``step`` and ``finish`` (an ``Environment`` has all three), or any other callable (a factory function, a
    ``functools.partial``: TRL only calls it with no arguments)."""
    if not isinstance(named, type):
        return callable(named)
    has = [callable(getattr(named, method, None)) for method in ("reset", "step", "finish")]
    return has == [True, False, False]


def factory_name(factory: Any) -> str:
    """How errors name a factory: its class or function name (a partial's function's)."""
    inner = getattr(factory, "func", factory)  # functools.partial
    return getattr(inner, "__qualname__", None) or type(factory).__name__


def probe(factory: Callable[[], Any]) -> Any:
    """An instance of the factory's environment (TRL makes one the same way before training), checked to have a
    ``reset``; raises TRLEnvironmentError saying why there is none."""
    name = factory_name(factory)
    try:
        instance = factory()
    except Exception as exc:
        raise TRLEnvironmentError(
            f"calling {name}() with no arguments failed ({type(exc).__name__}: {exc}); TRL's environment_factory is "
            "something it calls with no arguments: a class whose __init__ takes none, a function, a functools.partial"
        ) from None
    if not callable(getattr(instance, "reset", None)):
        raise TRLEnvironmentError(f"{name}() made a {type(instance).__name__} without a reset method")
    return instance


def tool_methods(instance: Any) -> list[str]:
    """The names of the methods TRL offers as tools: the instance's public bound methods (as TRL finds them with
    ``inspect.getmembers(instance, inspect.ismethod)``), but ``reset`` and ``get_reward``."""
    members = [name for name, _ in inspect.getmembers(instance, inspect.ismethod)]
    return [name for name in members if not name.startswith("_") and name not in NOT_TOOLS]


def method_schema(instance: Any, name: str) -> dict:
    """The function schema of method ``name``, written by ``get_json_schema`` (TRL's own way); raises
    TRLEnvironmentError saying what the method lacks."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(getattr(instance, name))
    except Exception as exc:  # transformers' DocstringParsingException, TypeHintParsingException
        raise TRLEnvironmentError(
            f"its method {name} cannot be a tool: {exc}. A tool method needs a docstring with a description and an "
            "'Args:' line for each argument (Google style), and a type hint on each argument, as TRL requires; "
            f"a method that is no tool is private (_{name})"
        ) from None


def trl_environment(factory: Callable[[], Any]) -> type[TRLEnvironment]:
    """The environment class that plays TRL factory ``factory`` (a class, a function, a partial; named as it is),
    its tools described from an instance it makes (as TRL does); raises TRLEnvironmentError for a factory that
    makes none, or a method that cannot be described."""
    instance = probe(factory)
    tools = tuple(method_schema(instance, name) for name in tool_methods(instance))
    body = {
        "factory": staticmethod(factory),
        "tools": tools,
        "rewards_itself": callable(getattr(instance, "get_reward", None)),
        "__module__": getattr(factory, "__module__", None) or __name__,
        "__doc__": getattr(factory, "__doc__", None),
    }
    return type(factory_name(factory).rsplit(".", 1)[-1], (TRLEnvironment,), body)


class EventLoops:
    """The event loop every ``async def`` tool and reward runs on, in a daemon thread: one for all episodes, as TRL
    runs them on one loop, so what an instance or a module makes (a client, a lock) stays usable from call to call.
    A coroutine that blocks the loop's thread (a blocking call inside an ``async def``: ``time.sleep``) would
    starve every later call; the loop it blocks is retired (``retire``) and later calls get a new one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: asyncio.AbstractEventLoop | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop calls run on now (started on first use)."""
        with self.lock:
            if self.current is None:
                self.current = asyncio.new_event_loop()
                threading.Thread(target=self.current.run_forever, name="trl-environments", daemon=True).start()
            return self.current

    def retire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run no more calls on ``loop``, which a coroutine blocks: it stops when that returns, ending its thread."""
        with self.lock:
            if self.current is loop:
                self.current = None
                loop.call_soon_threadsafe(loop.stop)


EVENT_LOOPS = EventLoops()


def responsive(loop: asyncio.AbstractEventLoop, wait_s: float) -> bool:
    """Whether ``loop`` runs a callback within ``wait_s`` (a coroutine that blocks its thread keeps it from any)."""
    ran = threading.Event()
    loop.call_soon_threadsafe(ran.set)
    return ran.wait(wait_s)


def resolved(value: Any, timeout_s: float) -> Any:
    """What a method returned, awaited on the shared loop if it is a coroutine (an ``async def`` tool or reward,
    as TRL allows), within what is left of the driver's budget (``timeout_s`` from ``batch_started``).  One that
    runs out of time is cancelled and raises OutOfTime (its episode ends) 2 LOOP_CHECK_S before the budget does:
    time to see whether it left the loop blocked (a blocked loop is retired), and to return within the budget."""
    if not inspect.iscoroutine(value):
        return value
    started, loop = batch_started() or time.monotonic(), EVENT_LOOPS.loop()
    future = asyncio.run_coroutine_threadsafe(value, loop)
    try:
        return future.result(max(0.0, timeout_s - 2 * LOOP_CHECK_S - (time.monotonic() - started)))
    except concurrent.futures.TimeoutError:
        future.cancel()
    late = f"no answer within the environment's {timeout_s:g} s"
    if responsive(loop, LOOP_CHECK_S):
        raise OutOfTime(late)
    EVENT_LOOPS.retire(loop)
    raise OutOfTime(
        f"{late}, and the event loop of async calls stayed blocked: an async call blocks it (a blocking call inside "
        "an async def, such as time.sleep); later calls run on a new loop"
    )


def text_output(method: Callable[..., Any], timeout_s: float) -> Callable[..., ToolOutput]:
    """``method`` as a tool's function: ``str()`` of what it returns (awaited within ``timeout_s``) is the output."""
    return lambda **arguments: ToolOutput(str(resolved(method(**arguments), timeout_s)))


def reset_columns(row: Example, reset: Callable[..., Any]) -> dict[str, Any]:
    """What a TRL class's ``reset`` gets of a row: its columns, the chat as ``prompt``, the reference as
    ``ground_truth``, and ``data_source`` (the module docstring); only the names a ``reset`` without
    ``**kwargs`` takes (TRL passes a row's columns, so a ``reset(self, prompt)`` is a TRL class too)."""
    chat = [dict(message) for message in row.messages]
    columns = {"ground_truth": row.answer, "data_source": row.data_source, **row.fields, "prompt": chat}
    parameters = inspect.signature(reset).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return columns
    return {p.name: columns[p.name] for p in parameters if p.name in columns}


def with_observation(messages: Sequence[dict[str, str]], text: str) -> list[dict[str, str]]:
    """The chat with ``text`` appended to its last user message (TRL's way to show what ``reset`` returned)."""
    chat = [dict(message) for message in messages]
    last_user = max((i for i, message in enumerate(chat) if message["role"] == "user"), default=None)
    if last_user is None:
        return [*chat, {"role": "user", "content": text}]
    chat[last_user]["content"] += text
    return chat


class TRLEnvironment(Environment):
    """A TRL ``environment_factory`` (``factory``: a class, a function, a partial) played as an environment;
    ``trl_environment`` makes the subclass of one factory, with its ``tools``.

    The end's reward (``finish``): the instance's ``get_reward()`` when it has one (TRL adds it to the reward
    functions with weight 1); else, in a run with no ``reward.functions`` (``reads_reward_attribute``), its
    ``reward`` attribute, which TRL's reward functions read (``[env.reward for env in environments]``); else None:
    the run's reward functions, or the verifier, score the episode (also where an instance has no ``reward``)."""

    factory: ClassVar[Callable[[], Any]]
    tools: ClassVar[Sequence[dict]] = ()
    rewards_itself: ClassVar[bool] = False
    """Its instances have a ``get_reward``."""

    def __init__(
        self, max_tool_calls: int = 2, timeout_s: float = ENVIRONMENT_TIMEOUT_S, reads_reward_attribute: bool = False
    ) -> None:
        self.max_tool_calls, self.timeout_s = max_tool_calls, timeout_s
        self.reads_reward_attribute = reads_reward_attribute and not self.rewards_itself

    def reset(self, row: Example) -> Observation:
        instance = self.factory()
        shown = instance.reset(**reset_columns(row, instance.reset))
        if shown is not None and not isinstance(shown, str):
            raise TypeError(
                f"{factory_name(self.factory)}.reset returned a {type(shown).__name__}; it returns a str or None"
            )
        return Observation(with_observation(row.messages, shown) if shown else row.messages, state=instance)

    def step(self, episode: Conversation) -> Step:
        return answer_tool_calls(episode, self.bound_tools(episode.state), self.max_tool_calls)

    def finish(self, episode: Conversation) -> float | None:
        get_reward = getattr(episode.state, "get_reward", None)
        if get_reward is not None:
            return resolved(get_reward(), self.timeout_s)  # the driver checks the value
        return getattr(episode.state, "reward", None) if self.reads_reward_attribute else None

    def bound_tools(self, instance: Any) -> dict[str, FunctionTool]:
        """The tools of an episode by name: each schema answered by that method of the episode's instance (a
        call names a tool; nothing else of the instance can be reached)."""
        methods = [getattr(instance, schema["function"]["name"]) for schema in self.tools]
        outputs = [text_output(method, self.timeout_s) for method in methods]
        tools = [FunctionTool.from_schema(s, output) for s, output in zip(self.tools, outputs, strict=True)]
        return {tool.name: tool for tool in tools}
