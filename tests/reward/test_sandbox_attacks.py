"""More of the sandbox's attack suite (see test_sandbox.py): exceptions of the solution that would steer
the judge's control flow, and kernel keys that would outlive a run.  Every attack runs through the real
sandbox and must score 0 or be denied."""

import errno
import json
import platform
from pathlib import Path

import pytest

from reasonrl.reward._sandbox_os import KEYRING_SYSCALLS
from reasonrl.reward.sandbox import SandboxLimits, run_code

FAST = SandboxLimits(timeout_s=2.0, memory_mb=256, max_processes=8)

# Each passes an honest f(x) = x + 1 and would pass vacuously if a call of f could end the iteration.
FLOW_TESTS = (
    "CASES = [1, 2, 3]\n"
    "def answers():\n    for c in CASES:\n        yield f(c) == c + 1\n"
    "assert all(map(lambda c: f(c) == c + 1, CASES))\n"
    "assert not any(map(lambda c: f(c) != c + 1, CASES))\n"
    "assert next(filter(lambda c: f(c) != c + 1, CASES), None) is None\n"
    "assert min(map(f, CASES), default=2) == 2\n"
    "assert all(answers())\n"
)
FLOW_ENDING = ["StopIteration", "StopAsyncIteration", "SystemExit", "KeyboardInterrupt", "GeneratorExit"]
ORDINARY = ["ValueError", "TypeError", "KeyError", "IndexError", "ZeroDivisionError", "AttributeError"]


def forged_reply(name: str) -> str:
    """A solution that writes the judge a reply frame naming exception ``name`` itself, then exits."""
    frame = json.dumps({"exc": name, "msg": ""})
    return (
        "import os, struct, sys\n"
        f"FRAME = {frame!r}.encode()\n"
        "def f(x):\n"
        "    os.write(int(sys.argv[2]), struct.pack('>I', len(FRAME)) + FRAME)\n"
        "    os._exit(0)\n"
    )


@pytest.mark.parametrize(
    "solution",
    [
        "def f(x):\n    raise StopIteration\n",
        "class StopIteration(Exception):\n    def __eq__(self, other):\n        return True\n"
        "    def __bool__(self):\n        return True\n\ndef f(x):\n    raise StopIteration()\n",
        "def f(x):\n    raise SystemExit(0)\n",
        "def f(x):\n    raise KeyboardInterrupt\n",
        *(forged_reply(name) for name in FLOW_ENDING),
    ],
    ids=["StopIteration", "own-class-named-StopIteration", "SystemExit", "KeyboardInterrupt"]
    + [f"forged-{name}" for name in FLOW_ENDING],
)
def test_an_exception_of_the_solution_cannot_end_the_tests_iteration(solution):
    verdict = run_code(solution, FLOW_TESTS, "f", limits=FAST)
    assert verdict.passed_fraction == 0, verdict.tests
    assert all(t.status == "failed" and "RemoteError" in t.detail for t in verdict.tests), verdict.tests


def test_ordinary_exceptions_keep_their_type_and_the_others_only_say_the_call_raised():
    code = "import builtins\n\ndef f(x):\n    return x + 1\n\ndef fail(kind):\n    raise getattr(builtins, kind)()\n"
    tests = (
        "import unittest\n"
        "def raised(kind):\n    try:\n        fail(kind)\n"
        "    except BaseException as exc:\n        return type(exc).__name__\n"
        f"assert [raised(k) for k in {ORDINARY}] == {ORDINARY}\n"
        f"assert [raised(k) for k in {FLOW_ENDING}] == {['RemoteError'] * len(FLOW_ENDING)}\n"
        "assert unittest.TestCase().assertRaises(KeyError, fail, 'KeyError') is None\n"
    )
    verdict = run_code(code, tests + FLOW_TESTS, limits=FAST)
    assert verdict.passed, verdict.tests  # FLOW_TESTS included: an honest solution passes them


KEYRING_USER = """
import ctypes, errno, mmap, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[platform.machine()]
USER_KEYRING, SESSION_KEYRING, JOIN_SESSION_KEYRING, SETPERM, EVERYONE_ALL = -4, -3, 1, 5, 0x3F3F3F3F
# x86_64 code: push rbx; mov eax, 288 (i386 keyctl); mov ebx, 1 (join session keyring); xor ecx, ecx; int 0x80; pop rbx
I386_JOIN = bytes.fromhex("53b820010000bb0100000031c9cd805bc3")

def syscall(number, *args):
    result = libc.syscall(ctypes.c_long(number), *(a if isinstance(a, bytes) else ctypes.c_long(a) for a in args))
    return 0 if result >= 0 else ctypes.get_errno()

def i386_join():
    # in a child: on a kernel without the i386 ABI the CPU faults, and the call does not exist (ENOSYS)
    pid = os.fork()
    if pid == 0:
        code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        code.write(I386_JOIN)
        result = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()
        os._exit(0 if result >= 0 else -result)
    status = os.waitpid(pid, 0)[1]
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else errno.ENOSYS

def attempts(description):
    '''errno of each way to create or find a key (0: it worked).'''
    name = description.encode()
    found = {
        "add_key": syscall(ADD_KEY, b"user", name, b"secret", 6, USER_KEYRING),
        "request_key": syscall(REQUEST_KEY, b"user", name, 0, SESSION_KEYRING),
        "keyctl": syscall(KEYCTL, JOIN_SESSION_KEYRING, name),
    }
    if platform.machine() == "x86_64":
        found["x32 keyctl"] = syscall(0x40000000 | KEYCTL, JOIN_SESSION_KEYRING, name)
        found["i386 keyctl"] = i386_join()
    return found

def plant(description):
    serial = libc.syscall(ctypes.c_long(ADD_KEY), b"user", description.encode(), b"secret", ctypes.c_long(6),
                          ctypes.c_long(USER_KEYRING))
    if serial > 0:
        libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(SETPERM), ctypes.c_long(serial), ctypes.c_long(EVERYONE_ALL))
    return serial

def visible(description):
    with open("/proc/keys") as keys:
        return [line for line in keys if description in line]
"""
needs_keyring_table = pytest.mark.skipif(
    platform.machine() not in KEYRING_SYSCALLS, reason="no keyring system call numbers for this machine"
)


def host_keys() -> str:
    keys = Path("/proc/keys")
    return keys.read_text() if keys.exists() else ""


@needs_keyring_table
def test_a_run_cannot_create_or_request_kernel_keys(tmp_path):
    description = f"reasonrl-{tmp_path.name}"
    expected = {"add_key": errno.EPERM, "request_key": errno.EPERM, "keyctl": errno.EPERM}
    if platform.machine() == "x86_64":  # other ABIs of the same machine: refused whatever they ask
        expected.update({"x32 keyctl": errno.ENOSYS, "i386 keyctl": errno.ENOSYS})
    verdict = run_code(KEYRING_USER, f"assert attempts({description!r}) == {expected!r}", limits=FAST)
    assert verdict.passed and verdict.isolation["keyrings_denied"], verdict.tests
    assert description not in host_keys()


@needs_keyring_table
def test_a_key_left_by_one_run_is_invisible_to_the_next(tmp_path):
    description = f"reasonrl-{tmp_path.name}"
    run_code(KEYRING_USER, f"assert plant({description!r}) > 0", limits=FAST)
    verdict = run_code(KEYRING_USER, f"assert visible({description!r}) == []", limits=FAST)
    assert verdict.passed, verdict.tests
    assert description not in host_keys()  # nothing of the first run outlived it
