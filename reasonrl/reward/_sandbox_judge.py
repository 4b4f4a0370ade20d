"""Inside the sandbox, the trusted side: it builds the isolation, runs each test, and decides it.

The harness (``sandbox.py``) starts it as ``python -I -S _sandbox_judge.py REPORT_FD`` (inside
``unshare``'s new network, PID, mount, IPC and UTS namespaces where it can) and writes one JSON job
to its stdin.  It first caps its own CPU time and address space (kernel limits: nothing the child
sends can stall or grow it past them).  As root it limits System V IPC in its namespace and builds a
read-only root (``_sandbox_os.py``), then chroots into it.  For each test it starts a fresh child
(``_sandbox_child.py``) as an unprivileged uid of its own, which runs the solution, and then runs
the test's code *itself*: every call of a solution function is sent to the child and only its
encoded result comes back (plain data, or an opaque handle to an object of the solution), so
asserts and comparisons execute here, where the solution cannot reach.  Results go to REPORT_FD, a
pipe only the judge holds, as JSON lines stamped with the run's nonce; the test code's own stdout is
diagnostics.  Standard library only.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import importlib.util
import json
import math
import os
import resource
import select
import signal
import subprocess
import sys
import time

codec = None  # _sandbox_child.py, loaded by path (it holds the value codec)
osl = None  # _sandbox_os.py, loaded by path (the filesystem view and the process sweep)
REPORT = {"fd": -1, "nonce": ""}
# Standard modules a test may name without importing them (MBPP 596 uses ``sys``, which only the
# canonical solution imports): the judge imports its own copy; the child's is never used.
# fmt: off
TEST_MODULES = frozenset((
    "array", "bisect", "cmath", "collections", "copy", "datetime", "decimal", "fractions", "functools", "hashlib",
    "heapq", "itertools", "json", "math", "operator", "random", "re", "statistics", "string", "sys", "typing",
))
# fmt: on


class TestTimeout(BaseException):
    """The test ran out of wall-clock time (BaseException: a test's ``except Exception`` must not swallow it)."""


class ChildFailure(BaseException):
    """The child died, broke the protocol, or hit a limit; ``status`` says which."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class RemoteError(Exception):
    """An exception of the solution that has no built-in counterpart here."""


# Built-in errors the interpreter acts on by itself: a StopIteration (StopAsyncIteration) out of a call
# ends the iteration around it, so ``all(map(lambda c: candidate(c) == ..., cases))`` would stop early and
# pass; MemoryError is the ``memory`` status.  From the solution they arrive as a RemoteError.
NEVER_REBUILT = (StopIteration, StopAsyncIteration, MemoryError)


class OpaqueValueError(TypeError):
    """A test compared, truth-tested or iterated an object of the solution: only the solution may look inside it."""


def report(record: dict) -> None:
    data = (json.dumps({**record, "nonce": REPORT["nonce"]}) + "\n").encode()
    while data:
        data = data[os.write(REPORT["fd"], data) :]


def limit_self(limits: dict) -> None:
    """Kernel-enforced caps on the judge itself: CPU seconds and address space (soft limit only, so the
    child can still set its own, larger or smaller)."""
    cpu = math.ceil(max(limits["total_timeout_s"], limits["timeout_s"])) + 3
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = limits["judge_memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, resource.getrlimit(resource.RLIMIT_AS)[1]))


class Child:
    """One untrusted child process and its three pipes (requests, replies, output)."""

    def __init__(self, job: dict, uid: int | None, workdir: str, child_path: str) -> None:
        self.uid = uid
        self.output = bytearray()
        limits = job["limits"]
        self.output_budget = limits["output_limit_bytes"]
        self.max_message = limits["max_message_bytes"]
        self.buffer = bytearray()
        self.names: dict[str, str] = {}
        self.closed = False
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.out_r, out_w = os.pipe()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        ids = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
        try:
            self.process = subprocess.Popen(
                [job["python"], "-I", "-S", child_path, str(req_r), str(resp_w), json.dumps(limits["rlimits"])],
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                pass_fds=(req_r, resp_w),
                cwd=workdir,
                env=env,
                process_group=0,
                **ids,
            )
        except OSError as exc:
            for fd in (req_r, self.req_w, self.resp_r, resp_w, self.out_r, out_w):
                os.close(fd)
            self.closed = True
            raise ChildFailure("error", f"could not start the program: {exc}") from None
        for fd in (req_r, resp_w, out_w):
            os.close(fd)
        for fd in (self.req_w, self.resp_r, self.out_r):
            os.set_blocking(fd, False)

    def _pump_output(self) -> bool | None:
        """Read what the program wrote: True (read some), None (nothing yet) or False (end of file).

        Raises once the program passes its output limit."""
        try:
            chunk = os.read(self.out_r, 65536)
        except BlockingIOError:
            return None
        if not chunk:
            return False
        self.output += chunk[: max(0, 4096 - len(self.output))]
        self.output_budget -= len(chunk)
        if self.output_budget < 0:
            raise ChildFailure("output_limit", "the program wrote more output than the limit")
        return True

    def _wait(self, read: list[int], write: list[int], deadline: float) -> tuple[list, list]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TestTimeout()
        readable, writable, _ = select.select(read, write, [], remaining)
        return readable, writable

    def send(self, message: dict, deadline: float) -> None:
        data = memoryview(codec.frame(message))
        while data:
            readable, writable = self._wait([self.out_r], [self.req_w], deadline)
            if readable:
                self._pump_output()
            if writable:
                try:
                    data = data[os.write(self.req_w, data) :]
                except BrokenPipeError:
                    raise self._died() from None

    def receive(self, deadline: float) -> dict:
        while True:
            if len(self.buffer) >= 4:
                size = int.from_bytes(self.buffer[:4], "big")
                if size > self.max_message:
                    raise ChildFailure("error", f"a reply of {size} bytes exceeds the message limit")
                if len(self.buffer) >= 4 + size:
                    body, self.buffer = bytes(self.buffer[4 : 4 + size]), self.buffer[4 + size :]
                    try:
                        message = json.loads(body)
                    except (ValueError, RecursionError) as exc:
                        raise ChildFailure("error", f"malformed reply: {exc}") from None
                    if type(message) is not dict:
                        raise ChildFailure("error", "malformed reply")
                    return message
            readable, _ = self._wait([self.resp_r, self.out_r], [], deadline)
            if self.out_r in readable:
                self._pump_output()
            if self.resp_r in readable:
                chunk = os.read(self.resp_r, 1 << 16)
                if not chunk:
                    raise self._died()
                self.buffer += chunk
                if len(self.buffer) > self.max_message + 4:
                    raise ChildFailure("error", "a reply exceeds the message limit")

    def _died(self) -> ChildFailure:
        try:
            code = self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return ChildFailure("crashed", "the program closed its reply channel")
        if code == -signal.SIGXCPU:
            return ChildFailure("timeout", "CPU time limit exceeded")
        reason = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return ChildFailure("crashed", f"the program {reason} before the test finished")

    def close(self) -> None:
        """Kill the program and everything it started; keep the rest of its output (within the limit)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        osl.kill_all(self.uid)
        try:
            while self.output_budget >= 0 and self._pump_output():  # None (would block) ends it too
                pass
        except ChildFailure:
            pass
        for fd in (self.req_w, self.resp_r, self.out_r):
            os.close(fd)


# --- what the test code sees of the solution ------------------------------------------------------------


def _remote_exception(reply: dict) -> BaseException:
    """What the test sees of the solution's exception, whatever the child sends: the built-in type it
    names if that is an ordinary error (``except ValueError``, ``assertRaises(KeyError)`` work), else a
    ``RemoteError``.  A type outside ``Exception`` (``SystemExit``, ``GeneratorExit``...) or in
    ``NEVER_REBUILT`` never crosses, so all a call of the solution can tell the test is that it raised."""
    name, message = str(reply.get("exc")), str(reply.get("msg", ""))
    if reply.get("memory"):
        return ChildFailure("memory", f"MemoryError: {message}")
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, NEVER_REBUILT):
        with contextlib.suppress(Exception):
            return cls(message)
    return RemoteError(f"{name}: {message}")


class Remote:
    """A solution function, as the test code sees it: calling it is a round trip to the child."""

    __slots__ = ("judge", "name")

    def __init__(self, judge: Judge, name: str) -> None:
        self.judge, self.name = judge, name

    def __call__(self, *args, **kwargs):
        return self.judge.request({"op": "call", "target": {"R": self.name}}, args, kwargs)

    def __repr__(self) -> str:
        return f"<solution function {self.name}>"


class RemoteObject:
    """An object of the solution (a tree node, a class instance), held by the child.

    The test may pass it back to the solution, call it, and read or set its attributes (each a round
    trip).  Its own ``__eq__``, ``__bool__``, ``__len__`` or ``__iter__`` never run: equality here is
    identity (a handle equals only itself, never a plain expected value), ordering, iterating or
    measuring it is a TypeError, and truth-testing it raises ``OpaqueValueError``; the test fails."""

    __slots__ = ("_index", "_judge")

    def __init__(self, judge: Judge, index: int) -> None:
        object.__setattr__(self, "_judge", judge)
        object.__setattr__(self, "_index", index)

    def __call__(self, *args, **kwargs):
        return self._judge.request({"op": "call", "target": {"H": self._index}}, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._judge.request({"op": "getattr", "target": {"H": self._index}, "name": name}, (), {})

    def __setattr__(self, name: str, value) -> None:
        self._judge.request({"op": "setattr", "target": {"H": self._index}, "name": name}, (), {}, value=value)

    def __bool__(self):
        raise OpaqueValueError("a test took the truth of an object of the solution (compare what it returns instead)")

    def __repr__(self) -> str:
        return f"<solution object #{self._index}>"


class Judge:
    """Runs the tests of one job, one child per test (or one for all, without ``isolate_tests``)."""

    def __init__(self, job: dict, uid: int | None, workdir: str, child_path: str, scratch: list[str]) -> None:
        self.job, self.uid, self.workdir, self.child_path, self.scratch = job, uid, workdir, child_path, scratch
        self.child: Child | None = None
        self.handles: dict[int, RemoteObject] = {}
        self.deadline = 0.0
        self.output = bytearray()
        self.rlimits_failed: list[str] = []
        self.context_code = compile(job["context"], "<context>", "exec")
        self.setup_code = compile(job["setup"], "<test setup>", "exec")
        self.test_codes = [compile(t, f"<test {i}>", "exec") for i, t in enumerate(job["tests"])]
        self.test_names = [_names_in(job["setup"]) | _names_in(t) for t in job["tests"]]

    # -- the codec's two hooks: what a judge-side value is called there, and what a name from there is here

    def _refs(self, value):
        if type(value) is Remote:
            return "R", value.name
        if type(value) is RemoteObject and value._judge is self:
            return "H", value._index
        return None

    def _resolve(self, tag: str, name):
        if tag == "R" and type(name) is str and self.child is not None and self.child.names.get(name) == "callable":
            return Remote(self, name)
        if tag == "H" and type(name) is int and 0 <= name < (1 << 31):
            return self.handles.setdefault(name, RemoteObject(self, name))
        raise codec.ProtocolError("unknown reference")

    def start_child(self) -> None:
        self.child = Child(self.job, self.uid, self.workdir, self.child_path)
        self.handles = {}
        init = {
            "context": self.job["context"],
            "solution": self.job["solution"],
            "entry_point": self.job["entry_point"],
        }
        self.child.send(init, self.deadline)
        reply = self.child.receive(self.deadline)
        self.rlimits_failed = reply.get("rlimits_failed", [])
        if "load_error" in reply:
            error = reply["load_error"]
            status = "memory" if type(error) is dict and error.get("memory") else "error"
            detail = f"{error.get('exc')}: {error.get('msg')}" if type(error) is dict else "?"
            raise ChildFailure(status, f"the solution failed to load: {detail}")
        names = reply.get("ready")
        if type(names) is not dict or not all(type(k) is str and type(v) is str for k, v in names.items()):
            raise ChildFailure("error", "malformed ready message")
        self.child.names = names

    def stop_child(self) -> None:
        if self.child is not None:
            self.child.close()
            self.output += self.child.output[: max(0, 4096 - len(self.output))]
            self.child = None
            osl.wipe(self.scratch)  # no file of this test is there for the next one

    def request(self, message: dict, args: tuple, kwargs: dict, **values):
        """One round trip: arguments out as encoded data, the encoded result back, decoded here."""
        try:
            message["args"] = [codec.encode(a, self._refs) for a in args]
            message["kwargs"] = {str(k): codec.encode(v, self._refs) for k, v in kwargs.items()}
            message.update({k: codec.encode(v, self._refs) for k, v in values.items()})
        except codec.Unencodable as exc:
            raise TypeError(f"a test passed a value the sandbox cannot carry: {exc}") from None
        self.child.send(message, self.deadline)
        reply = self.child.receive(self.deadline)
        if "exc" in reply:
            raise _remote_exception(reply)
        try:
            result = codec.decode(reply["ok"], self._resolve)
            for index, value in reply.get("mutated", []):
                self._apply_mutation(args[index], codec.decode(value, self._resolve))
        except (KeyError, TypeError, ValueError, IndexError, RecursionError, codec.ProtocolError) as exc:
            raise ChildFailure("error", f"malformed reply: {exc}") from None
        return result

    @staticmethod
    def _apply_mutation(old, new) -> None:
        if type(old) is not type(new):
            return
        if type(old) in (list, bytearray):
            old[:] = new
        elif type(old) in (dict, set):
            old.clear()
            old.update(new)

    def _namespace(self, index: int) -> dict:
        """The test's globals: the task context (trusted), standard modules it names, the solution's names."""
        namespace = {"__builtins__": builtins, "__name__": "__test__"}
        exec(self.context_code, namespace)  # trusted helpers of the task (e.g. HumanEval's prompt)
        names = self.test_names[index]
        for name in names & TEST_MODULES:
            namespace.setdefault(name, importlib.import_module(name))
        entry = self.job.get("entry_point")
        for name, kind in self.child.names.items():  # never shadow a builtin the test relies on (abs, len...)
            if name != entry and (name in namespace or hasattr(builtins, name)):
                continue
            if kind == "callable":
                namespace[name] = Remote(self, name)
            elif kind == "data" and name in names:
                namespace[name] = self.request({"op": "get", "name": name}, (), {})
        return namespace

    def run_test(self, index: int) -> tuple[str, str]:
        """(status, detail) of one test."""
        if self.child is None:
            self.start_child()
        try:
            namespace = self._namespace(index)
            exec(self.setup_code, namespace)
            exec(self.test_codes[index], namespace)
        except (TestTimeout, ChildFailure):
            raise
        except BaseException as exc:  # an assertion, or the solution's exception: the test failed
            return "failed", f"{type(exc).__name__}: {str(exc)[:300]}"
        return "passed", ""

    def judge(self, index: int) -> tuple[str, str, bool]:
        """(status, detail, whether the solution never loaded) of test ``index``, within the deadline."""
        signal.setitimer(signal.ITIMER_REAL, max(self.deadline - time.monotonic(), 0.001))
        try:
            status, detail = self.run_test(index)
        except TestTimeout:
            status, detail = "timeout", f"the test ran past {self.job['limits']['timeout_s']:g} s"
        except ChildFailure as failure:
            status, detail = failure.status, failure.detail
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        not_loaded = status != "passed" and self.child is not None and not self.child.names
        return status, detail, not_loaded


def _names_in(source: str) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name))


def _on_alarm(signum, frame):
    raise TestTimeout()


def run(job: dict) -> None:
    started = time.monotonic()
    overall = started + job["limits"]["total_timeout_s"]
    iso, uid, workdir, child_path, scratch = osl.isolate(job)
    report({"kind": "isolation", **iso})
    judge = Judge(job, uid, workdir, child_path, scratch)
    signal.signal(signal.SIGALRM, _on_alarm)
    stop: tuple[str, str] | None = None  # a solution that does not load fails every test the same way
    for index in range(len(job["tests"])):
        began = time.monotonic()
        judge.deadline = min(began + job["limits"]["timeout_s"], overall)
        ran = False
        if stop is not None:
            status, detail = stop
        elif judge.deadline <= began:
            status, detail = "timeout", "the run's total time limit was reached before this test"
        else:
            ran = True
            try:
                status, detail, not_loaded = judge.judge(index)
            except TestTimeout:  # the alarm fired on the way out of judge()
                status, detail, not_loaded = "timeout", "the test ran past its time limit", False
            if not_loaded:
                stop = (status, detail)
            if status != "passed" or job["isolate_tests"]:
                judge.stop_child()
        seconds = round(time.monotonic() - began, 4)
        report({"kind": "test", "index": index, "status": status, "detail": detail, "ran": ran, "seconds": seconds})
    judge.stop_child()
    osl.kill_all(uid)
    text = bytes(judge.output).decode("utf-8", "replace")
    report({"kind": "end", "rlimits": not judge.rlimits_failed, "output": text})


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    global codec, osl
    REPORT["fd"] = int(sys.argv[1])
    job = json.loads(sys.stdin.buffer.read())
    REPORT["nonce"] = job["nonce"]
    limit_self(job["limits"])
    sys.set_int_max_str_digits(100_000)  # big answers are fine; a 16 MB digit string would stall the parser
    codec = _load("reasonrl_sandbox_child", job["child_path"])
    osl = _load("reasonrl_sandbox_os", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_os.py"))
    run(job)


if __name__ == "__main__":
    main()
