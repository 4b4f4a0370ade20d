"""Inside the sandbox, the untrusted side: it runs the solution and answers the judge's requests.

The judge (``_sandbox_judge.py``) starts it as ``python -I -S _sandbox_child.py REQ_FD RESP_FD LIMITS``
under the sandbox's unprivileged uid.  It sets its resource limits, runs the task context and the
solution, then serves requests on REQ_FD until the judge closes it:

* ``call``: call a function of the solution (by global name, or an object handle) with encoded
  arguments and send back the encoded result (and the new value of any list/dict/set argument the
  call mutated);
* ``getattr`` / ``setattr``: read or write an attribute of an object handle (``root.left = Node(2)``);
* ``get``: the value of a global of the solution that the test names (a constant, a module-level list).

Values cross as plain data (None, bool, int, float, complex, str, bytes, bytearray and containers of
them, built-in types by name) or as opaque handles ``{"H": n}`` for any other object, which the judge
can only hand back, call, or read attributes of; it never compares or truth-tests one.  Nothing this
process says is trusted: it only supplies values that the judge compares.  The test's source and
expected values never reach it.  This module also holds the value codec the judge imports.
Standard library only: it runs with ``-I -S`` inside the sandbox's read-only root.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import struct
import sys

HEADER = struct.Struct(">I")
MAX_DEPTH = 100
MAX_ITEMS = 1 << 18  # values in one decoded message
MAX_COLLISIONS = 64  # set items / dict keys sharing one hash value (an int-hash collision attack)
BUILTIN_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bytearray, bool, list, tuple, dict, set)}
BUILTIN_TYPES.update({t.__name__: t for t in (frozenset, object, type, range, slice)})


class Unencodable(Exception):
    """A value that is neither plain data nor allowed to cross as a handle."""


class ProtocolError(Exception):
    """A malformed message or value from the other side."""


def encode(value, refs=None, depth=0):
    """``value`` as JSON-able data: scalars as themselves, containers as one-key tagged objects.

    Subclasses of the plain types are encoded as their base type (so an ``int`` subclass with an
    always-true ``__eq__`` arrives as its integer value).  ``refs(value)`` may return a tag and a
    name for a value the other side resolves (``{"R": name}`` a solution function,
    ``{"H": n}`` an object handle); without it such a value raises ``Unencodable``.
    """
    if value is None or value is True or value is False:
        return value
    kind = type(value)
    if kind is int or kind is float or kind is str:
        return value
    if depth > MAX_DEPTH:
        raise Unencodable(f"nesting deeper than {MAX_DEPTH}")
    if refs is not None:
        ref = refs(value)
        if ref is not None:
            return {ref[0]: ref[1]}
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
    if kind is type and BUILTIN_TYPES.get(value.__name__) is value:
        return {"Y": value.__name__}
    raise Unencodable(f"a {type(value).__name__} object is not plain data")


class _Budget:
    """Counts the values one message decodes into (a cap on work and memory, not only on bytes)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_ITEMS

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise ProtocolError(f"a message holds more than {MAX_ITEMS} values")


def _hashed(items: list) -> list:
    """``items`` if they can go into a set or dict cheaply: many equal hashes would make that quadratic."""
    counts: dict[int, int] = {}
    for item in items:
        h = hash(item)  # TypeError for an unhashable item
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_COLLISIONS:
            raise ProtocolError("too many set items or dict keys share a hash value")
    return items


def decode(data, resolve=None, depth=0, budget=None):
    """The value of encoded ``data``; ``resolve(tag, name)`` turns ``{"R"|"H": name}`` into an object."""
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if depth > MAX_DEPTH + 1 or kind is not dict or len(data) != 1:
        raise ProtocolError("malformed value")
    budget = budget or _Budget()
    ((tag, value),) = data.items()
    try:
        if tag in ("L", "T", "S", "F"):
            if type(value) is not list:
                raise ProtocolError("container payload is not a list")
            budget.take(len(value))
            items = [decode(v, resolve, depth + 1, budget) for v in value]
            if tag == "L":
                return items
            return tuple(items) if tag == "T" else (set if tag == "S" else frozenset)(_hashed(items))
        if tag == "D":
            if type(value) is not list or any(type(p) is not list or len(p) != 2 for p in value):
                raise ProtocolError("malformed dict")
            budget.take(2 * len(value))
            pairs = [(decode(k, resolve, depth + 1, budget), decode(v, resolve, depth + 1, budget)) for k, v in value]
            _hashed([k for k, _ in pairs])
            return dict(pairs)
        if tag in ("B", "BA") and type(value) is str:
            return (bytes if tag == "B" else bytearray).fromhex(value)
        if tag == "C" and type(value) is list and len(value) == 2 and all(type(v) in (int, float) for v in value):
            return complex(value[0], value[1])
        if tag == "Y" and type(value) is str and value in BUILTIN_TYPES:
            return BUILTIN_TYPES[value]
        if tag in ("R", "H") and type(value) in (str, int) and resolve is not None:
            return resolve(tag, value)
    except (TypeError, ValueError, OverflowError) as exc:  # an unhashable key or set item, bad hex
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


class Objects:
    """The solution's namespace and the objects it handed out as handles, as the codec sees them."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace
        self.functions = {id(v): k for k, v in namespace.items() if callable(v) and not k.startswith("__")}
        self.handles: list = []
        self.handle_of: dict[int, int] = {}

    def refs(self, value):
        """A name for a solution function, else a handle for an object that is not plain data."""
        name = self.functions.get(id(value))
        if name is not None and self.namespace.get(name) is value:
            return "R", name
        if _is_plain(value):
            return None
        index = self.handle_of.get(id(value))
        if index is None:
            index = self.handle_of[id(value)] = len(self.handles)
            self.handles.append(value)  # kept alive, so its id is never reused
        return "H", index

    def resolve(self, tag: str, name):
        if tag == "R" and type(name) is str and name in self.namespace:
            return self.namespace[name]
        if tag == "H" and type(name) is int and 0 <= name < len(self.handles):
            return self.handles[name]
        raise ProtocolError("unknown reference")


def _is_plain(value) -> bool:
    plain = (int, float, str, complex, bytes, bytearray, list, tuple, dict, set, frozenset)
    return value is None or isinstance(value, plain) or BUILTIN_TYPES.get(getattr(value, "__name__", None)) is value


def _answer(request: dict, objects: Objects):
    """The reply to one request (the solution's own exceptions propagate to the caller)."""

    def arg(data):
        return decode(data, objects.resolve)

    op = request["op"]
    if op == "call":
        target = arg(request["target"])
        args = [arg(a) for a in request["args"]]
        kwargs = {str(k): arg(v) for k, v in request["kwargs"].items()}
        result = target(*args, **kwargs)
        reply = {"ok": encode(result, objects.refs), "mutated": []}
        for index, value in enumerate(args):
            if isinstance(value, (list, dict, set, bytearray)):
                after = encode(value, objects.refs)
                if after != request["args"][index]:
                    reply["mutated"].append([index, after])
        return reply
    if op == "getattr":
        return {"ok": encode(getattr(arg(request["target"]), str(request["name"])), objects.refs)}
    if op == "setattr":
        setattr(arg(request["target"]), str(request["name"]), arg(request["value"]))
        return {"ok": None}
    if op == "get":
        return {"ok": encode(objects.namespace[str(request["name"])], objects.refs)}
    raise ProtocolError(f"unknown request {op!r}")


def serve(req_fd: int, resp_fd: int, limits: dict) -> None:
    import signal

    failed = _set_limits(limits)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails with EFBIG instead of killing
    sys.set_int_max_str_digits(0)
    init = _receive(req_fd)
    if init is None:
        return
    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        for part, label in ((init["context"], "<context>"), (init["solution"], "<solution>")):
            if part:
                exec(compile(part, label, "exec"), namespace)  # the untrusted code runs here
    except BaseException as exc:
        _send(resp_fd, {"load_error": _describe(exc), "rlimits_failed": failed})
        return
    names = {}
    for key, value in list(namespace.items())[:10000]:
        if not key.startswith("__"):
            names[key] = "module" if type(value).__name__ == "module" else "callable" if callable(value) else "data"
    _send(resp_fd, {"ready": names, "rlimits_failed": failed})
    objects = Objects(namespace)
    while True:
        request = _receive(req_fd)
        if request is None:
            return
        try:
            reply = _answer(request, objects)
        except Unencodable as exc:
            reply = {"exc": "TypeError", "msg": f"the solution returned a value that cannot cross: {exc}"}
        except BaseException as exc:  # the solution's exception is the answer
            reply = _describe(exc)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        _send(resp_fd, reply)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
