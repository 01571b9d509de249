"""Versioned msgpack envelopes for payloads, results and errors.

A payload is one of three kinds::

    {"v": 1, "kind": "pickle", "fn": <sha256 of the function body>, "args": <cloudpickle
     of (args, kwargs)>, "name": "square", "py": "3.11", "proto": 5}
    {"v": 1, "kind": "ref", "target": "package.module:function", "args": [...],
     "kwargs": {...}}                      # msgpack values only: any language can submit
    {"v": 1, "kind": "exec", "cmd": "python train.py" | ["argv", ...], "env": {...},
     "cwd": "dir" | None}

A pickled function body is content-addressed: it travels once per plane as a blob
named by its digest, and workers cache what they loaded by digest.

A result is ``{"v": 1, "kind": "pickle" | "msgpack", "data": ...}``; ``ref`` calls answer
in msgpack when the value allows it, so a curl producer can read them. An error is a
plain dict: ``{"type", "message", "traceback", "pickled"}``.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import pickle
import re
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import msgpack

from .errors import BY_CODE, InvalidRequest, LakeshoreError, RemoteError, SerializationError

__all__ = [
    "PICKLE_PROTOCOL",
    "WIRE_VERSION",
    "EncodedCall",
    "decode_error",
    "decode_payload",
    "decode_result",
    "clipped",
    "encode_error",
    "encode_exec",
    "encode_manifest",
    "encode_pickle_call",
    "encode_ref_call",
    "encode_result",
    "pack",
    "result_blob",
    "verified",
    "unpack",
]

#: version of every envelope this module writes; readers refuse others
WIRE_VERSION = 1
#: cloudpickle protocol pinned on both sides (5 loads on every supported Python)
PICKLE_PROTOCOL = 5
#: decode limits so a small body cannot allocate gigabytes
_MAX_BUFFER = 64 * 1024 * 1024

_OWN_PREFIX = "dreamlake.lakeshore."
#: Lakeshore's own error classes by name, for errors the plane itself records
BY_CODE_NAME: dict[str, type[LakeshoreError]] = {
    c.__name__: c for c in BY_CODE.values() if c is not RemoteError
}

#: bytes of pickled arguments or of a result kept inline; larger ones travel as blobs
DEFAULT_INLINE_LIMIT = 256 * 1024

PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def pack(obj: Any) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def unpack(data: bytes) -> Any:
    """Decode msgpack; malformed input is :class:`InvalidRequest`.

    ``unpackb`` bounds every string, array and map by the input's own length, so a
    small body cannot claim a huge allocation; the input itself is capped too.
    """
    if len(data) > _MAX_BUFFER:
        raise InvalidRequest(f"body of {len(data)} bytes is over the {_MAX_BUFFER} byte limit")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise InvalidRequest(f"malformed msgpack: {exc}") from None


@dataclass(frozen=True)
class EncodedCall:
    """A payload ready to submit, plus the blobs it references (digest → bytes)."""

    payload: bytes
    blobs: dict[str, bytes] = field(default_factory=dict)
    #: keyword arguments, when the plane may read them (ref calls), else those the
    #: caller chose to expose (the priority field of a priority queue)
    kwargs: dict[str, Any] = field(default_factory=dict)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fn_name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


#: types that :mod:`pickle` writes to the same bytes as cloudpickle (nothing by value)
_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})


#: bytes of one value from which a pickler writes its data past its own buffer (its frame
#: size target), to a file handed the value itself: see _pickle_once
_STREAMED = 64 * 1024


class _Parts:
    """A pickler's file that keeps each piece it is given, in order: ``bytes`` as they
    are, anything else (a ``bytearray``, a buffer's view) copied as it comes, so a value
    changed later in the dump (by another object's ``__reduce__``, another thread)
    cannot leave its length, written already, out of step with its bytes."""

    __slots__ = ("_parts",)

    def __init__(self, parts: list[Any]) -> None:
        self._parts = parts

    def write(self, data: Any) -> None:
        self._parts.append(data if type(data) is bytes else bytes(data))


def _pickle_once(value: Any, pickler: type[pickle.Pickler]) -> bytes:
    """The bytes ``dumps`` makes of ``value`` with ``pickler`` (:mod:`pickle`'s or
    cloudpickle's), each large bytes-like value in it copied once, into the result: a
    pickler writing to a file hands it such a value itself, past its buffer, where
    ``dumps`` copies it into a buffer it grows and shrinks again (a 1 MiB argument:
    ~0.37 against ~0.07-0.1 ms here; a small value ~0.6 µs slower by :mod:`pickle`,
    ~0.2 µs faster by cloudpickle)."""
    parts: list[Any] = []
    pickler(_Parts(parts), PICKLE_PROTOCOL).dump(value)
    return b"".join(parts)


def _streamed(values: Iterable[Any]) -> bool:
    """Whether any of the plain ``values`` is bytes a pickler writes past its buffer."""
    return any(type(v) is bytes and len(v) >= _STREAMED for v in values)


def _dumps(value: Any) -> bytes:
    """``cloudpickle.dumps(value)``: by :mod:`pickle` itself for a plain value, which
    pickles to the same bytes without cloudpickle's set-up for each call (~2.5 µs)."""
    if type(value) in _PLAIN:
        if _streamed((value,)):
            return _pickle_once(value, pickle.Pickler)
        return pickle.dumps(value, PICKLE_PROTOCOL)
    return _pickle_once(value, cloudpickle.Pickler)


def _pickle_args(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    if all(type(a) in _PLAIN for a in args) and all(type(v) in _PLAIN for v in kwargs.values()):
        # (the bytes cloudpickle writes)
        if _streamed(args) or _streamed(kwargs.values()):
            return _pickle_once((args, kwargs), pickle.Pickler)
        return pickle.dumps((args, kwargs), PICKLE_PROTOCOL)
    try:
        return _pickle_once((args, kwargs), cloudpickle.Pickler)
    except Exception as exc:
        # Find the argument to blame, by name where the signature gives one.
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            params = []
        labelled = [(params[i] if i < len(params) else f"#{i}", v) for i, v in enumerate(args)]
        for label, value in [*labelled, *kwargs.items()]:
            try:
                cloudpickle.dumps(value, protocol=PICKLE_PROTOCOL)
            except Exception as inner:
                raise SerializationError(
                    f"argument {label!r} of {_fn_name(fn)}() cannot be pickled: "
                    f"{type(inner).__name__}: {inner}"
                ) from inner
        raise SerializationError(
            f"arguments of {_fn_name(fn)}() cannot be pickled: {type(exc).__name__}: {exc}"
        ) from exc


def pickle_function(fn: Any) -> bytes:
    try:
        return _pickle_once(fn, cloudpickle.Pickler)
    except Exception as exc:
        raise SerializationError(
            f"function {_fn_name(fn)} cannot be pickled: {type(exc).__name__}: {exc}"
        ) from exc


def encode_pickle_call(
    fn: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    body: bytes | None = None,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
) -> EncodedCall:
    """A ``pickle`` payload. ``body`` is the function's pickled bytes when cached.

    When the payload with its arguments inline would pass ``inline_limit`` bytes, the
    arguments travel as a blob (``args_ref``), like the function body: the payload item
    stays small wherever the plane keeps it.
    """
    body = pickle_function(fn) if body is None else body
    fn_digest = digest(body)
    blobs = {fn_digest: body}
    pickled_args = _pickle_args(fn, args, kwargs)
    envelope: dict[str, Any] = {
        "v": WIRE_VERSION,
        "kind": "pickle",
        "fn": fn_digest,
        "name": _fn_name(fn),
        "py": PY_VERSION,
        "proto": PICKLE_PROTOCOL,
    }
    if len(pickled_args) <= inline_limit:  # (else it cannot fit: no copy to find out)
        inline = pack({**envelope, "args": pickled_args})
        if len(inline) <= inline_limit:
            return EncodedCall(inline, blobs, {})
    args_digest = digest(pickled_args)
    blobs[args_digest] = pickled_args
    envelope["args_ref"] = args_digest
    return EncodedCall(pack(envelope), blobs, {})


def encode_ref_call(target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> EncodedCall:
    """A ``ref`` payload: ``"module:function"`` with msgpack arguments."""
    module, sep, func = target.partition(":")
    if not sep or not module or not func:
        raise InvalidRequest(f"a ref target looks like 'package.module:function', not {target!r}")
    try:
        payload = pack(
            {
                "v": WIRE_VERSION,
                "kind": "ref",
                "target": target,
                "args": list(args),
                "kwargs": kwargs,
            }
        )
    except TypeError as exc:
        raise SerializationError(
            f"arguments of ref call {target} must be msgpack values: {exc}"
        ) from exc
    return EncodedCall(payload, {}, dict(kwargs))


def encode_exec(cmd: str | list[str], env: dict[str, str] | None, cwd: str | None) -> EncodedCall:
    """An ``exec`` payload: a shell command (str) or an argv (list)."""
    if not cmd:
        raise InvalidRequest("exec needs a command")
    return EncodedCall(
        pack({"v": WIRE_VERSION, "kind": "exec", "cmd": cmd, "env": env or {}, "cwd": cwd})
    )


_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "pickle": {"fn": str},
    "ref": {"target": str, "args": list, "kwargs": dict},
    "exec": {"cmd": (str, list), "env": dict},
}


def decode_payload(data: bytes) -> dict[str, Any]:
    """Decode and validate a payload envelope; raises :class:`InvalidRequest`."""
    env = unpack(data)
    if not isinstance(env, dict):
        raise InvalidRequest("payload must be a map")
    if env.get("v") != WIRE_VERSION:
        raise InvalidRequest(f"payload wire version {env.get('v')!r} is not {WIRE_VERSION}")
    kind = env.get("kind")
    if not isinstance(kind, str) or kind not in _REQUIRED:
        raise InvalidRequest(f"unknown payload kind {kind!r}")
    for key, typ in _REQUIRED[kind].items():
        if not isinstance(env.get(key), typ):
            raise InvalidRequest(f"{kind} payload needs {key!r}")
    if kind == "pickle" and not (
        isinstance(env.get("args"), bytes) or isinstance(env.get("args_ref"), str)
    ):
        raise InvalidRequest("pickle payload needs 'args' (bytes) or 'args_ref' (a blob digest)")
    return env


def encode_result(
    value: Any, *, prefer_msgpack: bool = False, inline_limit: int | None = None
) -> tuple[bytes, dict[str, bytes]]:
    """Encode a return value: the result envelope and the blobs it references.

    A result over ``inline_limit`` bytes becomes a blob and the envelope names it
    (``{"kind": "blob", "digest": ..., "inner": "pickle" | "msgpack"}``). Raises
    :class:`SerializationError` if the value cannot travel.
    """
    env: dict[str, Any] | None = None
    if prefer_msgpack:
        try:
            env = {"v": WIRE_VERSION, "kind": "msgpack", "data": value}
            data = pack(env)
            if not isinstance(value, _FLAT):  # (a map inside: its keys may be unreadable)
                unpack(data)  # what a reader can decode (a map with int keys it cannot)
        except (TypeError, ValueError, OverflowError, InvalidRequest):
            env = None
    if env is None:
        try:
            pickled = _dumps(value)
        except Exception as exc:
            raise SerializationError(
                f"the return value ({type(value).__name__}) cannot be pickled: {exc}"
            ) from exc
        data = pack({"v": WIRE_VERSION, "kind": "pickle", "data": pickled})
    if inline_limit is not None and len(data) > inline_limit:
        ref = digest(data)
        return pack({"v": WIRE_VERSION, "kind": "blob", "digest": ref}), {ref: data}
    return data, {}


def encode_manifest(value: str, keys: list[str]) -> bytes:
    """A data UDF's result: the bare str it returned and the keys it names."""
    return pack({"v": WIRE_VERSION, "kind": "data", "value": value, "keys": keys})


def result_blob(data: bytes) -> str | None:
    """The digest of the blob a result envelope stands for, if it is one."""
    env = unpack(data)
    if isinstance(env, dict) and env.get("kind") == "blob" and isinstance(env.get("digest"), str):
        return str(env["digest"])
    return None


#: values with no map inside (nothing a reader could fail to decode)
_FLAT = (str, bytes, int, float, bool, type(None))
#: the kinds of result envelope
_RESULT_KINDS = frozenset({"msgpack", "pickle", "blob", "data"})


def check_result(data: bytes) -> None:
    """Raise :class:`InvalidRequest` unless ``data`` is a result envelope a reader can
    decode (what a completion must carry; the value inside is not unpickled here)."""
    env = _result_envelope(data)
    kind = env.get("kind")
    if not isinstance(kind, str) or kind not in _RESULT_KINDS:
        raise InvalidRequest(f"unknown result kind {kind!r}")
    if kind == "pickle" and not isinstance(env.get("data"), bytes):
        raise InvalidRequest("pickle result envelope needs bytes")
    if kind == "msgpack" and "data" not in env:
        raise InvalidRequest("msgpack result envelope needs 'data'")
    if kind == "blob" and not is_digest(env.get("digest")):
        raise InvalidRequest("blob result envelope needs a sha256 digest")
    if kind == "data":
        keys = env.get("keys")
        if not isinstance(env.get("value"), str) or not isinstance(keys, list):
            raise InvalidRequest("data result envelope needs 'value' (a str) and 'keys' (a list)")
        if not all(isinstance(k, str) for k in keys):
            raise InvalidRequest("data result envelope's keys must be strings")


def _result_envelope(data: bytes) -> dict[str, Any]:
    env = unpack(data)
    if not isinstance(env, dict) or env.get("v") != WIRE_VERSION:
        raise InvalidRequest("result envelope has an unknown version")
    return env


def decode_result(data: bytes) -> Any:
    env = _result_envelope(data)
    if env.get("kind") == "msgpack":
        return env.get("data")
    if env.get("kind") == "data":
        return env.get("value")
    if env.get("kind") == "pickle":
        pickled = env.get("data")
        if not isinstance(pickled, bytes):
            raise InvalidRequest("pickle result envelope needs bytes")
        try:
            return pickle.loads(pickled)
        except Exception as exc:
            raise SerializationError(
                f"the result cannot be unpickled here: {type(exc).__name__}: {exc}"
            ) from exc
    raise InvalidRequest(f"unknown result kind {env.get('kind')!r}")


_DIGEST = re.compile(r"[0-9a-f]{64}")


def is_digest(value: object) -> bool:
    """Whether ``value`` names a blob: a sha256 in 64 lower-case hex digits."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def verified(digest_hex: str, data: bytes) -> bytes:
    """``data`` if its SHA-256 is ``digest_hex``; else :class:`InvalidRequest` (a blob
    that was changed after it was named is never used)."""
    if hashlib.sha256(data).hexdigest() != digest_hex:
        raise InvalidRequest(f"blob {digest_hex[:12]}… does not match its digest: refused")
    return data


#: characters of an error's message and traceback, and bytes of its pickle, a failure
#: keeps: the rest is cut (an exception carrying megabytes of text must still fit a
#: report, and a plane's record of the failure)
ERROR_MESSAGE = 8 * 1024
ERROR_TRACEBACK = 16 * 1024
ERROR_PICKLE = 64 * 1024
#: characters of one line of a traceback, and of one text field of an exception
#: pickled again with its long fields cut (a command's output, a remote traceback)
_ERROR_PART = 4 * 1024


def encode_error(exc: BaseException) -> dict[str, Any]:
    """Describe an exception for the plane; keep a pickle of it when one can be made.

    A message over :data:`ERROR_MESSAGE` characters is cut, saying how much went; so is
    each part of the traceback, then the whole to :data:`ERROR_TRACEBACK` keeping its
    end (the frames nearest the raise). A pickle over :data:`ERROR_PICKLE` bytes is
    made again of a copy whose long text fields (arguments, attributes, notes) are cut
    — the same type, with the start and end of each — else left out (the producer then
    gets a ``RemoteError``)."""
    cls = type(exc)
    pickled = _pickled(exc)
    if pickled is not None and len(pickled) > ERROR_PICKLE:
        twin = _trimmed(exc)
        pickled = None if twin is None else _pickled(twin)
        if pickled is not None and len(pickled) > ERROR_PICKLE:
            pickled = None
    parts = [_cut(part, _ERROR_PART) for part in traceback.format_exception(exc)]
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": clipped(str(exc)),
        "traceback": _cut("".join(parts), ERROR_TRACEBACK),
        "pickled": pickled,
    }


def clipped(message: str) -> str:
    """An error message cut to :data:`ERROR_MESSAGE` characters (saying how much went)."""
    return _cut(message, ERROR_MESSAGE, keep_end=False)


def _pickled(exc: BaseException) -> bytes | None:
    try:
        pickled = bytes(cloudpickle.dumps(exc, protocol=PICKLE_PROTOCOL))
        pickle.loads(pickled)  # only keep what will load again
    except Exception:
        return None
    return pickled


def _trimmed(exc: BaseException) -> BaseException | None:
    """A shallow copy of ``exc`` with every long str or bytes among its arguments,
    attributes and notes cut to their start and end; None if it cannot be copied."""
    try:
        twin = copy.copy(exc)
        twin.args = tuple(_cut_field(a) for a in exc.args)
        for name, value in vars(exc).items():
            setattr(twin, name, _cut_field(value))
    except Exception:
        return None
    return twin


def _cut_field(value: Any) -> Any:
    if isinstance(value, str):
        return _cut(value, _ERROR_PART)
    if isinstance(value, bytes) and len(value) > _ERROR_PART:
        return value[: _ERROR_PART // 4] + b"\n... [cut] ...\n" + value[-(3 * _ERROR_PART // 4) :]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # (__notes__)
        return [_cut(v, _ERROR_PART) for v in value]
    return value


def _cut(text: str, most: int, *, keep_end: bool = True) -> str:
    """``text`` if it has at most ``most`` characters; else its start (and, with
    ``keep_end``, its end) around a note of how many characters went."""
    if len(text) <= most:
        return text
    head = most // 4 if keep_end else most
    tail = most - head if keep_end else 0
    note = f"\n… [{len(text) - head - tail} characters cut] …\n"
    return text[:head] + note + (text[-tail:] if tail else "")


def decode_error(error: dict[str, Any]) -> BaseException:
    """Rebuild a remote exception as its own type, else as :class:`RemoteError`.

    Either way the remote traceback text is on ``remote_traceback`` and in a note.
    """
    tb = str(error.get("traceback") or "")
    type_name = str(error.get("type") or "")
    message = str(error.get("message") or "")
    exc: BaseException | None = None
    blob = error.get("pickled")
    if isinstance(blob, bytes):
        try:
            loaded = pickle.loads(blob)
            if isinstance(loaded, BaseException):
                exc = loaded
        except Exception:
            exc = None
    if exc is None and type_name.startswith(_OWN_PREFIX):
        own = BY_CODE_NAME.get(type_name[len(_OWN_PREFIX) :])
        if own is not None:
            exc = own(message)
    if exc is None:
        exc = RemoteError(message, type_name=type_name, remote_traceback=tb)
    if tb:
        exc.remote_traceback = tb  # type: ignore[attr-defined]
        exc.add_note(f"Remote traceback:\n{tb.rstrip()}")
    return exc
