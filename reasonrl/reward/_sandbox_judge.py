"""Inside the sandbox, the trusted side: it builds the isolation, runs each test, and decides it.

The harness (``sandbox.py``) starts it as ``python -I -S _sandbox_judge.py`` (inside ``unshare``'s
new network, PID, mount, IPC and UTS namespaces where it can) and writes one JSON job to its stdin.
As root it builds a read-only root (``_sandbox_os.py``: tmpfs + read-only binds of the interpreter and system
libraries, private /tmp and /work) and chroots into it.  For each test it starts a fresh child
(``_sandbox_child.py``) as an unprivileged uid of its own, which runs the solution, and then runs
the test's code *itself*: every call of a solution function is sent to the child and only its
plain-data result comes back, so asserts and comparisons execute here, where the solution cannot
reach.  Results go to stdout as JSON lines, one per test.  Standard library only.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time

codec = None  # _sandbox_child.py, loaded by path (it holds the value codec)
osl = None  # _sandbox_os.py, loaded by path (the filesystem view and the process sweep)


class TestTimeout(BaseException):
    """The test ran out of wall-clock time (BaseException: a test's ``except Exception`` must not swallow it)."""


class ChildFailure(BaseException):
    """The child died, broke the protocol, or hit a limit; ``status`` says which."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class NeedsInProcess(BaseException):
    """A value crossed the boundary that is not plain data: the test must run inside the child."""


class RemoteError(Exception):
    """An exception of the solution that has no built-in counterpart here."""


def report(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


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

    def send(self, message: dict, deadline: float) -> None:
        data = memoryview(codec.frame(message))
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TestTimeout()
            readable, writable, _ = select.select([self.out_r], [self.req_w], [], remaining)
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
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TestTimeout()
            readable, _, _ = select.select([self.resp_r, self.out_r], [], [], remaining)
            if self.out_r in readable:
                self._pump_output()
            if self.resp_r in readable:
                chunk = os.read(self.resp_r, 1 << 20)
                if not chunk:
                    raise self._died()
                self.buffer += chunk

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


# --- running tests ---------------------------------------------------------------------------------


def _remote_exception(reply: dict) -> BaseException:
    name, message = str(reply.get("exc")), str(reply.get("msg", ""))
    if reply.get("memory"):
        return ChildFailure("memory", f"MemoryError: {message}")
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not MemoryError:
        return cls(message)
    return RemoteError(f"{name}: {message}")


class Remote:
    """A solution function, as the test code sees it: calling it is a round trip to the child."""

    __slots__ = ("judge", "name")

    def __init__(self, judge: Judge, name: str) -> None:
        self.judge, self.name = judge, name

    def __call__(self, *args, **kwargs):
        return self.judge.call(self.name, args, kwargs)

    def __repr__(self) -> str:
        return f"<solution function {self.name}>"


class Judge:
    """Runs the tests of one job, one child per test (or one for all, without ``isolate_tests``)."""

    def __init__(self, job: dict, uid: int | None, workdir: str, child_path: str) -> None:
        self.job, self.uid, self.workdir, self.child_path = job, uid, workdir, child_path
        self.child: Child | None = None
        self.deadline = 0.0
        self.output = bytearray()
        self.rlimits_failed: list[str] = []
        self.context_code = compile(job["context"], "<context>", "exec")
        self.setup_code = compile(job["setup"], "<test setup>", "exec")
        self.test_codes = [compile(t, f"<test {i}>", "exec") for i, t in enumerate(job["tests"])]

    def _refs(self, value):
        return value.name if type(value) is Remote else None

    def _resolve(self, name):
        if type(name) is not str or self.child is None or self.child.names.get(name) != "callable":
            raise codec.ProtocolError("unknown reference")
        return Remote(self, name)

    def start_child(self) -> None:
        self.child = Child(self.job, self.uid, self.workdir, self.child_path)
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
            status = "memory" if error.get("memory") else "error"
            raise ChildFailure(status, f"the solution failed to load: {error.get('exc')}: {error.get('msg')}")
        names = reply.get("ready")
        if type(names) is not dict or not all(type(v) is str for v in names.values()):
            raise ChildFailure("error", "malformed ready message")
        self.child.names = names

    def stop_child(self) -> None:
        if self.child is not None:
            self.child.close()
            self.output += self.child.output[: max(0, 4096 - len(self.output))]
            self.child = None

    def call(self, name: str, args: tuple, kwargs: dict):
        """A solution function called from the test: plain data out, plain data back."""
        try:
            encoded = [codec.encode(a, self._refs) for a in args]
            encoded_kw = {str(k): codec.encode(v, self._refs) for k, v in kwargs.items()}
        except codec.Unencodable:
            raise NeedsInProcess() from None
        self.child.send({"op": "call", "name": name, "args": encoded, "kwargs": encoded_kw}, self.deadline)
        reply = self.child.receive(self.deadline)
        if "unsupported" in reply:
            raise NeedsInProcess()
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

    def _rpc(self, index: int) -> None:
        namespace = {"__builtins__": builtins, "__name__": "__test__"}
        exec(self.context_code, namespace)  # trusted helpers of the task (e.g. HumanEval's prompt)
        entry = self.job.get("entry_point")
        for name, kind in self.child.names.items():  # never shadow a builtin the test relies on (abs, len...)
            if kind == "callable" and (name == entry or (name not in namespace and not hasattr(builtins, name))):
                namespace[name] = Remote(self, name)
        exec(self.setup_code, namespace)
        exec(self.test_codes[index], namespace)

    def _in_process(self, index: int) -> None:
        nonce = secrets.token_hex(16)
        message = {"op": "inprocess", "setup": self.job["setup"], "test": self.job["in_process_tests"][index]}
        self.child.send({**message, "nonce": nonce}, self.deadline)
        reply = self.child.receive(self.deadline)
        if "exc" in reply:
            raise _remote_exception(reply)
        if reply.get("done") != nonce:
            raise ChildFailure("error", "malformed reply")

    def run_test(self, index: int, mode: str) -> tuple[str, str]:
        """(status, detail) of one test in one mode; raises NeedsInProcess where rpc cannot carry a value."""
        if self.child is None:
            self.start_child()
        try:
            (self._rpc if mode == "rpc" else self._in_process)(index)
        except (NeedsInProcess, TestTimeout, ChildFailure):
            raise
        except NameError as exc:  # the test names a non-function global of the solution
            if mode == "rpc" and getattr(exc, "name", None) in self.child.names:
                raise NeedsInProcess() from None
            return "failed", f"NameError: {exc}"
        except BaseException as exc:  # an assertion, or the solution's exception: the test failed
            return "failed", f"{type(exc).__name__}: {str(exc)[:300]}"
        return "passed", ""

    def judge(self, index: int) -> tuple[str, str, str, bool]:
        """(status, detail, mode, whether the solution never loaded) of test ``index``, within the deadline."""
        mode = "in_process" if self.job["mode"] == "in_process" else "rpc"
        signal.setitimer(signal.ITIMER_REAL, max(self.deadline - time.monotonic(), 0.001))
        try:
            try:
                status, detail = self.run_test(index, mode)
            except NeedsInProcess:
                if self.job["mode"] == "rpc":
                    return "failed", "a value that is not plain data crossed to the test (mode rpc)", mode, False
                self.stop_child()
                mode = "in_process"
                status, detail = self.run_test(index, mode)
        except TestTimeout:
            status, detail = "timeout", f"the test ran past {self.job['limits']['timeout_s']:g} s"
        except ChildFailure as failure:
            status, detail = failure.status, failure.detail
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        not_loaded = status != "passed" and self.child is not None and not self.child.names
        return status, detail, mode, not_loaded


def _on_alarm(signum, frame):
    raise TestTimeout()


def run(job: dict) -> None:
    started = time.monotonic()
    overall = started + job["limits"]["total_timeout_s"]
    iso, uid, workdir, child_path = osl.isolate(job)
    report({"kind": "isolation", **iso})
    judge = Judge(job, uid, workdir, child_path)
    signal.signal(signal.SIGALRM, _on_alarm)
    stop: tuple[str, str] | None = None  # a solution that does not load fails every test the same way
    for index in range(len(job["tests"])):
        began = time.monotonic()
        judge.deadline = min(began + job["limits"]["timeout_s"], overall)
        mode = ""
        if stop is not None:
            status, detail = stop
        elif judge.deadline <= began:
            status, detail = "timeout", "the run's total time limit was reached before this test"
        else:
            try:
                status, detail, mode, not_loaded = judge.judge(index)
            except TestTimeout:  # the alarm fired on the way out of judge()
                status, detail, mode, not_loaded = "timeout", "the test ran past its time limit", "rpc", False
            if not_loaded:
                stop = (status, detail)
            if status != "passed" or job["isolate_tests"] or mode == "in_process":
                judge.stop_child()
        seconds = round(time.monotonic() - began, 4)
        report({"kind": "test", "index": index, "status": status, "detail": detail, "mode": mode, "seconds": seconds})
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
    sys.set_int_max_str_digits(100_000)  # big answers are fine; a 16 MB digit string would stall the parser
    job = json.loads(sys.stdin.buffer.read())
    codec = _load("reasonrl_sandbox_child", job["child_path"])
    osl = _load("reasonrl_sandbox_os", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_os.py"))
    run(job)


if __name__ == "__main__":
    main()
