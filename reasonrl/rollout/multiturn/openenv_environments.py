"""OpenEnv environments: episodes played against an OpenEnv environment server (``rollout.environment=
openenv:<base_url>``, e.g. ``openenv:http://127.0.0.1:8000``; PyPI ``openenv-core``, imported only here and
only when such an environment is built).

An OpenEnv server serves Gymnasium-style ``reset``/``step`` over a WebSocket, one environment instance per
connection.  ``OpenEnvEnvironment`` opens one connection per episode (its ``reset``; the client is the
episode's state) and closes it at its end (``finish``, the failure that ends it, or the driver dropping it),
so episodes never share a server-side game.  Text and the server's JSON meet as follows:

- the action of a turn is ``{field: the turn's whole text}``, where ``field`` is the one string field of the
  server's action schema (read from its ``/schema`` when the run starts), or the one named after ``#`` in the
  URL (``openenv:http://host:8000#code``) where it has several; an action that needs other fields is refused
  at the start, saying which;
- an observation's text is its one string field where it has exactly one, else the JSON of its fields
  (``done``, ``reward`` and ``metadata`` apart), cut to MAX_OBSERVATION_CHARS.  The first (``reset``'s) is
  appended to the row's last user message; each later one is the user message the policy answers next;
- a step's ``reward`` is that turn's reward (None: none); ``done`` ends the episode; ``finish`` returns 0.0,
  so the server's step rewards are the episode's whole reward (a positive return counts as solved) and the
  row's verifier has no say: an OpenEnv row's answer is the server's business.

The driver runs all episodes' ``step`` at once from threads under ``rollout.environment_timeout_seconds``;
the client's connect and message timeouts are half that budget each, so a dead or hung server ends every
episode with an environment error (``multiturn/environment_error_fraction``) and never holds up the run.
What the server sends is untrusted: it is parsed as JSON only, never run or unpickled, and its text is
injected as plain text (the driver neutralises template tokens in it).  The server must accept as many
sessions as episodes run at once (OpenEnv's ``max_concurrent_envs``, 1 by default); an episode refused one
fails like any other.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from reasonrl.data.examples import Example
from reasonrl.rollout.multiturn.episodes import ROLE_POLICY, Conversation, Environment, Injection, Observation, Step

OPENENV_PREFIX = "openenv:"
MAX_OBSERVATION_CHARS = 4000  # an observation's text injected at most
MAX_MESSAGE_MB = 8.0  # the largest message read from the server
MAX_SCHEMA_BYTES = 1_000_000
T = TypeVar("T")
NOT_DATA = ("metadata", "done", "reward")  # fields of OpenEnv's base classes, not the game's own


class OpenEnvError(ValueError):
    """An OpenEnv server that cannot serve the run (unreachable, a malformed schema, or an action a turn's text
    cannot fill)."""


def action_field(schema: dict, chosen: str) -> str:
    """The field of the server's action ``schema`` (JSON schema) that carries a turn's text: ``chosen``, or
    its one string field (raises OpenEnvError saying why none can: a malformed schema, an ambiguous choice,
    other fields required)."""
    properties, required = schema.get("properties", {}), schema.get("required", [])
    names = isinstance(required, list) and all(isinstance(name, str) for name in required)
    if not isinstance(properties, dict) or not names:
        raise OpenEnvError(
            "its action schema is malformed: 'properties' must be an object of fields and 'required' a list of "
            f"field names, not {json_kind(properties)} and {json_kind(required)}"
        )
    fields = {name: kind for name, kind in properties.items() if name not in NOT_DATA}
    strings = [name for name, kind in fields.items() if isinstance(kind, dict) and kind.get("type") == "string"]
    if chosen and chosen not in strings:
        raise OpenEnvError(f"its action has no string field {chosen!r} (its string fields: {strings})")
    if not chosen and len(strings) != 1:
        raise OpenEnvError(
            f"its action has {len(strings)} string fields {strings}: name the one a turn's text fills "
            "after '#' in rollout.environment (openenv:http://host:port#field)"
        )
    field = chosen or strings[0]
    others = [name for name in required if name != field]
    if others:
        raise OpenEnvError(f"its action also requires {others}, which a turn's text cannot fill")
    return field


def json_kind(value: Any) -> str:
    """What kind of JSON value ``value`` is, as an error names it ("a list")."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return kinds.get(type(value), "null")


def observation_text(observation: Any) -> str:
    """What the policy reads of an observation: its one string field, else the JSON of its fields (cut)."""
    fields = observation if isinstance(observation, dict) else {"observation": observation}
    texts = [value for value in fields.values() if isinstance(value, str)]
    text = texts[0] if len(texts) == 1 else json.dumps(fields, ensure_ascii=False, sort_keys=True)
    return text[:MAX_OBSERVATION_CHARS]


def client_class() -> type:
    """OpenEnv's client of any server (its JSON as dicts), imported only when an OpenEnv environment is used."""
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError:
        raise OpenEnvError("an OpenEnv environment needs OpenEnv's client: pip install 'reasonrl[openenv]'") from None
    return GenericEnvClient


def parsed(result) -> tuple[str, float | None, bool]:
    """An OpenEnv ``StepResult`` as the observation's text, its reward (None: none) and whether it ends the game."""
    reward = None if result.reward is None else float(result.reward)
    return observation_text(result.observation), reward, bool(result.done)


def read_schema(base_url: str, timeout_s: float) -> dict:
    """The server's JSON schemas (``GET <base_url>/schema``: action, observation, state)."""
    if not base_url.startswith(("http://", "https://")):
        raise OpenEnvError(f"an OpenEnv server is named by its http(s) URL, not {base_url!r}")
    deadline = time.monotonic() + timeout_s  # for the whole answer: a socket's timeout is per read
    try:
        with urllib.request.urlopen(f"{base_url}/schema", timeout=timeout_s) as response:
            body = b""
            while len(body) < MAX_SCHEMA_BYTES and (chunk := response.read1(MAX_SCHEMA_BYTES - len(body))):
                body += chunk
                if time.monotonic() > deadline:
                    raise TimeoutError(f"its schema took more than {timeout_s:g} s")
            schema = json.loads(body)
    except (OSError, ValueError) as exc:
        raise OpenEnvError(f"the OpenEnv server {base_url} did not serve its schema: {exc}") from None
    if not isinstance(schema, dict):
        raise OpenEnvError(f"the OpenEnv server {base_url} serves {json_kind(schema)} at /schema, not its schemas")
    if not isinstance(schema.get("action"), dict):
        got = json_kind(schema["action"]) if "action" in schema else "none"
        raise OpenEnvError(f"the OpenEnv server {base_url} serves no action schema at /schema (its 'action': {got})")
    return schema


def close_quietly(client) -> None:
    """Close an episode's connection; a server gone already has nothing left to close."""
    with contextlib.suppress(Exception):
        client.close()


def close_in_background(client) -> None:
    """Close an episode's connection without waiting: a hung server may take its time to agree."""
    threading.Thread(target=close_quietly, args=(client,), daemon=True).start()


class Session:
    """An episode's connection to the server (its state).  ``close()`` closes it in the background, at most
    once; so does dropping it unclosed, as the driver does with an episode whose start failed after its session
    opened (a first observation over the prompt cap)."""

    def __init__(self, client):
        self.client = client
        self.close = weakref.finalize(self, close_in_background, client)
        self.close.atexit = False


@dataclass(frozen=True)
class OpenEnvEnvironment(Environment):
    """Episodes against the OpenEnv server at ``base_url`` (the module docstring says how text maps to its
    actions and observations); ``timeout_s`` is the driver's budget for one turn of all episodes."""

    base_url: str
    text_field: str
    timeout_s: float

    @classmethod
    def connect(cls, name: str, timeout_s: float) -> OpenEnvEnvironment:
        """The environment ``rollout.environment=openenv:<base_url>[#field]`` names, its action field read
        from the server's schema now (raises OpenEnvError when OpenEnv is not installed, or the server or its
        action cannot serve)."""
        base_url, _, chosen = name.removeprefix(OPENENV_PREFIX).partition("#")
        base_url = base_url.rstrip("/")
        client_class()  # OpenEnv is installed: fail now rather than in every episode
        schema = read_schema(base_url, timeout_s / 2)
        try:
            return cls(base_url, action_field(schema["action"], chosen), timeout_s)
        except OpenEnvError as exc:
            raise OpenEnvError(f"the OpenEnv server {base_url}: {exc}") from None

    def reset(self, row: Example) -> Observation:
        wait_s = self.timeout_s / 2
        client = client_class()(
            self.base_url, connect_timeout_s=wait_s, message_timeout_s=wait_s, max_message_size_mb=MAX_MESSAGE_MB
        ).sync()
        session = Session(client)
        first, _, _ = self.exchange(session, lambda: parsed(client.reset()))
        *earlier, last = row.messages
        asked = {**last, "content": f"{last['content']}\n\n{first}" if first else last["content"]}
        return Observation([*earlier, asked], state=session)

    def step(self, episode: Conversation) -> Step:
        session, text = episode.state, episode.turns()[-1].text
        reply, reward, done = self.exchange(session, lambda: parsed(session.client.step({self.text_field: text})))
        return Step(reward=reward) if done else Step(Injection(reply, ROLE_POLICY), reward)

    def exchange(self, session: Session, call: Callable[[], T]) -> T:
        """``call()``'s result; on a failure, which ends the episode (``finish`` is not called for it), the
        session is closed, and a timeout names the server that was silent."""
        try:
            return call()
        except BaseException as exc:
            session.close()
            if isinstance(exc, TimeoutError):
                silent = f"the OpenEnv server {self.base_url} did not answer within {self.timeout_s / 2:g} s"
                raise TimeoutError(silent) from None
            raise

    def finish(self, episode: Conversation) -> float:
        episode.state.close()
        return 0.0  # the server's step rewards are the episode's reward
