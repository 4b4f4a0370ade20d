"""The sandbox: per-test verdicts decided outside the untrusted process, and the attack suite.

Every attack must be contained and, where it tries to pass tests it does not pass, scored as a
failure.  Attacks that need an isolation layer this machine lacks skip, naming the layer.
"""

import json
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import reasonrl.reward.sandbox as sandbox
from reasonrl.cli import main
from reasonrl.reward.sandbox import CodeJob, SandboxLimits, SandboxPool, run_code
from reasonrl.reward.testcases import split_tests

FAST = SandboxLimits(timeout_s=2.0, memory_mb=256, max_processes=8)
IDENTITY = "def f(x):\n    return x\n"


@pytest.fixture(scope="module")
def layers() -> dict[str, bool]:
    """The isolation layers active on this machine (from a trivial run)."""
    verdict = run_code(IDENTITY, "assert f(1) == 1", "f", limits=FAST)
    assert verdict.passed, verdict
    return verdict.isolation


def needs(layers: dict[str, bool], *names: str) -> None:
    if not any(layers.get(name) for name in names):
        pytest.skip(f"this machine lacks the isolation layer ({' or '.join(names)}) this attack needs")


def processes_with(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(cmdline)
    return found


def test_each_test_case_gets_its_own_verdict():
    verdict = run_code(
        "def add(a, b):\n    return a + b\n",
        "assert add(1, 2) == 3\nassert add(2, 2) == 5\nassert add([1], [2]) == [1, 2]\n",
        "add",
        limits=FAST,
    )
    assert not verdict.passed and verdict.status == "failed"
    assert verdict.passed_fraction == pytest.approx(2 / 3)
    assert [t.status for t in verdict.tests] == ["passed", "failed", "passed"]
    assert verdict.tests[1].detail.startswith("AssertionError")
    assert all(t.ran for t in verdict.tests)
    assert verdict.wall_seconds > 0 and isinstance(verdict.network_isolated, bool)


def test_humaneval_check_is_split_per_assert_and_setup_is_kept():
    tests = (
        "import math\n\ndef check(candidate):\n    base = 10\n    assert candidate(base) == 10\n"
        "    assert True, 'not a test'\n    for i in range(3):\n        assert candidate(i) == i\n"
        "    assert candidate(base + 1) == math.floor(11.5)\n\ncheck(f)\n"
    )
    plan = split_tests(tests)
    assert len(plan.cases) == 3 and "import math" in plan.setup
    assert all("base = 10" in case for case in plan.cases)  # each case keeps the body's setup
    assert (
        split_tests("def check(candidate):\n    assert candidate(1)\n", entry_point="g")
        .cases[0]
        .endswith("__check__(g)")
    )
    with pytest.raises(ValueError, match="no test case"):
        split_tests("x = 1\n")
    verdict = run_code("def f(x):\n    return x if x < 5 else 0\n", tests, "f", limits=FAST)
    assert [t.passed for t in verdict.tests] == [False, True, False]


def test_infinite_loops_time_out_and_a_solution_that_never_loads_fails_every_test():
    limits = SandboxLimits(timeout_s=1.0, memory_mb=256)
    verdict = run_code("def f(x):\n    while True:\n        pass\n", "assert f(1) == 1", "f", limits=limits)
    assert verdict.status == "timeout" and verdict.passed_fraction == 0
    start = time.monotonic()
    verdict = run_code("while True:\n    pass\n", "assert f(1) == 1\nassert f(2) == 2", "f", limits=limits)
    assert [t.status for t in verdict.tests] == ["timeout", "timeout"]
    assert not verdict.tests[1].ran  # not run again: the load failure applies to every test
    assert time.monotonic() - start < 5


def test_fork_bomb_is_contained(layers):
    if os.geteuid() == 0 and not layers.get("unprivileged_uid"):
        pytest.skip("as root without an unprivileged uid, RLIMIT_NPROC is not enforced: no fork bomb here")
    marker = f"7{uuid.uuid4().int % 10**8}.5"
    bomb = (
        "import os\ndef f(x):\n    while True:\n        try:\n            if os.fork() == 0 and os.getpid() % 2:\n"
        f"                os.execvp('sleep', ['sleep', '{marker}'])\n        except OSError:\n            pass\n"
    )
    start = time.monotonic()
    limits = SandboxLimits(timeout_s=1.0, memory_mb=256, max_processes=8)
    verdict = run_code(bomb, "assert f(1) == 1", "f", limits=limits)
    assert not verdict.passed and verdict.status in ("timeout", "crashed")
    assert time.monotonic() - start < 10
    time.sleep(0.2)
    assert processes_with(f"sleep {marker}") == []


def test_memory_bomb_scores_memory():
    verdict = run_code("def f(x):\n    return len('a' * 10**10)\n", "assert f(1) == 10**10", "f", limits=FAST)
    assert verdict.status == "memory" and not verdict.passed
    verdict = run_code("hog = []\nwhile True:\n    hog.append(bytearray(10**6))\n", "assert f(1)", "f", limits=FAST)
    assert verdict.status == "memory"


def test_huge_output_is_capped():
    limits = SandboxLimits(timeout_s=2.0, memory_mb=256, output_limit_bytes=10_000)
    verdict = run_code("def f(x):\n    while True:\n        print('x' * 1000)\n", "assert f(1)", "f", limits=limits)
    assert verdict.status == "output_limit" and not verdict.passed
    assert 0 < len(verdict.output) <= 4096


def test_filling_the_disk_fails():
    limits = SandboxLimits(timeout_s=2.0, memory_mb=256, max_file_mb=1)
    code = "def f(x):\n    with open('big', 'wb') as out:\n        out.write(b'x' * (4 << 20))\n    return x\n"
    verdict = run_code(code, "assert f(1) == 1", "f", limits=limits)
    assert not verdict.passed and "File too large" in verdict.tests[0].detail


def test_writing_outside_the_sandbox_fails(layers, tmp_path):
    needs(layers, "filesystem", "unprivileged_uid", "bwrap")
    target = tmp_path / "written-by-the-solution"
    code = f"def f(x):\n    open({str(target)!r}, 'w').write('pwned')\n    return x\n"
    verdict = run_code(code, "assert f(1) == 1", "f", limits=FAST)
    assert not verdict.passed and not target.exists()


def test_a_secret_outside_the_sandbox_cannot_be_read(layers, tmp_path):
    needs(layers, "filesystem", "unprivileged_uid", "bwrap")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-4242")
    secret.chmod(0o600)
    code = f"def f(x):\n    text = open({str(secret)!r}).read()\n    print(text)\n    return text\n"
    verdict = run_code(code, "assert f(1) == 'TOPSECRET-4242'", "f", limits=FAST)
    assert not verdict.passed and "TOPSECRET" not in json.dumps(verdict.to_dict())


def test_no_network(layers):
    if not layers.get("network"):
        pytest.skip("no network namespace here (unshare --net and bwrap both unavailable): network_isolated is false")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = f"import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).send(b'x')\n"
        verdict = run_code(code + "    return x\n", "assert f(1) == 1", "f", limits=FAST)
        assert not verdict.passed and verdict.network_isolated
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected


def test_killing_the_parent_leaves_the_harness_alive():
    code = "import os\ndef f(x):\n    os.kill(os.getppid(), 9)\n    return x\n"
    verdict = run_code(code, "assert f(1) == 1\nassert f(2) == 2", "f", limits=FAST)
    assert not verdict.passed and verdict.passed_fraction == 0
    assert os.getpid() > 0  # still here


@pytest.mark.parametrize(
    "solution",
    [
        "import sys\nsys.exit(0)\ndef f(x):\n    return 0\n",
        "import os\nos._exit(0)\n",
        "import os\ndef f(x):\n    os._exit(0)\n",
        "import sys\ndef f(x):\n    sys.exit(0)\n",
    ],
    ids=["sys.exit-at-load", "os._exit-at-load", "os._exit-in-call", "sys.exit-in-call"],
)
def test_exiting_before_the_asserts_fails(solution):
    verdict = run_code(solution, "assert f(1) == 1\nassert f(2) == 2", "f", limits=FAST)
    assert not verdict.passed and verdict.passed_fraction == 0


def test_printing_a_fake_success_fails():
    fake = json.dumps({"kind": "test", "index": 0, "status": "passed", "mode": "rpc", "seconds": 0, "detail": ""})
    code = f"print('all tests passed')\nprint({fake!r})\ndef f(x):\n    print({fake!r})\n    return 0\n"
    verdict = run_code(code, "assert f(1) == 1", "f", limits=FAST)
    assert not verdict.passed and "all tests passed" in verdict.output


def test_monkeypatching_builtins_and_always_equal_objects_fail():
    code = (
        "import builtins\n"
        "class Yes:\n    def __eq__(self, other):\n        return True\n    def __bool__(self):\n        return True\n"
        "class YesInt(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "builtins.AssertionError = type('Quiet', (Exception,), {})\n"
        "builtins.__import__ = None\n"
        "def f(x):\n    return Yes()\n"
        "def g(x):\n    return YesInt(0)\n"
    )
    verdict = run_code(code, "assert f(1) == 1\nassert g(1) == 1\nassert f(2)", "f", limits=FAST)
    assert verdict.passed_fraction == 0, verdict.tests


def test_a_solution_cannot_replace_the_builtins_the_tests_use():
    code = "def abs(x):\n    return 0\n\ndef len(x):\n    return 3\n\ndef f(x):\n    return x + 1\n"
    tests = "assert abs(f(1) - 1) < 1e-9\nassert len(str(f(1))) == 3\nassert f(1) == 2\n"
    verdict = run_code(code, tests, "f", limits=FAST)
    assert [t.passed for t in verdict.tests] == [False, False, True]


def test_background_processes_do_not_outlive_the_run():
    marker = f"8{uuid.uuid4().int % 10**8}.5"
    code = (
        "import os, subprocess\n"
        "def f(x):\n"
        f"    subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        f"            os.execvp('sleep', ['sleep', '{marker}'])\n        os._exit(0)\n"
        "    return x\n"
    )
    verdict = run_code(code, "assert f(1) == 1", "f", limits=FAST)
    assert verdict.passed  # it did answer correctly
    time.sleep(0.2)
    assert processes_with(f"sleep {marker}") == []


def test_mutated_arguments_and_exception_types_reach_the_test():
    code = "def sort_in_place(xs):\n    xs.sort()\n\ndef parse(s):\n    return int(s)\n"
    tests = (
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\n"
        "try:\n    parse('x')\n    raised = False\nexcept ValueError:\n    raised = True\nassert raised\n"
        "assert parse('7') == 7\n"
    )
    verdict = run_code(code, tests, limits=FAST)
    assert verdict.passed, verdict.tests


def test_objects_of_the_solution_cross_as_handles_the_test_can_only_pass_back_or_read():
    code = (
        "class Node:\n    def __init__(self, v):\n        self.v, self.left = v, None\n"
        "    def __eq__(self, other):\n        return True\n    def __bool__(self):\n        return True\n"
        "def total(n):\n    return 0 if n is None else n.v + total(n.left)\n"
    )
    tests = (
        "root = Node(3)\nroot.left = Node(4)\nroot.left.left = Node(5)\n"
        "assert total(root) == 12\n"  # handles go back to the solution; its plain answer is compared
        "assert root.left.v == 4\n"  # attributes are read with a round trip
        "assert root.left is root.left\n"  # one handle per object
        "assert root == 12\n"  # its always-true __eq__ never runs here
        "assert root\n"  # nor its __bool__
        "assert [root] == [root.left]\n"
    )
    verdict = run_code(code, tests, limits=FAST)
    assert [t.passed for t in verdict.tests] == [True, True, True, False, False, False], verdict.tests
    assert "OpaqueValueError" in verdict.tests[4].detail


def test_pool_one_process_mode_and_degraded_isolation(monkeypatch):
    jobs = [CodeJob(f"def f(x):\n    return x + {k}\n", "assert f(0) == 0\nassert f(1) == 1", "f") for k in range(4)]
    with SandboxPool(max_concurrent=2, limits=FAST, isolate_tests=False) as pool:
        verdicts = pool.run_many(jobs)
    assert [v.passed for v in verdicts] == [True, False, False, False]
    monkeypatch.setattr(sandbox, "isolation_support", lambda: sandbox.Support("none", os.geteuid() == 0, False))
    verdict = run_code(IDENTITY, "assert f(1) == 1\nassert f(2) == 3", "f", limits=FAST)
    assert not verdict.network_isolated and verdict.isolation["network"] is False
    assert [t.passed for t in verdict.tests] == [True, False]


def test_bwrap_command_gives_a_read_only_root_and_no_network():
    prefix = sandbox._bwrap_prefix("/usr/bin/bwrap", "/tmp/work")
    assert "--unshare-net" in prefix and "--die-with-parent" in prefix
    assert prefix[prefix.index("--ro-bind") + 1 : prefix.index("--ro-bind") + 3] == ["/", "/"]


def test_cli_sandbox_run_prints_the_json_verdict(tmp_path, capsys):
    solution, tests = tmp_path / "solution.py", tmp_path / "tests.py"
    solution.write_text("def add(a, b):\n    return a + b\n")
    tests.write_text("def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n")
    assert main(["sandbox", "run", str(solution), "--tests", str(tests), "--entry-point", "add"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["passed"] and verdict["passed_fraction"] == 1.0 and verdict["status"] == "passed"
    assert {"wall_seconds", "tests", "network_isolated"} <= set(verdict)
    tests.write_text("assert add(1, 2) == 4\n")
    assert main(["sandbox", "run", str(solution), "--tests", str(tests), "--timeout", "2"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "failed"


# --- attacks on the verdict itself: the untrusted side never decides where or how a test runs ---------------


FORGER = """
import gc, json, os, struct, sys
main = sys.modules["__main__"]
def frame(message):
    data = json.dumps(message).encode()
    return struct.pack(">I", len(data)) + data
for name in ("_receive", "encode", "decode", "_answer", "_send"):  # the child's protocol, rewritten
    if hasattr(main, name):
        setattr(main, name, lambda *a, **k: {"ok": True, "done": "x", "status": "passed"})
reply_fd = int(sys.argv[2]) if len(sys.argv) > 2 else 1
for forged in ({"done": "0" * 32}, {"ok": True}, {"unsupported": "x"}, {"kind": "test", "status": "passed"}):
    try:
        os.write(reply_fd, frame(forged))
    except OSError:
        pass
class Anything:
    def __eq__(self, other):
        return True
def f(x):
    leaked = [o for o in gc.get_objects() if isinstance(o, str) and "424242" in o]
    print("LEAKED" if leaked else "nothing to leak", leaked[:3])
    raise NameError("expected")
def g(x):
    return Anything()
"""


def test_a_solution_that_rewrites_the_child_protocol_and_forges_frames_passes_nothing():
    tests = "assert f(1) == 424242\nassert g(1) == 424242\nassert g(2)\nassert f(2) is None\n"
    verdict = run_code(FORGER, tests, "f", limits=FAST)
    assert verdict.passed_fraction == 0, verdict.tests
    assert "424242" not in verdict.output  # the tests' expected values never reach the child


def test_fake_judge_records_printed_through_the_test_code_are_ignored():
    record = {"kind": "test", "index": 0, "status": "passed", "ran": True, "seconds": 0, "detail": ""}
    code = (
        f"RECORDS = {json.dumps(json.dumps(record) + chr(10) + json.dumps({'kind': 'end', 'rlimits': True}))}\n"
        "def f(x):\n    return RECORDS\n"
    )
    tests = "print(f(1))\nimport sys\nsys.stderr.write(f(1))\nassert f(1) == 'the answer'\n"
    verdict = run_code(code, tests, "f", limits=FAST)
    assert not verdict.passed and verdict.tests[0].status == "failed"


COLLIDING = """
import json, os, struct, sys
M = (1 << 61) - 1  # every multiple of it hashes to 0
def reply(value):
    data = json.dumps({"ok": value, "mutated": []}).encode()
    os.write(int(sys.argv[2]), struct.pack(">I", len(data)) + data)
    os._exit(0)
def as_set(x):
    reply({"S": [k * M for k in range(40000)]})
def as_dict(x):
    reply({"D": [[k * M, 0] for k in range(40000)]})
def huge(x):
    reply("x" * (3 << 20))
"""


@pytest.mark.parametrize("call", ["as_set(1)", "as_dict(1)", "huge(1)"])
def test_crafted_replies_cannot_stall_or_grow_the_judge(call):
    start = time.monotonic()
    verdict = run_code(COLLIDING, f"assert {call} == 1", limits=FAST)
    assert not verdict.passed and verdict.status == "error", verdict
    assert "hash" in verdict.detail or "message limit" in verdict.detail
    assert time.monotonic() - start < 5  # refused before any quadratic work


def test_a_judge_stalled_in_c_is_killed_and_its_records_do_not_count():
    code = "M = (1 << 61) - 1\ndef f(x):\n    return [k * M for k in range(35000)]\n"
    tests = "assert f(0) == []\nassert len(set(f(0))) == 35000\n"  # set() of colliding ints: quadratic, in C
    start = time.monotonic()
    verdict = run_code(code, tests, limits=SandboxLimits(timeout_s=1.0, total_timeout_s=1.0, memory_mb=256))
    assert time.monotonic() - start < 1.0 + sandbox.GRACE_S + 2
    assert not verdict.passed and verdict.passed_fraction == 0 and not any(t.ran for t in verdict.tests)
    assert "time limit" in verdict.detail or "judge" in verdict.detail


def test_killing_the_harness_kills_the_sandbox_and_its_scratch_is_removed_later(tmp_path):
    marker = f"9{uuid.uuid4().int % 10**8}.5"
    solution = f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\ndef f(x):\n    time.sleep(60)\n"
    script = tmp_path / "harness.py"
    script.write_text(
        "from reasonrl.reward.sandbox import SandboxLimits, run_code\n"
        f"run_code({solution!r}, 'assert f(1) == 1', 'f', limits=SandboxLimits(timeout_s=60, total_timeout_s=60))\n"
    )
    harness = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 20
    while not processes_with(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(f"sleep {marker}"), "the sandbox did not start"
    scratch = list(Path(tempfile.gettempdir()).glob(f"{sandbox.SCRATCH_PREFIX}{harness.pid}-*"))
    harness.kill()  # as the scoring pool kills a worker that passed its timeout
    harness.wait()
    deadline = time.monotonic() + 5
    while processes_with(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(f"sleep {marker}") == []
    assert scratch and all(p.exists() for p in scratch)  # the killed harness could not clean up ...
    sandbox._remove_stale_scratch.cache_clear()
    sandbox._remove_stale_scratch()
    assert not any(p.exists() for p in scratch)  # ... the next run in another process does


def test_system_v_shared_memory_is_capped_by_the_memory_limit(layers):
    needs(layers, "ipc_limits")
    code = (  # an honest reproducer: it reports how much shared memory outlives its own address space
        "import ctypes\n"
        "def held_mib(mib):\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    libc.shmat.restype = ctypes.c_void_p\n"
        "    for _ in range(mib // 64):\n"
        "        sid = libc.shmget(0, 64 << 20, 0o1600)\n"
        "        address = libc.shmat(sid, None, 0) if sid >= 0 else None\n"
        "        if address in (None, ctypes.c_void_p(-1).value):\n            break\n"
        "        ctypes.memset(address, 1, 64 << 20)\n"
        "        libc.shmdt(ctypes.c_void_p(address))  # detached: RLIMIT_AS no longer counts it\n"
        "    rows = open('/proc/sysvipc/shm').read().splitlines()[1:]\n"
        "    return sum(int(row.split()[3]) for row in rows) >> 20\n"
    )
    limits = SandboxLimits(timeout_s=15.0, memory_mb=256)  # generous: filling 512 MiB is slow on a loaded machine
    verdict = run_code(code, "assert held_mib(512) == 0", limits=limits)  # twice the memory limit
    assert verdict.passed, verdict.tests


def test_site_packages_and_the_project_are_not_visible_inside(layers):
    needs(layers, "filesystem")
    purelib = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})["purelib"]
    code = (
        "import os\n"
        "def listing(path):\n    return sorted(os.listdir(path)) if os.path.isdir(path) else []\n"
        "def exists(path):\n    return os.path.exists(path)\n"
    )
    tests = f"assert listing({purelib!r}) == []\nassert not exists({sandbox.__file__!r})\n"
    verdict = run_code(code, tests, limits=FAST)
    assert verdict.passed, verdict.tests


def test_files_do_not_persist_from_one_test_to_the_next():
    code = (
        "import os\n"
        "def first_visit():\n"
        "    seen = [os.path.exists(p) for p in ('mark', '/tmp/mark', '/dev/shm/mark')]\n"
        "    for p in ('mark', '/tmp/mark', '/dev/shm/mark'):\n"
        "        try:\n            open(p, 'w').write('x')\n        except OSError:\n            pass\n"
        "    return not any(seen)\n"
    )
    verdict = run_code(code, "assert first_visit()\nassert first_visit()\nassert first_visit()\n", limits=FAST)
    assert verdict.passed, verdict.tests


def test_built_in_types_cross_by_name_and_standard_modules_come_from_the_judge():
    code = (
        "import sys\n"
        "def drop(values, kind):\n    return [v for v in values if not isinstance(v, kind)]\n"
        "def size(t):\n    return sys.getsizeof(t)\n"
        "def kind_of(v):\n    return type(v)\n"
        "LIMIT = 10\n"
        "def under(x):\n    return x < LIMIT\n"
    )
    tests = (
        "assert drop((1, 2.5, 'a'), int) == [2.5, 'a']\n"
        "assert size((1, 2)) == sys.getsizeof((1, 2))\n"  # sys: only the solution imported it
        "assert kind_of(1.5) is float\n"
        "assert LIMIT == 10 and under(3)\n"  # a constant of the solution the test names
    )
    verdict = run_code(code, tests, limits=FAST)
    assert verdict.passed, verdict.tests
