"""TRL ``environment_factory`` classes played unchanged: their methods' schemas as tools, ``reset`` given the row and
shown in the chat, tool calls checked against the schema before a method runs, a method's failure told to the
model, ``get_reward`` as the episode's reward, and a method that cannot be described refused at load."""

import asyncio
import contextlib
import dataclasses
import json
import threading
import time
from typing import Literal

import pytest
from transformers.utils import get_json_schema

from reasonrl.data.examples import Example
from reasonrl.rollout.multiturn.conversations import CALLS_SPENT
from reasonrl.rollout.multiturn.environments import EnvironmentLoadError, environment_class
from reasonrl.rollout.multiturn.trl_environments import TRLEnvironment
from tests.rollout.test_environments import play, with_template
from tests.rollout.test_multiturn import HERMES_TEMPLATE


class Vault:
    """A TRL environment as TRL's docs write one: ``reset(**kwargs)``, tools with Google docstrings, a reward."""

    def reset(self, **kwargs) -> str | None:
        self.code, self.opened, self.tries = kwargs["ground_truth"], False, []
        self.row = kwargs
        return "\nThe vault has a 4-digit code."

    def try_code(self, code: str, hand: Literal["left", "right"] = "right", notes: list[int] | None = None) -> str:
        """
        Try a code on the vault's lock.

        Args:
            code: The 4-digit code to try.
            hand: The hand that turns the dial.
            notes: Digits to remember.

        Returns:
            Whether the vault opened.
        """
        self.tries.append((code, hand, notes))
        self.opened = self.opened or code == self.code
        return "The vault opens." if self.opened else "Nothing happens."

    def kick(self, force: int) -> str:
        """
        Kick the vault.

        Args:
            force: How hard.
        """
        raise RuntimeError(f"a kick of {force} broke the foot")

    def get_reward(self) -> float:
        return 1.0 if self.opened else 0.0

    def _log(self, text):  # private: no tool, and no docstring needed
        return text


class NoReward:
    """A TRL environment without ``get_reward``: the row's verifier scores the episode."""

    def reset(self, **kwargs) -> None:
        return None

    def look(self) -> str:
        """Look around."""
        return "a room"


class AsyncReward(NoReward):
    """A reward that is a coroutine (an LLM judge, say), as TRL allows."""

    async def get_reward(self) -> float:
        await asyncio.sleep(0)
        return 0.25


class PromptOnly(NoReward):
    """A ``reset`` that takes only the column it uses, as a TRL class may."""

    def reset(self, prompt) -> str:
        return f" ({len(prompt)} messages)"


class Pinger(NoReward):
    """Async tools sharing what ``reset`` made (an event bound to the loop that first waits on it), as an async
    client would."""

    def reset(self, **kwargs) -> None:
        self.answered = asyncio.Event()

    async def ping(self) -> str:
        """Ping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.answered.wait(), 0.01)
        return "pong"


class HungJudge(NoReward):
    """A coroutine reward that never returns (a judge that never answers)."""

    async def get_reward(self) -> float:
        await asyncio.Event().wait()
        return 1.0


RELEASE = threading.Event()  # lets the blocking tool return when its test ends


class Blocker(NoReward):
    """An async tool that blocks the event loop's thread: a blocking call inside ``async def``, as ``time.sleep``
    would be."""

    async def nap(self) -> str:
        """Nap."""
        RELEASE.wait(30)
        return "rested"


class ImageReset(NoReward):
    """A ``reset`` that returns content blocks (an image for a VLM), which a text episode cannot show."""

    def reset(self, **kwargs) -> list:
        return [{"type": "image", "image": None}]


ROW = Example(
    "vault:0",
    "Open the vault.",
    "4821",
    messages=({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Open the vault."}),
    data_source="vaults",
    fields={"question": "Open the vault.", "answer": "4821", "level": 3},
)


@pytest.fixture(scope="module")
def chat():
    from reasonrl.models.load import load_tokenizer

    return with_template(load_tokenizer("tiny-random"), HERMES_TEMPLATE)


def vault(max_tool_calls=2) -> TRLEnvironment:
    return environment_class("tests.rollout.test_trl_environments:Vault")(max_tool_calls)


def calls(*calls):
    """A policy that makes these tool calls, one a turn, then answers."""

    def reply(text):
        made = text.count("<tool_response>")
        if made < len(calls):
            return f"<tool_call>{json.dumps(calls[made])}</tool_call>"
        return "I am done."

    return reply


def test_its_tools_are_its_public_methods_described_as_transformers_describes_them():
    environment = environment_class("tests.rollout.test_trl_environments:Vault")
    assert issubclass(environment, TRLEnvironment) and environment.__name__ == "Vault"
    assert list(environment.tools) == [get_json_schema(Vault.kick), get_json_schema(Vault.try_code)]
    (try_code,) = [t["function"] for t in environment.tools if t["function"]["name"] == "try_code"]
    assert try_code["parameters"]["required"] == ["code"]  # hand and notes have defaults


def test_reset_gets_the_rows_columns_and_its_text_ends_the_last_user_message():
    environment = vault()
    observation = environment.reset(ROW)
    assert observation.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Open the vault.\nThe vault has a 4-digit code."},
    ]
    assert ROW.messages[1]["content"] == "Open the vault."  # the row is left as it was
    instance = observation.state
    assert isinstance(instance, Vault) and instance is not environment.reset(ROW).state  # one instance an episode
    assert instance.row == {
        "prompt": [dict(m) for m in ROW.messages],
        "ground_truth": "4821",
        "data_source": "vaults",
        "question": "Open the vault.",
        "answer": "4821",
        "level": 3,
    }


def test_a_tool_call_runs_the_method_of_the_episodes_instance_and_get_reward_rewards_it(chat):
    rows = [ROW, dataclasses.replace(ROW, answer="0000")]
    opened, locked = play(vault(), chat, rows, calls({"name": "try_code", "arguments": {"code": "4821"}}))
    assert '"name": "try_code"' in chat.decode(opened.prompt_ids)  # the template renders the schemas
    assert opened.messages[-1] == {"role": "tool", "name": "try_code", "content": "The vault opens."}
    assert locked.messages[-1] == {"role": "tool", "name": "try_code", "content": "Nothing happens."}
    assert opened.tool_calls == 1
    assert (opened.final_reward, locked.final_reward) == (1.0, 0.0)  # each episode's own instance
    assert opened.state.tries == [("4821", "right", None)]


HOSTILE = {
    "a number for a string": {"code": 4821},
    "an unknown argument": {"code": "4821", "__class__": "x"},
    "a missing argument": {"hand": "left"},
    "a value outside the enum": {"code": "4821", "hand": "foot"},
    "a string among the list's integers": {"code": "4821", "notes": [1, "os.system('id')"]},
    "true for an integer": {"code": "4821", "notes": [True]},
}


@pytest.mark.parametrize("arguments", HOSTILE.values(), ids=HOSTILE.keys())
def test_arguments_the_schema_refuses_never_reach_the_method(chat, arguments):
    (episode,) = play(vault(), chat, [ROW], calls({"name": "try_code", "arguments": arguments}))
    assert episode.state.tries == [] and episode.tool_errors == 1
    assert episode.messages[-1]["content"].startswith("Error: ") and episode.final_reward == 0.0


@pytest.mark.parametrize("name", ["reset", "get_reward", "_log", "__init__", "__class__"])
def test_only_its_tools_can_be_called(chat, name):
    other = {"name": name, "arguments": {"ground_truth": "0000", "text": "x"}}  # a reset would change the code
    (episode,) = play(vault(), chat, [ROW], calls(other, {"name": "try_code", "arguments": {"code": "4821"}}))
    assert episode.messages[-3]["content"] == f"Error: there is no tool {name!r}; the tools are kick, try_code"
    assert episode.final_reward == 1.0 and episode.tool_errors == 1


def test_optional_and_nullable_arguments_reach_the_method(chat):
    call = {"name": "try_code", "arguments": {"code": "4821", "hand": "left", "notes": None}}
    (episode,) = play(vault(), chat, [ROW], calls(call, {**call, "arguments": {"code": "1", "notes": [4, 8]}}))
    assert episode.state.tries == [("4821", "left", None), ("1", "right", [4, 8])] and episode.tool_errors == 0


def test_a_method_that_raises_is_told_to_the_model_and_the_episode_goes_on(chat):
    kick = {"name": "kick", "arguments": {"force": 9}}
    (episode,) = play(vault(), chat, [ROW], calls(kick, {"name": "try_code", "arguments": {"code": "4821"}}))
    error = episode.messages[-3]
    assert error == {"role": "tool", "name": "kick", "content": "Error: RuntimeError: a kick of 9 broke the foot"}
    assert episode.tool_errors == 1 and episode.end == "rule" and episode.final_reward == 1.0 and not episode.error


def test_tool_calls_stop_at_the_limit(chat):
    wrong = {"name": "try_code", "arguments": {"code": "0000"}}
    (episode,) = play(vault(max_tool_calls=2), chat, [ROW], calls(wrong, wrong, wrong), max_turns=10)
    assert episode.tool_calls == 2 and len(episode.state.tries) == 2 and len(episode.turns()) == 3


def test_every_call_of_a_turn_runs_in_order_each_answered_by_its_own_tool_message(chat):
    kick, wrong = {"name": "kick", "arguments": {"force": 9}}, {"name": "try_code", "arguments": {"code": "0"}}
    right = {"name": "try_code", "arguments": {"code": "4821", "hand": "left"}}
    parallel = "".join(f"<tool_call>{json.dumps(call)}</tool_call>\n" for call in (wrong, kick, right))
    (episode,) = play(
        vault(max_tool_calls=3), chat, [ROW], lambda text: parallel if "tool_response" not in text else "."
    )
    assert episode.state.tries == [("0", "right", None), ("4821", "left", None)]  # in order, on its instance
    assert episode.messages[-3:] == [
        {"role": "tool", "name": "try_code", "content": "Nothing happens."},
        {"role": "tool", "name": "kick", "content": "Error: RuntimeError: a kick of 9 broke the foot"},
        {"role": "tool", "name": "try_code", "content": "The vault opens."},
    ]
    assert (episode.tool_calls, episode.tool_errors, len(episode.turns()), episode.final_reward) == (3, 1, 2, 1.0)


def test_calls_past_the_limit_are_told_so_and_the_policy_answers_once_more(chat):
    wrong = f"<tool_call>{json.dumps({'name': 'try_code', 'arguments': {'code': '0'}})}</tool_call>"
    (episode,) = play(vault(max_tool_calls=3), chat, [ROW], lambda text: wrong * 2, max_turns=10)
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == [
        "Nothing happens.",
        "Nothing happens.",
        "Nothing happens.",
        CALLS_SPENT,  # the second turn's second call: the episode's three are spent
    ]
    assert len(episode.state.tries) == 3 and (episode.tool_calls, episode.tool_errors) == (3, 1)
    assert len(episode.turns()) == 3 and episode.end == "rule"  # the third turn's calls end the episode, unrun


def test_without_get_reward_the_verifier_scores_and_a_coroutine_reward_is_awaited(chat):
    for name, reward in [("NoReward", None), ("AsyncReward", 0.25)]:
        environment = environment_class(f"tests.rollout.test_trl_environments:{name}")()
        (episode,) = play(environment, chat, [ROW], calls())
        assert episode.final_reward == reward and not episode.error


def test_a_reset_that_returns_no_text_fails_its_episode_saying_so(chat):
    environment = environment_class("tests.rollout.test_trl_environments:ImageReset")()
    (episode,) = play(environment, chat, [ROW], calls())
    assert episode.end == "error" and "ImageReset.reset returned a list; it returns a str or None" in episode.error


UNDESCRIBED = {
    "no docstring": ("    def move(self, steps: int) -> str:\n        return 'moved'\n", "has no docstring"),
    "no type hint": (
        '    def move(self, steps) -> str:\n        """Move.\n\n        Args:\n            steps: How far.\n'
        '        """\n',
        "steps is missing a type hint",
    ),
    "no Args line": (
        '    def move(self, steps: int) -> str:\n        """Move."""\n',
        "no description for the argument 'steps'",
    ),
}


@pytest.mark.parametrize(("method", "why"), UNDESCRIBED.values(), ids=UNDESCRIBED.keys())
def test_a_method_it_cannot_describe_is_refused_at_load_naming_it(tmp_path, method, why):
    path = tmp_path / "game.py"
    path.write_text(f"class Game:\n    def reset(self, **kwargs):\n        return None\n\n{method}")
    with pytest.raises(EnvironmentLoadError, match=rf"{path}:Game'?: its method move cannot be a tool: .*{why}"):
        environment_class(f"{path}:Game")


def test_a_reset_that_takes_only_some_columns_gets_those():
    environment = environment_class("tests.rollout.test_trl_environments:PromptOnly")()
    assert environment.reset(ROW).messages[-1]["content"] == "Open the vault. (2 messages)"


def test_async_tools_share_one_loop_and_a_hung_reward_is_cancelled_within_the_budget(chat):
    pinger = environment_class("tests.rollout.test_trl_environments:Pinger")(max_tool_calls=3)
    ping = {"name": "ping", "arguments": {}}
    (episode,) = play(pinger, chat, [ROW], calls(ping, ping), max_turns=4)
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == ["pong", "pong"]  # one loop, twice
    judge = environment_class("tests.rollout.test_trl_environments:HungJudge")(timeout_s=0.5)
    threads, started = threading.active_count(), time.monotonic()
    episodes = play(judge, chat, [ROW] * 4, calls())
    assert all(e.end == "error" and "no answer within" in e.error for e in episodes)
    time.sleep(0.2)  # the cancelled coroutines' threads return
    assert time.monotonic() - started < 5 and threading.active_count() <= threads + 1  # + the loop's own thread


def loop_threads() -> int:
    return sum(thread.name == "trl-environments" for thread in threading.enumerate())


def test_an_async_call_that_blocks_the_loop_ends_its_own_episode_and_later_calls_get_a_new_loop(chat, caplog):
    def environment(name, **options):
        return environment_class(f"tests.rollout.test_trl_environments:{name}")(timeout_s=0.5, **options)

    ping = {"name": "ping", "arguments": {}}
    try:
        started = time.monotonic()
        (blocked,) = play(environment("Blocker"), chat, [ROW], calls({"name": "nap", "arguments": {}}), timeout_s=0.5)
        took = time.monotonic() - started
        (pinged,) = play(environment("Pinger", max_tool_calls=3), chat, [ROW], calls(ping, ping), timeout_s=0.5)
        (rewarded,) = play(environment("AsyncReward"), chat, [ROW], calls(), timeout_s=0.5)
    finally:
        RELEASE.set()
    assert blocked.end == "error" and blocked.error.startswith("step: OutOfTime: no answer within the environment's")
    assert "stayed blocked" in blocked.error and "stayed blocked" in caplog.text  # its episode ends, saying why
    assert took < 1.5  # the 0.5 s budget, not the 30 s the tool blocks for
    assert [m["content"] for m in pinged.messages if m["role"] == "tool"] == ["pong", "pong"] and not pinged.error
    assert rewarded.final_reward == 0.25 and not rewarded.error
    deadline = time.monotonic() + 5
    while loop_threads() > 1 and time.monotonic() < deadline:  # the blocked loop stops once its call returns
        time.sleep(0.05)
    assert loop_threads() == 1
