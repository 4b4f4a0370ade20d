"""Inside the sandbox: the operating-system layers the judge builds before it runs anything untrusted.

As root inside the new mount namespace: a tmpfs root holding read-only, nosuid, nodev binds of
the interpreter and the system libraries (with every site-packages directory covered by an empty
one), a few /dev nodes, /proc (hidepid=2), world-writable /tmp and /dev/shm on the same
size-limited tmpfs, and /work owned by the sandbox uid; then chroot.  As root inside the new IPC
namespace: System V shared memory and message queues capped at the run's memory limit (they are
not covered by RLIMIT_AS).  A seccomp filter that denies the kernel keyring system calls (keys are not
namespaced: they would outlive the run and be visible to others).  And the process sweep that kills
whatever the solution started, and the wipe of the scratch directories between tests.  Standard
library only (the judge loads this file by path; it runs with ``-I -S``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 22, 36, 38
DEVICES = ("null", "zero", "full", "random", "urandom")
SECCOMP_MODE_FILTER, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 2, 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
EPERM, ENOSYS, X32_SYSCALL_BIT = 1, 38, 0x40000000
# machine: (its audit architecture, the numbers of add_key, request_key and keyctl)
KEYRING_SYSCALLS = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}


# --- the filesystem view -------------------------------------------------------------------------------------


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _bind(libc, root: str, path: str, done: set[str]) -> None:
    if path in done or any(path.startswith(d + "/") for d in done) or not os.path.lexists(path):
        return
    done.add(path)
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(path):  # e.g. /lib -> usr/lib: the same link, and its target bound too
        os.symlink(os.readlink(path), target)
        _bind(libc, root, os.path.realpath(path), done)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "a").close()
    _mount(libc, path, target, None, MS_BIND | MS_REC)
    _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _cover(libc, root: str, path: str) -> bool:
    """Hide a bound directory (site-packages) under an empty read-only tmpfs; False if it is not there."""
    target = root + path
    if not os.path.isdir(target):
        return False
    _mount(libc, "tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=1,mode=555")
    return True


def build_root(job: dict, uid: int | None, child_source: str) -> None:
    """A tmpfs root holding read-only binds of ``job["binds"]``, /dev nodes, /proc, /tmp and /work; chroot into it."""
    libc, root = _libc(), job["rootfs"]
    os.umask(0o022)
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    size = f"size={job['limits']['disk_mb']}m,nr_inodes=16384,mode=755"
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, size)
    done: set[str] = set()
    for path in job["binds"]:
        _bind(libc, root, path, done)
    for path in job["hidden"]:
        _cover(libc, root, path)
    os.makedirs(root + "/dev")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"{root}/dev/{name}", "a").close()
            _mount(libc, f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "fd/0"), ("stdout", "fd/1"), ("stderr", "fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    for shared in ("/tmp", "/dev/shm"):
        os.makedirs(root + shared, exist_ok=True)
        os.chmod(root + shared, 0o1777)
    os.makedirs(root + "/work", mode=0o700)
    os.makedirs(root + "/proc")
    try:  # hidepid: the untrusted uid sees only its own processes, not the judge
        _mount(libc, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV, "hidepid=2")
    except OSError:
        _mount(libc, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV)
    os.makedirs(root + "/sandbox")
    with open(root + "/sandbox/child.py", "w") as handle:
        handle.write(child_source)
    if uid is not None:
        os.chown(root + "/work", uid, uid)
    os.chroot(root)
    os.chdir("/")


def _world_usable(path: str) -> bool:
    """Whether any uid may execute ``path`` (every directory on the way searchable by others)."""
    path = os.path.realpath(path)
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        try:
            mode = os.stat("/".join(parts[:i]) or "/").st_mode
        except OSError:
            return False
        if not mode & 0o001 or (i == len(parts) and not mode & 0o004):
            return False
    return True


def limit_ipc(memory_mb: int) -> bool:
    """Cap System V IPC in this IPC namespace: shared memory at ``memory_mb`` in all, segments removed
    when their last user goes, small message queues.  False if this process may not (not root here)."""
    settings = {
        "kernel/shmmax": memory_mb << 20,
        "kernel/shmall": (memory_mb << 20) // os.sysconf("SC_PAGE_SIZE"),
        "kernel/shmmni": 32,
        "kernel/shm_rmid_forced": 1,
        "kernel/msgmnb": 1 << 16,
        "kernel/msgmni": 32,
    }
    try:
        for name, value in settings.items():
            with open(f"/proc/sys/{name}", "w") as handle:
                handle.write(str(value))
    except OSError:
        return False
    return True


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def keyring_filter(arch: int, numbers: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """A seccomp program (code, jump if true, jump if false, k): EPERM for the system calls ``numbers``,
    ENOSYS for any call through another ABI of the machine (i386's ``int 0x80``, x32), which numbers
    its calls differently, and the rest allowed.  A jump counts instructions from the one after it."""
    allow = 4 + len(numbers)  # the four loads and checks before the number tests, then the returns
    eperm, enosys = allow + 1, allow + 2
    return [
        (BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (BPF_JEQ_K, 0, enosys - 2, arch),
        (BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (BPF_JGE_K, enosys - 4, 0, X32_SYSCALL_BIT),
        *((BPF_JEQ_K, eperm - 5 - i, 0, number) for i, number in enumerate(numbers)),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
    ]


def deny_keyrings(libc) -> bool:
    """Deny this process and all it starts the kernel keyring system calls (add_key, request_key,
    keyctl), which fail with EPERM: keyrings are not namespaced, so a key would outlive the run,
    stay charged to its uid and be readable by later runs.  False on a machine without the table."""
    machine = os.uname().machine
    if machine not in KEYRING_SYSCALLS or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    program = keyring_filter(*KEYRING_SYSCALLS[machine])
    instructions = (_SockFilter * len(program))(*program)
    fprog = _SockFprog(len(program), instructions)
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


def isolate(job: dict) -> tuple[dict, int | None, str, str, list[str]]:
    """Build what this process can: (isolation report, child uid, workdir, child script path, scratch dirs)."""
    libc = ctypes.CDLL(None, use_errno=True)
    iso = {"pid_namespace": os.getpid() == 1, "no_new_privs": libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0}
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of the solution come back here to be killed
    iso["keyrings_denied"] = deny_keyrings(libc)  # after no_new_privs, which an unprivileged filter needs
    with open(job["child_path"]) as handle:
        child_source = handle.read()
    root = os.geteuid() == 0
    uid, workdir, child_path = None, job["workdir"], job["child_path"]
    iso["ipc_limits"] = root and job["ipc_namespace"] and limit_ipc(job["limits"]["memory_mb"])
    iso["filesystem"] = False
    if root and job.get("rootfs"):
        try:
            build_root(job, job["uid"], child_source)
            iso["filesystem"], workdir, child_path = True, "/work", "/sandbox/child.py"
        except OSError as exc:
            iso["filesystem_error"] = str(exc)
    if root and job.get("uid") is not None and (iso["filesystem"] or _world_usable(job["python"])):
        uid = job["uid"]
        if not iso["filesystem"]:
            os.chown(workdir, uid, uid)
    iso["unprivileged_uid"] = uid is not None
    scratch = ["/work", "/tmp", "/dev/shm"] if iso["filesystem"] else [workdir]
    return iso, uid, workdir, child_path, scratch


def wipe(directories: list[str]) -> None:
    """Empty the scratch directories (what one test's program wrote is gone before the next test)."""
    for directory in directories:
        with contextlib.suppress(OSError):
            for entry in os.scandir(directory):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


# --- processes -------------------------------------------------------------------------------------


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as handle:
                    for line in handle:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) == uid:
                                found.append(int(entry))
                            break
            except (OSError, ValueError):
                continue
    return found


def _descendants() -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [os.getpid()]
    while stack:
        for pid in children.get(stack.pop(), []):
            found.append(pid)
            stack.append(pid)
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_all(uid: int | None) -> None:
    """Kill every process the solution left: all of the sandbox uid, or (without one) all descendants."""
    for _ in range(100):
        pids = _processes_of(uid) if uid is not None else _descendants()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)
        _reap()
