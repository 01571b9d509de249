"""What one submit carries besides the call: ids, options, and reading outcomes."""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .entropy import random_bytes
from .errors import CancelledError, ExpiredInvocation, InvocationDead
from .plane.ids import GROUP_ALPHABET, GROUP_SIZE, group_ids
from .plane.model import Invocation, RetryPolicy, State
from .wire import decode_error, decode_result, result_blob, verified

if TYPE_CHECKING:
    from .dispatch import Dispatch
    from .transport import Transport

__all__ = ["IdGroups", "SubmitOptions", "encode_id", "key_id", "new_id", "outcome"]

#: RFC 4648's base32 digits → ours
_TO_ALPHABET = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", GROUP_ALPHABET.encode())


def new_id() -> str:
    """A fresh invocation id: time-ordered, 26 characters, unique without coordination.

    The 130-bit number ``milliseconds << 80 | 80 random bits`` in base32 (Crockford's
    lower-case alphabet), most significant digit first."""
    ms = int(time.time() * 1000)
    return encode_id((ms << 80) | int.from_bytes(random_bytes(10), "big"))


def encode_id(n: int) -> str:
    """``n`` (under 2**130) as an id's 26 digits, most significant first."""
    # 160 bits encode to 32 digits aligned on the low end: the last 26 are n's
    return base64.b32encode(n.to_bytes(20, "big"))[6:].translate(_TO_ALPHABET).decode()


class IdGroups:
    """Ids for many submits, made in groups: one open group per key (a queue), whose ids
    are handed out in order, and a fresh group once its :data:`GROUP_SIZE` are used.

    A store may keep a group's records together, so a claim or a completion of many of
    them is one write (see :mod:`dreamlake.lakeshore.plane.ids`); ids for one queue are the
    ones claimed together. Safe to share between threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left: dict[Hashable, deque[str]] = {}

    def next_id(self, key: Hashable) -> str:
        """The next id for ``key``: the next of its open group, else the first of a new one."""
        with self._lock:
            left = self._left.get(key)
            if left is None:
                left = self._left[key] = deque(group_ids(new_id(), GROUP_SIZE))
            inv_id = left.popleft()
            if not left:
                del self._left[key]
            return inv_id


def key_id(queue: str, key: str) -> str:
    """The invocation id an idempotency key stands for (per queue)."""
    return "k" + hashlib.sha256(f"{queue}\0{key}".encode()).hexdigest()[:31]


@dataclass(frozen=True)
class SubmitOptions:
    """The framework's options of one submit (the ``_``-prefixed keywords)."""

    dispatch: Dispatch | None = None
    priority: float | None = None
    delay: float = 0.0
    timeout: float | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    id: str | None = None
    retry: RetryPolicy | None = None

    #: keyword → field, for ``submit(..., _priority=3)``
    FIELDS: ClassVar[frozenset[str]] = frozenset(
        {
            "dispatch",
            "priority",
            "delay",
            "timeout",
            "max_attempts",
            "idempotency_key",
            "id",
            "retry",
        }
    )

    @classmethod
    def split(
        cls, kwargs: dict[str, Any], base: SubmitOptions | None = None
    ) -> tuple[SubmitOptions, dict[str, Any]]:
        """Separate ``_``-prefixed framework keywords from the function's own."""
        ours = {k[1:]: v for k, v in kwargs.items() if k.startswith("_")}
        theirs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        unknown = set(ours) - cls.FIELDS
        if unknown:
            allowed = ", ".join(sorted("_" + f for f in cls.FIELDS))
            raise TypeError(
                f"unknown submit option(s) {', '.join('_' + u for u in sorted(unknown))}; "
                f"keywords starting with '_' are Lakeshore's: {allowed}"
            )
        merged = {**(base.__dict__ if base else {}), **{k: v for k, v in ours.items()}}
        if isinstance(merged.get("retry"), int):
            merged["retry"] = RetryPolicy(max=merged["retry"])
        return cls(**merged), theirs


def outcome(rec: Invocation, transport: Transport) -> Any:
    """The value of a finished invocation, or the exception it stands for."""
    if rec.is_expired(transport.now()):
        raise ExpiredInvocation(
            f"invocation {rec.id!r} finished {rec.state.value}; its result passed retention"
        )
    if rec.state is State.SUCCEEDED:
        assert rec.result is not None
        ref = result_blob(rec.result)
        return decode_result(rec.result if ref is None else verified(ref, transport.get_blob(ref)))
    message = str((rec.error or {}).get("message") or "")
    if rec.state is State.CANCELLED:
        raise CancelledError(f"invocation {rec.id!r} was cancelled")
    if rec.state is State.DEAD:
        raise InvocationDead(f"invocation {rec.id!r} is dead: {message}")
    if rec.state is State.FAILED:
        raise decode_error(rec.error or {"message": "failed"})
    raise AssertionError(f"outcome() of an unfinished invocation ({rec.state})")
