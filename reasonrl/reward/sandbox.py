"""Run model-written Python against tests, treating it as hostile.  Design and threat model: docs/sandbox.md.

Layers, outermost first (each one that this machine supports; the verdict says which were active):

1. ``setpriv --pdeathsig KILL`` + ``unshare --net --pid --fork --kill-child --mount-proc --ipc --uts``:
   no network (a new network namespace with only a down loopback), its own PID namespace (killing its
   init kills every process the code started; so does the death of the thread that started it, e.g.
   a scoring worker killed on its timeout), private IPC and hostname.  Without ``unshare`` but with
   ``bwrap`` (non-root), bubblewrap gives the same namespaces and a read-only view of ``/``.
2. The judge (``_sandbox_judge.py``, root inside the namespaces) caps its own CPU time and address
   space, caps System V IPC, denies the kernel keyring system calls (seccomp), mounts a tmpfs root
   holding read-only binds of the interpreter (its site-packages covered) and system libraries only,
   with private ``/tmp`` and ``/work``, and chroots.
3. The code runs in a child as a random unprivileged uid (so RLIMIT_NPROC is enforced even where we
   run as root, and the code cannot read the judge's memory or signal it), with RLIMIT_AS, RLIMIT_CPU,
   RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE, RLIMIT_MSGQUEUE and no core files, ``-I -S`` (standard
   library only), a scrubbed environment (PATH, HOME=/work, TMPDIR, LANG) and capped output.
4. Wall clock: per test in the judge, and for the whole run here (the process group is killed).

The verdict: each test runs in a fresh child; the test's code runs in the judge, and every call of a
solution function is a round trip that carries only plain data (numbers, strings, containers, built-in
types) or opaque handles to the solution's objects, so asserts and comparisons happen where the
solution cannot reach, and exit codes or output never count.  The judge reports on a pipe of its own,
stamped with a per-run nonce; a run that is killed or ends without its end record fails every test.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import logging
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from reasonrl.reward.testcases import split_tests

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
JUDGE = HERE / "_sandbox_judge.py"
CHILD = HERE / "_sandbox_child.py"
SITE_DIRS = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages",
             "local/lib/python3*/dist-packages", "local/lib/python3*/site-packages")  # fmt: skip
SYSTEM_BINDS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/localtime")
UID_BASE, UID_SPAN = 1_900_000_000, 200_000_000  # one random uid per run, far from real and container users
UNSHARE_FLAGS = ("--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts")
STATUS_ORDER = ("timeout", "memory", "output_limit", "crashed", "error", "failed")
SCRATCH_PREFIX = "reasonrl-sandbox-"  # + the harness's pid: a killed harness's scratch is found and removed
GRACE_S = 2.0  # the judge enforces the run's time limit itself; the harness kills it this much later


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    timeout_s: float = 3.0
    """Wall-clock limit per test case (the CPU limit of its process is this, rounded up)."""

    total_timeout_s: float | None = None
    """Wall-clock limit of the whole run; None = ``timeout_s`` per test plus 2 s, at most 60 s."""

    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS) of the untrusted process, in MiB."""

    max_processes: int = 8
    """Process/thread limit (RLIMIT_NPROC) of the sandbox's uid.  Without cgroups, memory is limited per
    process: a run may hold up to ``max_processes * memory_mb`` (plus ``disk_mb`` of tmpfs)."""

    max_file_mb: int = 16
    """Largest file the code may write (RLIMIT_FSIZE), in MiB."""

    disk_mb: int = 64
    """Size of the private tmpfs that holds /work and /tmp, in MiB."""

    output_limit_bytes: int = 1 << 16
    """Output (stdout + stderr) a test may write before it is killed and scored ``output_limit``."""

    max_message_bytes: int = 1 << 20
    """Largest value (encoded) a solution function may return; a larger reply fails the test."""

    judge_memory_mb: int = 256
    """Address-space limit of the judge (the trusted side, which decodes the replies), in MiB."""

    def total_for(self, tests: int) -> float:
        """The whole run's wall-clock limit for ``tests`` test cases."""
        return self.total_timeout_s if self.total_timeout_s is not None else min(60.0, self.timeout_s * tests + 2.0)


@dataclass(frozen=True)
class TestResult:
    """The verdict on one test case."""

    __test__ = False  # not a pytest test class

    index: int
    passed: bool
    status: str
    """passed, failed, error, timeout, memory, output_limit or crashed."""
    ran: bool
    """Whether the judge ran it (False: the solution never loaded, the run ran out of time, or the judge died)."""
    seconds: float
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    """The harness's verdict on one solution."""

    passed: bool
    """Every test case passed."""
    passed_fraction: float
    status: str
    """passed; else the most telling failure: timeout, memory, output_limit, crashed, error, failed."""
    wall_seconds: float
    tests: tuple[TestResult, ...]
    network_isolated: bool
    isolation: dict[str, bool] = field(default_factory=dict)
    detail: str = ""
    output: str = ""
    """The first 4 KiB of what the program printed (diagnostics only; never part of the verdict)."""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CodeJob:
    """A solution and the tests it must pass."""

    solution: str
    tests: str
    """A test program: assert lines and/or HumanEval's ``def check(candidate)`` (see testcases.py)."""
    entry_point: str | None = None
    """The function under test (HumanEval's ``candidate``)."""
    context: str = ""
    """Task code run before the solution in the child and, as trusted helpers, before the tests."""


@dataclass(frozen=True)
class Support:
    """What isolation this machine offers (probed once per process)."""

    launcher: Literal["unshare", "bwrap", "none"]
    root: bool
    network_isolated: bool


@functools.cache
def isolation_support() -> Support:
    """Probe once per process which launcher works here.

    As root: ``unshare`` (the judge then adds the read-only root and the unprivileged uid), else
    ``bwrap``.  Otherwise: ``bwrap`` (a read-only view of / without root), else ``unshare``.  With
    neither, the code runs without namespaces and verdicts say ``network_isolated: false``.
    """
    root = os.geteuid() == 0
    probe = [os.path.realpath(sys.executable), "-I", "-S", "-c", ""]
    unshare, bwrap = shutil.which("unshare"), shutil.which("bwrap")
    candidates = [("unshare", unshare), ("bwrap", bwrap)] if root else [("bwrap", bwrap), ("unshare", unshare)]
    for name, path in candidates:
        if not path:
            continue
        prefix = [path, *UNSHARE_FLAGS] if name == "unshare" else _bwrap_prefix(path, tempfile.gettempdir())
        if _works([*prefix, *probe]):
            return Support(name, root, True)
    return Support("none", root, False)


def _works(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _bwrap_prefix(bwrap: str, workdir: str) -> list[str]:
    return [
        bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
        "--new-session", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        "--ro-bind", str(HERE), str(HERE), "--bind", workdir, workdir, "--chdir", workdir,
    ]  # fmt: skip


def _binds() -> list[str]:
    """Host paths the read-only root shows: system libraries and this interpreter's installation."""
    executable = os.path.realpath(sys.executable)
    prefixes = {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(executable))}
    return [*SYSTEM_BINDS, *sorted(p for p in prefixes if p not in ("/", "") and os.path.isdir(p))]


def _hidden(binds: list[str]) -> list[str]:
    """The site-packages directories under ``binds``: covered inside the sandbox (standard library only)."""
    found = set()
    for prefix in binds:
        for pattern in SITE_DIRS:
            found.update(p for p in glob.glob(os.path.join(prefix, pattern)) if os.path.isdir(p))
    return sorted(found)


def _rlimits(limits: SandboxLimits, tests: int, isolate_tests: bool) -> dict[str, int]:
    cpu = math.ceil(limits.timeout_s if isolate_tests else limits.total_for(tests)) + 1
    return {
        "RLIMIT_AS": limits.memory_mb << 20,
        "RLIMIT_CPU": cpu,
        "RLIMIT_FSIZE": limits.max_file_mb << 20,
        "RLIMIT_NPROC": limits.max_processes,
        "RLIMIT_NOFILE": 64,
        "RLIMIT_CORE": 0,
        "RLIMIT_MSGQUEUE": 1 << 16,
    }


def _aggregate(tests: list[TestResult]) -> str:
    if tests and all(t.passed for t in tests):
        return "passed"
    statuses = {t.status for t in tests}
    return next((s for s in STATUS_ORDER if s in statuses), "error")


def _failed_verdict(detail: str, started: float, support: Support, status: str = "error") -> Verdict:
    return Verdict(False, 0.0, status, round(time.monotonic() - started, 4), (), support.network_isolated, {}, detail)


def run_job(
    job: CodeJob, limits: SandboxLimits = SandboxLimits(), isolate_tests: bool = True, deadline: float | None = None
) -> Verdict:
    """Run ``job.solution`` against ``job.tests`` in a fresh sandbox; never raises for anything the code does.

    ``isolate_tests``: a fresh process per test case (False: one process runs them all, faster, and
    the solution's state carries over from test to test).  ``deadline``: a ``time.monotonic()`` time
    the run ends by whatever its limits allow (a batch's budget); a run that would start after it fails
    "timeout" without running.
    """
    started = time.monotonic()
    support = isolation_support()
    try:
        plan = split_tests(job.tests, job.entry_point)
    except ValueError as exc:
        return _failed_verdict(str(exc), started, support)
    total = limits.total_for(len(plan.cases))
    if deadline is not None:
        total = min(total, deadline - started)
        if total <= 0:
            return _failed_verdict("no time left in the batch's budget", started, support, "timeout")
    _remove_stale_scratch()
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        (scratch / "root").mkdir()
        (scratch / "work").mkdir()
        binds = _binds()
        nonce = secrets.token_hex(16)
        payload = {
            "nonce": nonce,
            "solution": job.solution,
            "context": job.context,
            "setup": plan.setup,
            "tests": list(plan.cases),
            "entry_point": job.entry_point,
            "isolate_tests": isolate_tests,
            "python": os.path.realpath(sys.executable),
            "child_path": str(CHILD),
            "rootfs": str(scratch / "root") if support.launcher == "unshare" and support.root else None,
            "workdir": str(scratch / "work"),
            "uid": UID_BASE + secrets.randbelow(UID_SPAN) if support.root and support.launcher != "bwrap" else None,
            "binds": binds,
            "hidden": _hidden(binds),
            "ipc_namespace": support.launcher != "none",
            "limits": {
                **asdict(limits),
                "total_timeout_s": total,
                "rlimits": _rlimits(limits, len(plan.cases), isolate_tests),
            },
        }
        report_r, report_w = os.pipe()
        command = [os.path.realpath(sys.executable), "-I", "-S", str(JUDGE), str(report_w)]
        if support.launcher == "unshare":
            command = [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, *command]
        elif support.launcher == "bwrap":
            command = [*_bwrap_prefix(shutil.which("bwrap") or "bwrap", str(scratch / "work")), *command]
        setpriv = shutil.which("setpriv")
        if setpriv:  # the sandbox dies with the thread that started it (a scoring worker killed on timeout)
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        payload_bytes = json.dumps(payload).encode()
        report, killed, diagnostics = _execute(command, payload_bytes, report_r, report_w, total, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _verdict(_records(report, nonce), killed, diagnostics, len(plan.cases), started, support)


@functools.cache
def _remove_stale_scratch() -> None:
    """Once per process: remove scratch directories left by harness processes that were killed mid-run."""
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        pid = path.name[len(SCRATCH_PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _execute(
    command: list[str], payload: bytes, report_r: int, report_w: int, total: float, cwd: Path
) -> tuple[bytes, str, str]:
    """Run the judge: (what it wrote on its report pipe, why it was killed or '' if it was not, its output's tail).

    The judge's own stdout and stderr (the test code may print) are diagnostics only."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(report_w,),
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    finally:
        os.close(report_w)
    report_file = os.fdopen(report_r, "rb", buffering=0)
    cap, deadline, killed = 4 << 20, time.monotonic() + total + GRACE_S, ""
    report, output = bytearray(), bytearray()
    try:
        try:
            process.stdin.write(payload)
            process.stdin.close()
        except BrokenPipeError:
            pass
        with selectors.DefaultSelector() as selector:
            selector.register(report_file, selectors.EVENT_READ, report)
            selector.register(process.stdout, selectors.EVENT_READ, output)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    killed = "the run passed its total time limit"
                    break
                for key, _ in selector.select(remaining):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    key.data.extend(chunk)
                del output[:-65536]  # the judge's own output: keep its tail only
                if len(report) > cap:
                    killed = "the judge's report passed its size limit"
                    break
    finally:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)  # the judge and, with it, its namespaces
        process.wait()
        process.stdout.close()
        report_file.close()
    if not killed and process.returncode != 0:
        killed = f"the judge exited with status {process.returncode}"
    return bytes(report), killed, output[-2000:].decode("utf-8", "replace")


def _records(report: bytes, nonce: str) -> list[dict]:
    """The judge's JSON records that carry this run's nonce."""
    records = []
    for line in report.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if type(record) is dict and record.get("nonce") == nonce:
            records.append(record)
    return records


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _verdict(
    records: list[dict], killed: str, diagnostics: str, count: int, started: float, support: Support
) -> Verdict:
    """The verdict from the judge's records.  Without a clean end (killed, crashed, no end record), every
    test fails: the records of a judge that did not finish are not trusted."""
    isolation = {k: v for r in records if r.get("kind") == "isolation" for k, v in r.items() if k != "kind"}
    isolation = {k: v for k, v in isolation.items() if isinstance(v, bool)}
    isolation["network"] = support.network_isolated
    isolation["bwrap"] = support.launcher == "bwrap"
    if support.root and isolation.get("unprivileged_uid") is False:
        _warn_once("the sandbox ran code as root: no unprivileged uid was possible here (see docs/sandbox.md)")
    end = next((r for r in records if r.get("kind") == "end"), None)
    if end is not None:
        isolation["rlimits"] = bool(end.get("rlimits"))
    finished = end is not None and not killed
    by_index = {r["index"]: r for r in records if r.get("kind") == "test"} if finished else {}
    unfinished = killed or f"the judge did not finish: {diagnostics.strip()[-500:]}"
    tests = []
    for index in range(count):
        record = by_index.get(index)
        if record is None:
            status = "timeout" if killed.endswith("time limit") else "error"
            tests.append(TestResult(index, False, status, False, 0.0, unfinished))
        else:
            status = str(record["status"])
            tests.append(
                TestResult(index, status == "passed", status, bool(record["ran"]), record["seconds"], record["detail"])
            )
    passed = sum(t.passed for t in tests)
    return Verdict(
        passed=passed == count,
        passed_fraction=passed / count if count else 0.0,
        status=_aggregate(tests),
        wall_seconds=round(time.monotonic() - started, 4),
        tests=tuple(tests),
        network_isolated=support.network_isolated,
        isolation=isolation,
        detail=unfinished if not finished else next((t.detail for t in tests if not t.passed and t.detail), ""),
        output=str(end.get("output", "")) if end is not None else "",
    )


def run_code(
    solution: str,
    tests: str,
    entry_point: str | None = None,
    context: str = "",
    limits: SandboxLimits = SandboxLimits(),
    isolate_tests: bool = True,
) -> Verdict:
    """``run_job`` for one solution given as strings."""
    return run_job(CodeJob(solution, tests, entry_point, context), limits, isolate_tests)


class SandboxPool:
    """Runs jobs with at most ``max_concurrent`` sandboxes at a time (threads driving subprocesses)."""

    def __init__(
        self,
        max_concurrent: int | None = None,
        limits: SandboxLimits = SandboxLimits(),
        isolate_tests: bool = True,
    ) -> None:
        self.limits, self.isolate_tests = limits, isolate_tests
        self._executor = ThreadPoolExecutor(max_workers=max_concurrent or os.cpu_count() or 2)

    def run(self, job: CodeJob) -> Verdict:
        """One verdict."""
        return self.run_many([job])[0]

    def run_many(self, jobs: Sequence[CodeJob], budget_s: float | None = None) -> list[Verdict]:
        """One verdict per job, in order.  ``budget_s``: the wall-clock limit of the whole batch (plus the
        harness's grace): a job gets at most what is left of it when it starts, none once it is spent."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        return list(self._executor.map(lambda j: run_job(j, self.limits, self.isolate_tests, deadline), jobs))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
