"""Queue handles: ``Queue`` (async surface) and ``SyncQueue`` (the same, blocking).

A handle names a queue and the settings it expects; it makes no plane call until first
use. The first submit creates the queue (unless strict) or checks that the existing
queue has the settings this handle asks for.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from . import config
from .dispatch import Dispatch
from .errors import CancelledError, ExpiredInvocation, InvocationDead
from .plane.model import FINISHED, Invocation, QueueSpec, RetryPolicy, State, Submission
from .wire import decode_error, decode_result, encode_pickle_call, encode_ref_call

__all__ = ["Queue", "SubmitOptions", "SyncQueue", "new_id", "outcome"]

_ID_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def new_id() -> str:
    """A fresh invocation id: time-ordered, 26 characters, unique without coordination."""
    ms = int(time.time() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    n = (ms << 80) | rand
    chars = []
    for _ in range(26):
        n, r = divmod(n, 32)
        chars.append(_ID_ALPHABET[r])
    return "".join(reversed(chars))


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


def outcome(rec: Invocation, now: float) -> Any:
    """The value of a finished invocation, or the exception it stands for."""
    if rec.is_expired(now):
        raise ExpiredInvocation(
            f"invocation {rec.id!r} finished {rec.state.value}; its result passed retention"
        )
    if rec.state is State.SUCCEEDED:
        assert rec.result is not None
        return decode_result(rec.result)
    message = str((rec.error or {}).get("message") or "")
    if rec.state is State.CANCELLED:
        raise CancelledError(f"invocation {rec.id!r} was cancelled")
    if rec.state is State.DEAD:
        raise InvocationDead(f"invocation {rec.id!r} is dead: {message}")
    if rec.state is State.FAILED:
        raise decode_error(rec.error or {"message": "failed"})
    raise AssertionError(f"outcome() of an unfinished invocation ({rec.state})")


class _QueueHandle:
    """What Queue and SyncQueue share: the name, the expected settings, submitting."""

    kind: ClassVar[str] = "fifo"

    def __init__(
        self,
        name: str,
        *,
        dispatch: Dispatch | None = None,
        kind: str | None = None,
        strict: bool | None = None,
        elasticity: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError("a queue needs a non-empty name")
        self.name = name
        self._dispatch = dispatch
        self._strict = strict
        self._check = ["kind"]
        if elasticity is not None:
            self._check.append("elasticity")
        self.spec = QueueSpec(
            name=name,
            kind=kind or type(self).kind,
            elasticity=dict(elasticity) if elasticity is not None else None,
            retry=retry.to_dict() if retry is not None else None,
        )

    @classmethod
    def named(cls, name: str, **kwargs: Any) -> Any:
        """``Queue.named("tutorial")`` is ``Queue("tutorial")``."""
        return cls(name, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, kind={self.spec.kind!r})"

    @property
    def dispatch(self) -> Dispatch:
        """The Dispatch given to this handle, else the process default (built lazily)."""
        return self._dispatch or config.default_dispatch()

    @property
    def strict(self) -> bool:
        return config.settings().strict if self._strict is None else self._strict

    def _submit(
        self,
        fn: Callable[..., Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: SubmitOptions,
        *,
        body: bytes | None = None,
    ) -> str:
        dp = opts.dispatch or self.dispatch
        if isinstance(fn, str):
            encoded = encode_ref_call(fn, args, kwargs)
        else:
            encoded = encode_pickle_call(fn, args, kwargs, body=body)
        dp.upload(encoded.blobs)
        if opts.id is not None:
            inv_id = opts.id
        elif opts.idempotency_key is not None:
            inv_id = key_id(self.name, opts.idempotency_key)
        else:
            inv_id = new_id()
        sub = Submission(
            id=inv_id,
            queue=self.name,
            payload=encoded.payload,
            priority=float(opts.priority or 0.0),
            delay=float(opts.delay or 0.0),
            timeout=opts.timeout,
            max_attempts=opts.max_attempts,
            retry=opts.retry,
        )
        return dp.submit([sub], spec=self.spec, strict=self.strict, check=self._check)[0]

    def _wait_sync(self, inv_id: str, timeout: float | None) -> Invocation:
        box: list[Invocation] = []
        done = threading.Event()

        def on_done(rec: Invocation) -> None:
            box.append(rec)
            done.set()

        unwatch = self.dispatch.transport.watch([inv_id], on_done)
        try:
            if not done.wait(timeout):
                raise TimeoutError(
                    f"invocation {inv_id!r} did not finish within {timeout}s (it keeps going)"
                )
        finally:
            unwatch()
        return box[0]

    async def _wait_async(self, inv_id: str, timeout: float | None) -> Invocation:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Invocation] = loop.create_future()

        def resolve(rec: Invocation) -> None:
            if not fut.done():
                fut.set_result(rec)

        def on_done(rec: Invocation) -> None:
            # RuntimeError: the loop is gone, so nobody is waiting any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve, rec)

        unwatch = self.dispatch.transport.watch([inv_id], on_done)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"invocation {inv_id!r} did not finish within {timeout}s (it keeps going)"
            ) from None
        finally:
            unwatch()

    def _status(self, inv_id: str) -> str:
        transport = self.dispatch.transport
        return transport.get(inv_id).public_state(transport.now()).value


class Queue(_QueueHandle):
    """A queue, async surface: ``await q.result(inv_id, timeout=30)``."""

    async def submit(self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> str:
        """Submit ``fn(*args, **kwargs)`` (or a ``"module:function"`` reference).

        Returns the invocation id once the plane has it. ``_``-prefixed keywords are
        options (``_priority``, ``_delay``, ``_timeout``, ``_max_attempts``,
        ``_idempotency_key``, ``_id``, ``_retry``, ``_dispatch``).
        """
        opts, kwargs = SubmitOptions.split(kwargs)
        return self._submit(fn, args, kwargs, opts)

    async def result(self, inv_id: str, timeout: float | None = None) -> Any:
        """The invocation's return value; raises what it raised.

        Raises ``TimeoutError`` after ``timeout`` seconds (the invocation keeps going),
        :class:`~dreamlake.lakeshore.CancelledError`, ``UnknownInvocation`` and
        ``ExpiredInvocation``.
        """
        rec = await self._wait_async(inv_id, timeout)
        return outcome(rec, self.dispatch.transport.now())

    async def status(self, inv_id: str) -> str:
        """``scheduled``, ``pending``, ``running``, ``succeeded``, ``failed``,
        ``cancelled`` or ``dead``."""
        return self._status(inv_id)

    async def cancel(self, inv_id: str) -> str:
        """Cancel it unless finished; return the state it is in afterwards."""
        return self.dispatch.transport.cancel(inv_id).value

    @property
    def sync(self) -> SyncQueue:
        """The blocking surface of the same queue."""
        return SyncQueue._from(self)


class SyncQueue(_QueueHandle):
    """A queue, blocking surface. Safe inside a running event loop (Jupyter)."""

    @classmethod
    def _from(cls, other: _QueueHandle) -> SyncQueue:
        new = cls.__new__(cls)
        new.__dict__.update(other.__dict__)
        return new

    def submit(self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> str:
        """As :meth:`Queue.submit`, blocking."""
        opts, kwargs = SubmitOptions.split(kwargs)
        return self._submit(fn, args, kwargs, opts)

    def result(self, inv_id: str, timeout: float | None = None) -> Any:
        """As :meth:`Queue.result`, blocking."""
        return outcome(self._wait_sync(inv_id, timeout), self.dispatch.transport.now())

    def status(self, inv_id: str) -> str:
        return self._status(inv_id)

    def cancel(self, inv_id: str) -> str:
        return self.dispatch.transport.cancel(inv_id).value

    def finished(self, inv_id: str) -> bool:
        return self.dispatch.transport.get(inv_id).state in FINISHED
