"""Inside the sandbox, the untrusted side: it runs the solution and answers the judge's calls.

The judge (``_sandbox_judge.py``) starts it as ``python -I -S _sandbox_child.py REQ_FD RESP_FD LIMITS``
under the sandbox's unprivileged uid.  It sets its resource limits, runs the task context and the
solution, then serves requests on REQ_FD until the judge closes it:

* ``call``: call a top-level function of the solution with plain-data arguments and send back the
  plain-data result (and the new value of any list/dict/set argument the call mutated);
* ``inprocess``: run a test snippet here, against the solution's namespace (the fallback for tests
  that pass objects a pipe cannot carry); the judge counts it only if the reply echoes its nonce.

Nothing this process says is trusted: in ``call`` mode it only supplies values that the judge
compares; see docs/sandbox.md.  This module also holds the value codec the judge imports.
Standard library only: it runs with ``-I -S`` inside the sandbox's read-only root.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys

HEADER = struct.Struct(">I")
MAX_DEPTH = 100


class Unencodable(Exception):
    """A value that is not plain data (None, bool, int, float, complex, str, bytes and containers of them)."""


class ProtocolError(Exception):
    """A malformed message or value from the other side."""


def encode(value, refs=None, depth=0):
    """``value`` as JSON-able data: scalars as themselves, containers as one-key tagged objects.

    Subclasses of the plain types are encoded as their base type (so an ``int`` subclass with an
    always-true ``__eq__`` arrives as its integer value); ``refs(value)`` may name a value that the
    other side can resolve by name (a function of the solution).
    """
    if value is None or value is True or value is False:
        return value
    kind = type(value)
    if kind is int or kind is float or kind is str:
        return value
    if depth > MAX_DEPTH:
        raise Unencodable(f"nesting deeper than {MAX_DEPTH}")
    if refs is not None:
        name = refs(value)
        if name is not None:
            return {"R": name}
    inner = depth + 1
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, complex):
        return {"C": [float(complex.real.__get__(value)), float(complex.imag.__get__(value))]}
    if isinstance(value, bytes):
        return {"B": bytes.hex(value)}
    if isinstance(value, bytearray):
        return {"BA": bytearray.hex(value)}
    if isinstance(value, list):
        return {"L": [encode(v, refs, inner) for v in list.__iter__(value)]}
    if isinstance(value, tuple):
        return {"T": [encode(v, refs, inner) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"D": [[encode(k, refs, inner), encode(v, refs, inner)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"F": [encode(v, refs, inner) for v in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"S": [encode(v, refs, inner) for v in set.__iter__(value)]}
    raise Unencodable(f"a {type(value).__name__} object is not plain data")


def _items(value, depth, resolve):
    if type(value) is not list:
        raise ProtocolError("container payload is not a list")
    return [decode(v, resolve, depth + 1) for v in value]


def decode(data, resolve=None, depth=0):
    """The plain value of encoded ``data``; ``resolve(name)`` turns a ``{"R": name}`` reference into an object."""
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if depth > MAX_DEPTH + 1 or kind is not dict or len(data) != 1:
        raise ProtocolError("malformed value")
    ((tag, value),) = data.items()
    try:
        if tag == "L":
            return _items(value, depth, resolve)
        if tag == "T":
            return tuple(_items(value, depth, resolve))
        if tag == "S":
            return set(_items(value, depth, resolve))
        if tag == "F":
            return frozenset(_items(value, depth, resolve))
        if tag == "D":
            if type(value) is not list or any(type(p) is not list or len(p) != 2 for p in value):
                raise ProtocolError("malformed dict")
            return {decode(k, resolve, depth + 1): decode(v, resolve, depth + 1) for k, v in value}
        if tag in ("B", "BA") and type(value) is str:
            return (bytes if tag == "B" else bytearray).fromhex(value)
        if tag == "C" and type(value) is list and len(value) == 2 and all(type(v) in (int, float) for v in value):
            return complex(value[0], value[1])
        if tag == "R" and type(value) is str and resolve is not None:
            return resolve(value)
    except (TypeError, ValueError) as exc:  # an unhashable key or set item, bad hex
        raise ProtocolError(f"malformed value: {exc}") from None
    raise ProtocolError(f"unknown value tag {tag!r}")


def frame(message) -> bytes:
    """A message as a length-prefixed JSON frame."""
    data = json.dumps(message, separators=(",", ":")).encode("ascii")
    return HEADER.pack(len(data)) + data


def _read_exactly(fd: int, count: int) -> bytes | None:
    chunks, got = [], 0
    while got < count:
        chunk = os.read(fd, count - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _receive(fd: int):
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    body = _read_exactly(fd, HEADER.unpack(header)[0])
    return None if body is None else json.loads(body)


def _send(fd: int, message) -> None:
    data = frame(message)
    while data:
        data = data[os.write(fd, data) :]


def _describe(exc: BaseException) -> dict:
    try:
        text = str(exc)[:500]
    except BaseException:  # a hostile __str__
        text = "<unprintable>"
    return {"exc": type(exc).__name__, "msg": text, "memory": isinstance(exc, MemoryError)}


def _set_limits(limits: dict) -> list[str]:
    import resource

    failed = []
    for name, value in limits.items():
        try:
            resource.setrlimit(getattr(resource, name), (value, value) if name != "RLIMIT_CPU" else (value, value + 1))
        except (OSError, ValueError, AttributeError):
            failed.append(name)
    return failed


def _hardening():
    """The comparison and truth helpers that in-process test snippets call (see testcases.harden_asserts).

    Built before the solution runs, so they hold the original operator functions and AssertionError."""
    import operator

    failure = AssertionError

    ops = {
        "Eq": operator.eq,
        "NotEq": operator.ne,
        "Lt": operator.lt,
        "LtE": operator.le,
        "Gt": operator.gt,
        "GtE": operator.ge,
        "In": lambda a, b: a in b,
        "NotIn": lambda a, b: a not in b,
    }

    def plain(value):
        try:
            return decode(encode(value))
        except Unencodable:
            raise failure(f"a test compared a non-plain {type(value).__name__} object") from None

    def compare(operands, names):
        left = operands[0]
        for name, right in zip(names, operands[1:], strict=True):
            if name == "Is":
                ok = left is right
            elif name == "IsNot":
                ok = left is not right
            else:
                ok = ops[name](plain(left), plain(right))
            if ok is not True and ok is not False:
                ok = bool(plain(ok))
            if not ok:
                return False
            left = right
        return True

    def truth(value):
        return bool(plain(value))

    return compare, truth


def serve(req_fd: int, resp_fd: int, limits: dict) -> None:
    import builtins
    import signal

    failed = _set_limits(limits)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails with EFBIG instead of killing
    sys.set_int_max_str_digits(0)
    init = _receive(req_fd)
    if init is None:
        return
    pristine = dict(builtins.__dict__)
    compare, truth = _hardening()
    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        for part, label in ((init["context"], "<context>"), (init["solution"], "<solution>")):
            if part:
                exec(compile(part, label, "exec"), namespace)  # the untrusted code runs here
    except BaseException as exc:
        _send(resp_fd, {"load_error": _describe(exc), "rlimits_failed": failed})
        return
    names, by_id = {}, {}
    for key, value in list(namespace.items())[:10000]:
        if key.startswith("__"):
            continue
        names[key] = "module" if type(value).__name__ == "module" else "callable" if callable(value) else "data"
        if callable(value):
            by_id.setdefault(id(value), key)
    _send(resp_fd, {"ready": names, "rlimits_failed": failed})

    def refs(value):
        name = by_id.get(id(value))
        return name if name is not None and namespace.get(name) is value else None

    while True:
        request = _receive(req_fd)
        if request is None:
            return
        try:
            if request["op"] == "call":
                args = [decode(a, namespace.__getitem__) for a in request["args"]]
                kwargs = {k: decode(v, namespace.__getitem__) for k, v in request["kwargs"].items()}
                result = namespace[request["name"]](*args, **kwargs)
                reply = {"ok": encode(result, refs)}
                changed = []
                for index, arg in enumerate(args):
                    if isinstance(arg, (list, dict, set, bytearray)):
                        after = encode(arg, refs)
                        if after != request["args"][index]:
                            changed.append([index, after])
                reply["mutated"] = changed
            else:  # inprocess
                entry = init.get("entry_point")
                scope = {k: v for k, v in namespace.items() if k == entry or k not in pristine}  # no fake abs()
                scope.update(__builtins__=pristine, __rr_cmp__=compare, __rr_truth__=truth)
                for part, label in ((request["setup"], "<test setup>"), (request["test"], "<test>")):
                    exec(compile(part, label, "exec"), scope)
                reply = {"done": request["nonce"]}
        except Unencodable as exc:
            reply = {"unsupported": str(exc)}
        except BaseException as exc:  # the solution's exception is the answer
            reply = _describe(exc)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        _send(resp_fd, reply)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
