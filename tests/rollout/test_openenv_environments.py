"""OpenEnv environments: a run trains against a local OpenEnv server (one session per episode, every one
closed, the server's rewards, its feedback read by the policy), a server that dies, hangs or errs costs its
episodes within the budget and never the run, and a server whose actions a turn's text cannot fill (or a missing
OpenEnv) is refused when the run starts."""

import contextlib
import http.server
import re
import socket
import sys
import threading
import time

import pytest

from reasonrl.config import load_config
from reasonrl.data.guess_number import guess_number_examples
from reasonrl.models.load import load_tokenizer
from reasonrl.rollout.multiturn.conversations import run_conversations, start_conversations
from reasonrl.rollout.multiturn.openenv_environments import (
    MAX_OBSERVATION_CHARS,
    OpenEnvEnvironment,
    OpenEnvError,
    observation_text,
)
from reasonrl.training.loop import fit
from tests.rollout.test_environments import PARAMS, rows_of, scripted
from tests.train.test_environments import TWO_STEPS, steps
from tests.train.test_environments import scripted as scripted_run
from tests.train.test_multiturn import PAG_TINY

pytest.importorskip("openenv")
uvicorn = pytest.importorskip("uvicorn")

from openenv.core.env_server import Action, State, create_fastapi_app  # noqa: E402
from openenv.core.env_server import Environment as ServerEnvironment  # noqa: E402
from openenv.core.env_server import Observation as ServerObservation  # noqa: E402

SECRET, WIN = 6, 0.5
RELEASE = threading.Event()  # lets a hanging server's steps return when a test ends


class Guess(Action):
    guess: str


class Feedback(ServerObservation):
    feedback: str


class Sessions:
    """What the server saw: games opened and closed."""

    opened = closed = 0


class GuessServer(ServerEnvironment):
    """Guess the number (1 to 10) on the server: "N is too low/high", WIN and the end for the right one."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    hang = False

    def __init__(self):
        super().__init__()
        Sessions.opened += 1

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Feedback(feedback="I think of a number from 1 to 10. Your guess?")

    def step(self, action, timeout_s=None, **kwargs):
        if self.hang:
            RELEASE.wait(60)
        number = int((re.findall(r"\d+", action.guess) or ["0"])[-1])
        if number == SECRET:
            return Feedback(feedback="Right.", reward=WIN, done=True)
        return Feedback(feedback=f"{number} is too {'low' if number < SECRET else 'high'}.", reward=0.0)

    @property
    def state(self):
        return State()

    def close(self):
        Sessions.closed += 1


class HangingServer(GuessServer):
    hang = True


class BrokenServer(GuessServer):
    def step(self, action, timeout_s=None, **kwargs):
        raise ValueError("the board broke")


class TwoFields(Action):
    guess: str
    note: str


@contextlib.contextmanager
def serving(game=GuessServer, action=Guess):
    """The OpenEnv server of ``game`` on a free local port, in a thread: yields (its URL, the uvicorn server)."""
    app = create_fastapi_app(game, action, Feedback, max_concurrent_envs=64)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    RELEASE.clear()
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        RELEASE.set()
        server.should_exit = True
        thread.join(10)


def all_closed() -> bool:
    """Whether the server closes every session it opened within 5 s (closing runs in the background)."""
    deadline = time.monotonic() + 5
    while Sessions.closed < Sessions.opened and time.monotonic() < deadline:
        time.sleep(0.05)
    return Sessions.closed == Sessions.opened


def halving(text, rng):
    """Guesses at random first, then halves the range the server's feedback leaves (found within 4 turns)."""
    low, high = 1, 10
    for guess, word in re.findall(r"(\d+) is too (low|high)", text):
        low, high = (int(guess) + 1, high) if word == "low" else (low, int(guess) - 1)
    return f"Answer: {(low + high) // 2 if low > 1 or high < 10 else rng.randint(1, 10)}"


def test_a_run_trains_two_steps_against_an_openenv_server(tmp_path):
    with serving() as (url, _):
        Sessions.opened = Sessions.closed = 0
        overrides = ["rollout.multiturn=env", f"rollout.environment=openenv:{url}", "rollout.max_turns=4"]
        fit(load_config("grpo", [*TWO_STEPS, *overrides]), tmp_path, engine=scripted_run(halving), show_progress=False)
        assert all_closed() and Sessions.opened > 8  # one session per episode (and held-out one), all closed
    assert len(steps(tmp_path)) == 2
    for m in steps(tmp_path):
        assert m["multiturn/environment_error_fraction"] == 0.0
        assert 1.0 < m["multiturn/turns_mean"] <= 4.0  # the policy read the server's "too low/high"
        assert m["reward/mean"] == WIN and m["reward/accuracy"] == 1.0  # the server's reward for the right guess


SERVERS = {"dies": GuessServer, "hangs": HangingServer, "errs": BrokenServer}


@pytest.mark.parametrize("failure", SERVERS)
def test_a_server_that_dies_hangs_or_errs_ends_the_episodes_within_the_budget(failure, caplog):
    tokenizer = load_tokenizer("tiny-random")
    rows = rows_of(guess_number_examples("test")[:4])
    with serving(SERVERS[failure]) as (url, server):
        environment = OpenEnvEnvironment.connect(f"openenv:{url}", timeout_s=2.0)
        episodes = start_conversations(environment, tokenizer, rows, max_prompt_tokens=4096, timeout_s=2.0)
        assert not any(e.error for e in episodes) and "Your guess?" in episodes[0].messages[-1]["content"]
        if failure == "dies":
            server.should_exit = True
            time.sleep(0.5)
        started = time.monotonic()
        engine = scripted(tokenizer, lambda text: "Answer: 3")
        run_conversations(engine, tokenizer, episodes, environment, PARAMS, max_turns=3, timeout_s=2.0)
        assert time.monotonic() - started < 4
    why = {
        "dies": "ConnectionClosed",
        "hangs": f"the OpenEnv server {url} did not answer within 1 s",
        "errs": "Server error: the board broke",
    }[failure]
    assert all(e.end == "error" and e.error.startswith("step:") and why in e.error for e in episodes)
    assert all(len(e.turns()) == 1 for e in episodes)
    assert "an environment failed an episode" in caplog.text


def test_an_episode_whose_start_fails_after_its_session_opened_still_closes_it():
    rows = rows_of(guess_number_examples("test")[:4])
    with serving() as (url, _):
        Sessions.opened = Sessions.closed = 0
        environment = OpenEnvEnvironment.connect(f"openenv:{url}", timeout_s=2.0)
        tokenizer = load_tokenizer("tiny-random")
        episodes = start_conversations(environment, tokenizer, rows, max_prompt_tokens=8, timeout_s=2.0)
        assert all("first observation is" in e.error for e in episodes)
        assert all_closed() and Sessions.opened == 4  # the driver dropped them: their sessions closed


def test_a_run_against_a_hanging_server_goes_on_with_its_episodes_failed(tmp_path):
    budget = ["rollout.environment_timeout_seconds=2", "rollout.tool_batch_timeout_seconds=1"]
    with serving(HangingServer) as (url, _):
        overrides = ["rollout.multiturn=env", f"rollout.environment=openenv:{url}", "rollout.max_turns=4", *budget]
        started = time.monotonic()
        fit(load_config("grpo", [*PAG_TINY, *overrides]), tmp_path, engine=scripted_run(halving), show_progress=False)
        assert time.monotonic() - started < 25  # each turn of episodes waits 1 s for the server, not 60
    (m,) = steps(tmp_path)
    assert m["multiturn/environment_error_fraction"] == 1.0 and m["reward/mean"] == 0.0
    assert m["multiturn/turns_mean"] == 1.0


def test_an_action_a_turns_text_cannot_fill_or_a_missing_client_is_refused_when_the_run_starts(monkeypatch):
    with serving(action=TwoFields) as (url, _):
        with pytest.raises(OpenEnvError, match=r"2 string fields \['guess', 'note'\].*after '#'"):
            OpenEnvEnvironment.connect(f"openenv:{url}", timeout_s=2.0)
        with pytest.raises(OpenEnvError, match=r"also requires \['note'\]"):
            OpenEnvEnvironment.connect(f"openenv:{url}#guess", timeout_s=2.0)
    with pytest.raises(OpenEnvError, match="did not serve its schema"):
        OpenEnvEnvironment.connect(f"openenv:{url}", timeout_s=2.0)  # the server is gone
    monkeypatch.setitem(sys.modules, "openenv.core.generic_client", None)  # OpenEnv not installed
    with pytest.raises(OpenEnvError, match=re.escape("pip install 'reasonrl[openenv]'")):
        OpenEnvEnvironment.connect(f"openenv:{url}", timeout_s=2.0)


@contextlib.contextmanager
def serving_schema(body: bytes):
    """A local HTTP server that answers ``body`` to every GET (a server's /schema): yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


MALFORMED_SCHEMAS = {
    b"[1, 2]": "serves a list at /schema, not its schemas",
    b"null": "serves null at /schema",
    b'{"observation": {}}': "serves no action schema at /schema (its 'action': none)",
    b'{"action": "guess"}': "serves no action schema at /schema (its 'action': a string)",
    b'{"action": {"properties": ["guess"]}}': "its action schema is malformed: 'properties' must be an object of "
    "fields and 'required' a list of field names, not a list and a list",
    b'{"action": {"properties": {"guess": {"type": "string"}}, "required": "guess"}}': "not an object and a string",
    b'{"action": {"properties": {"guess": {"type": "string"}}, "required": [1]}}': "not an object and a list",
    b'{"action": {"properties": {"guess": "string"}}}': "its action has 0 string fields []",
}


@pytest.mark.parametrize("body", MALFORMED_SCHEMAS, ids=[b.decode() for b in MALFORMED_SCHEMAS])
def test_a_malformed_schema_is_refused_naming_the_server_and_what_was_wrong(body):
    with serving_schema(body) as url, pytest.raises(OpenEnvError) as refused:
        OpenEnvEnvironment.connect(f"openenv:{url}", timeout_s=2.0)
    message = str(refused.value)
    assert message.startswith(f"the OpenEnv server {url}") and MALFORMED_SCHEMAS[body] in message


def test_an_observation_reads_as_its_one_string_field_or_the_json_of_its_fields_cut_to_the_cap():
    assert observation_text({"echoed_message": "hi", "message_length": 2}) == "hi"
    assert observation_text({"board": "x..", "hint": "go"}) == '{"board": "x..", "hint": "go"}'
    assert observation_text({"score": 3}) == '{"score": 3}'
    assert observation_text({"text": "a" * 10**6}) == "a" * MAX_OBSERVATION_CHARS


def test_a_server_that_trickles_its_schema_is_refused_within_the_time_allowed():
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():  # a valid HTTP answer whose body comes one byte every 0.2 s
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not stop.wait(0.2):
                with contextlib.suppress(OSError):
                    connection.sendall(b" ")

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(OpenEnvError, match="took more than"):
            OpenEnvEnvironment.connect(f"openenv:http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=2.0)
    finally:
        stop.set()
        listener.close()
    assert time.monotonic() - started < 3  # the socket's timeout alone would wait for every byte
