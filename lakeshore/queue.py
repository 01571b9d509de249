"""Queue handles: the async surface (``Queue`` and its kinds) and the blocking one
(``SyncQueue`` and its kinds).

===================  ======================  ====================================
async                blocking                kind and its own keyword arguments
===================  ======================  ====================================
``Queue``            ``SyncQueue``           fifo by default; ``kind=`` picks any
``PriorityQueue``    ``SyncPriorityQueue``   priority: ``priority_field``
``BoltzmannQueue``   ``SyncBoltzmannQueue``  boltzmann: ``priority_field``,
                                             ``temperature``, ``anneal``
``FILOQueue``        ``SyncFILOQueue``       filo
``Pool``             —                       deprecated: ``Queue(elasticity=...)``
===================  ======================  ====================================

Every handle also takes ``dispatch``, ``strict``, ``elasticity``, ``retry``,
``namespace`` and ``scope``. A handle makes no plane call until first use. The first
submit creates the queue (unless strict) or checks that the queue on the plane has the
settings this handle names — its kind, when the class or ``kind=`` names one, and each
setting passed explicitly; a bare ``Queue("x")`` adopts whatever the plane has.

Queue names: ``"/x"`` is always the flat name ``x``; ``namespace="module"`` prefixes
the defining module's ``__name__`` (``__main__`` in a REPL or notebook); ``scope="run"``
appends ``.run-<id>`` while :func:`dreamlake.lakeshore.context.run` is active.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, ClassVar, TypeVar, cast

from . import batching as _batch
from . import config, context, logs
from .dispatch import Dispatch
from .errors import ExpiredInvocation, InvalidRequest, UnknownInvocation
from .plane.kinds import KIND_OPTIONS
from .plane.model import FINISHED, Invocation, QueueSpec, RetryPolicy, Submission
from .submit import SubmitOptions, key_id, new_id, outcome
from .transport import AsyncResults, Unwatch
from .wire import EncodedCall, encode_exec, encode_pickle_call, encode_ref_call

_log = logging.getLogger("dreamlake.lakeshore.sdk")

__all__ = [
    "BoltzmannQueue",
    "FILOQueue",
    "Pool",
    "PriorityQueue",
    "Queue",
    "SyncBoltzmannQueue",
    "SyncFILOQueue",
    "SyncPriorityQueue",
    "SyncQueue",
]

_T = TypeVar("_T")

#: keyword argument → the class it belongs to, for error messages
OWNER = {
    "priority_field": "PriorityQueue",
    "temperature": "BoltzmannQueue",
    "anneal": "BoltzmannQueue",
}
_PACKAGE = __name__.rpartition(".")[0]


def _send_open_batch() -> None:
    """A wait inside ``with dls.batch():`` first sends what the batch holds."""
    open_batch = _batch.current()
    if open_batch is not None:
        open_batch.flush()


def _caller_module() -> str:
    """``__name__`` of the first frame outside this package (``__main__`` if unknown)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and not name.startswith(_PACKAGE):
            return name
        frame = frame.f_back
    return "__main__"


class _QueueHandle:
    """What every handle shares: naming, expected settings, submitting, waiting."""

    #: the kind this class stands for; None lets ``kind=`` choose (fifo by default)
    fixed_kind: ClassVar[str | None] = None

    def __init__(
        self,
        name: str,
        *,
        dispatch: Dispatch | None = None,
        strict: bool | None = None,
        elasticity: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        namespace: str | None = None,
        scope: str | None = None,
        warn_missing: bool = False,
        kind: str | None = None,
        **options: Any,
    ) -> None:
        cls = type(self).__name__
        if not isinstance(name, str) or not name.strip("/"):
            raise TypeError(f"{cls} needs a non-empty queue name")
        if kind is not None and self.fixed_kind is not None and kind != self.fixed_kind:
            raise TypeError(f"{cls} is always kind={self.fixed_kind!r}; use Queue(kind={kind!r})")
        chosen = self.fixed_kind or kind or "fifo"
        if chosen not in KIND_OPTIONS:
            raise TypeError(f"unknown queue kind {chosen!r}; one of {', '.join(KIND_OPTIONS)}")
        for key in options:
            if key not in KIND_OPTIONS[chosen]:
                owner = OWNER.get(key)
                if owner is None:
                    raise TypeError(f"{cls}() got an unexpected keyword argument {key!r}")
                raise TypeError(f"{key}= applies to {owner}, not {cls} (kind={chosen!r})")
        if namespace not in (None, "module"):
            raise TypeError('namespace= takes "module" (or None for a flat name)')
        if scope not in (None, "run"):
            raise TypeError('scope= takes "run" (or None)')
        if name.startswith("/"):
            base = name[1:]
        elif namespace == "module":
            base = f"{_caller_module()}.{name}"
        else:
            base = name
        self.base_name = base
        self.scope = scope
        self._dispatch = dispatch
        self._strict = strict
        self._warn_missing = warn_missing
        self._check = (["kind"] if self.fixed_kind or kind else []) + sorted(options)
        if elasticity is not None:
            self._check.append("elasticity")
        self._settings: dict[str, Any] = {
            "kind": chosen,
            **options,
            "elasticity": dict(elasticity) if elasticity is not None else None,
            "retry": retry.to_dict() if retry is not None else None,
        }
        if "anneal" in self._settings and self._settings["anneal"] is not None:
            self._settings["anneal"] = dict(self._settings["anneal"])

    # --- identity ------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The queue's name on the plane now (run-scoped handles follow the active run)."""
        if self.scope == "run":
            active = context.current_run()
            if active is not None:
                return f"{self.base_name}.run-{active.id}"
        return self.base_name

    @property
    def spec(self) -> QueueSpec:
        return QueueSpec(name=self.name, **self._settings)

    @property
    def kind(self) -> str:
        return str(self._settings["kind"])

    @classmethod
    def named(cls, name: str, **kwargs: Any) -> Any:
        """``Queue.named("tutorial")`` is ``Queue("tutorial")``."""
        return cls(name, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, kind={self.kind!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _QueueHandle):
            return NotImplemented
        return (
            isinstance(self, Queue) == isinstance(other, Queue)
            and self.spec == other.spec
            and self._dispatch is other._dispatch
        )

    def __hash__(self) -> int:
        return hash((self.name, self.kind))

    # --- plane access ----------------------------------------------------------------
    @property
    def dispatch(self) -> Dispatch:
        """The Dispatch given to this handle, else the process default (built lazily)."""
        return self._dispatch or config.default_dispatch()

    @property
    def strict(self) -> bool:
        return config.settings().strict if self._strict is None else self._strict

    def _ensure(self, dp: Dispatch) -> QueueSpec:
        spec = self.spec
        stored = dp.ensure_queue(
            spec, strict=self.strict, check=self._check, warn_missing=self._warn_missing
        )
        if self.scope == "run":
            active = context.current_run()
            if active is not None:
                active.note(dp, spec.name)
        return stored

    def _submit(
        self,
        fn: Callable[..., Any] | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: SubmitOptions,
        *,
        body: bytes | None = None,
        encoded: EncodedCall | None = None,
    ) -> str:
        dp = opts.dispatch or self.dispatch
        stored = self._ensure(dp)
        if encoded is not None:
            pass
        elif isinstance(fn, str):
            encoded = encode_ref_call(fn, args, kwargs)
        else:
            limit = dp.transport.inline_limit()
            encoded = encode_pickle_call(fn, args, kwargs, body=body, inline_limit=limit)
        priority = opts.priority or 0.0
        if stored.kind in ("priority", "boltzmann") and stored.priority_field in kwargs:
            priority = kwargs[stored.priority_field]
        if isinstance(priority, bool) or not isinstance(priority, int | float):
            kind = type(priority).__name__
            raise InvalidRequest(
                f"priority ({stored.priority_field}=) must be a number, not {kind}"
            )
        if opts.id is not None:
            inv_id = opts.id
        elif opts.idempotency_key is not None:
            inv_id = key_id(stored.name, opts.idempotency_key)
        elif (open_batch := _batch.current()) is not None:
            inv_id = open_batch.new_id(dp, stored.name)
        else:
            inv_id = new_id()
        sub = Submission(
            id=inv_id,
            queue=stored.name,
            payload=encoded.payload,
            priority=float(priority),
            delay=float(opts.delay or 0.0),
            timeout=opts.timeout,
            max_attempts=opts.max_attempts,
            retry=opts.retry,
        )
        logs.event(_log, "invocation.submitting", inv_id, queue=stored.name, level=logging.DEBUG)
        ids = dp.submit(
            [sub], spec=self.spec, strict=self.strict, check=self._check, blobs=encoded.blobs
        )
        return ids[0]

    def _submit_exec(
        self,
        cmd: str | list[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        kwargs: dict[str, Any],
    ) -> str:
        opts, rest = SubmitOptions.split({f"_{k}": v for k, v in kwargs.items()})
        if rest:
            raise TypeError(f"unexpected keyword arguments: {', '.join(rest)}")
        encoded = encode_exec(cmd, dict(env or {}), cwd)
        return self._submit("", (), {}, opts, encoded=encoded)

    def _update(self, settings: dict[str, Any]) -> QueueSpec:
        unknown = set(settings) - (KIND_OPTIONS[self.kind] | {"elasticity", "retry"})
        if unknown:
            raise TypeError(f"{type(self).__name__} cannot change {', '.join(sorted(unknown))}")
        dp = self.dispatch
        self._ensure(dp)
        stored = dp.transport.update_queue(self.name, **settings)
        dp.forget_queue(self.name)
        self._settings.update(settings)
        return stored

    def _wait_sync(self, inv_id: str, timeout: float | None) -> Invocation:
        _send_open_batch()
        asked = timeout
        if timeout is not None and timeout >= threading.TIMEOUT_MAX:
            timeout = None  # (as long as it takes: no clock or lock times a longer wait)
        elif timeout is not None and not timeout > 0:
            timeout = 0.0  # (less than none, or not a number: one look, no wait)
        here = getattr(self.dispatch.transport, "wait_here", None)
        if here is not None:  # a remote plane: long-poll from this thread
            rec: Invocation | None = here(inv_id, timeout)
            if rec is None:
                raise TimeoutError(
                    f"invocation {inv_id!r} did not finish within {asked}s (it keeps going)"
                )
            return rec
        box: list[Invocation] = []
        # A bare lock, held until the finish releases it: the finishing thread wakes this
        # one with one release, where an Event's condition would have the woken thread
        # take the condition's lock again (embedded B ~0.01 ms less a call).
        done = threading.Lock()
        done.acquire()

        def on_done(rec: Invocation) -> None:
            box.append(rec)
            with contextlib.suppress(RuntimeError):  # (told twice: released already)
                done.release()

        unwatch = self.dispatch.transport.watch([inv_id], on_done)
        try:
            if not done.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError(
                    f"invocation {inv_id!r} did not finish within {asked}s (it keeps going)"
                )
        finally:
            unwatch()
        return box[0]

    async def _wait_async(self, inv_id: str, timeout: float | None) -> Invocation:
        if _batch.current() is not None:
            await asyncio.to_thread(_send_open_batch)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Invocation] = loop.create_future()
        group = _LoopInbox.of(loop).watching(self.dispatch.transport)
        group.add(inv_id, fut, now=timeout is not None and timeout <= 0)
        # A timer on the future, not asyncio.wait_for (a task a wait: in a gather of
        # thousands, a good part of the producer's CPU)
        timer = None if timeout is None else loop.call_later(max(0.0, timeout), _expire, fut)
        answered = False
        try:
            rec = await fut
            answered = True
            return rec
        except _Expired:
            raise TimeoutError(
                f"invocation {inv_id!r} did not finish within {timeout}s (it keeps going)"
            ) from None
        finally:
            if timer is not None:
                timer.cancel()
            group.left_one(inv_id, fut, answered)

    def _status(self, inv_id: str) -> str:
        transport = self.dispatch.transport
        return transport.get(inv_id).public_state(transport.now()).value


class _Expired(Exception):
    """A result wait's time ran out (raised into its future by its timer)."""


def _expire(fut: asyncio.Future[Invocation]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


class _LoopInbox:
    """Results handed to one event loop from other threads (the transport's poller),
    in batches: one wake-up of the loop for all that arrived since the last one,
    instead of one ``call_soon_threadsafe`` (a write to the loop's self-pipe) a result.
    """

    _of: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopInbox]] = (
        weakref.WeakKeyDictionary()
    )
    _made = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list[tuple[asyncio.Future[Invocation], Invocation]] = []
        #: the group of waits each transport takes in this turn of the loop (loop thread)
        self.open: dict[int, _Watching] = {}

    def watching(self, transport: Any) -> _Watching:
        """The group of result waits on ``transport`` that this turn of the loop
        registers together (called from the loop's thread)."""
        group = self.open.get(id(transport))
        if group is None:
            group = self.open[id(transport)] = _Watching(self, transport)
            self.loop.call_soon(group.register)
        return group

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopInbox:
        with cls._made:
            inbox = cls._of.get(loop)
            if inbox is None:
                inbox = cls._of[loop] = cls(loop)
            return inbox

    def put(self, fut: asyncio.Future[Invocation], rec: Invocation) -> None:
        with self.lock:
            self.items.append((fut, rec))
            if len(self.items) > 1:
                return  # a wake-up is on its way
        # RuntimeError: the loop is gone, so nobody is waiting any more
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for fut, rec in items:
            if not fut.done():
                fut.set_result(rec)


class _Watching:
    """Result waits begun in one turn of an event loop on one transport, registered
    with one ``transport.watch`` when the turn ends: ``asyncio.gather`` over thousands
    of results starts every wait before any runs on, so they make one watch, not one
    each (each watch takes the transport's locks and books of its own).

    Each wait behaves as if it had watched alone: its future gets its record, or the
    error a watch of its id alone raises. An id the plane does not have fails the whole
    watch, so the group then watches each id alone; any other error of the watch (the
    plane unreachable) is every wait's. A wait with no time to wait (``timeout=0``) gets
    a record finished by then: a group with such waits on a transport whose watch hears
    of finishes later (HTTP: at its poller's next answer) asks for all its ids at once
    (``finished_now``), before any timer, and then watches only the ids a wait with time
    to wait is still on (the transport knows them by then: its watch asks nothing). A
    wait leaves the group when it is over, so the group holds no finished
    wait's future or record; ids that finish leave the transport's books as they fire,
    and an id whose last wait gave up (a timeout, a cancel) is unwatched then.
    """

    __slots__ = (
        "alone",
        "here",
        "inbox",
        "left",
        "lock",
        "registered",
        "transport",
        "waits",
        "whole",
        "zero",
    )

    def __init__(self, inbox: _LoopInbox, transport: Any) -> None:
        self.inbox = inbox
        self.transport = transport
        #: the waits not over yet, by id (read by the transport's poller thread)
        self.waits: dict[str, list[asyncio.Future[Invocation]]] = {}
        self.lock = threading.Lock()
        #: waits of the group not over yet
        self.left = 0
        self.registered = False
        #: the watch of all the group's ids
        self.whole: Unwatch | None = None
        #: the watches of single ids, once one unknown id failed the group's watch
        self.alone: dict[str, Unwatch] = {}
        #: the loop's thread while it registers (records already finished fire there)
        self.here: int | None = None
        #: the waits with no time to wait
        self.zero: set[asyncio.Future[Invocation]] = set()

    def add(self, inv_id: str, fut: asyncio.Future[Invocation], *, now: bool = False) -> None:
        with self.lock:
            self.waits.setdefault(inv_id, []).append(fut)
        self.left += 1
        if now:
            self.zero.add(fut)

    def register(self) -> None:
        del self.inbox.open[id(self.transport)]
        self.registered = True
        with self.lock:
            ids = list(self.waits)
        if not ids:
            return  # every wait gave up before this
        self.here = threading.get_ident()
        try:
            ids = self._finished_now(ids)
            if ids:
                self._watch(ids)
        finally:
            self.here = None
        if not self.left:
            self._unwatch()

    def _watch(self, ids: list[str]) -> None:
        self.whole, self.alone = self._ask(ids, lambda some: self.transport.watch(some, self._fire))

    def _finished_now(self, ids: list[str]) -> list[str]:
        """With waits with no time to wait among the group's, on a transport whose watch
        hears of finishes later (HTTP): read what is finished of all ``ids`` now (one
        zero-second wait, after which the transport knows them and its watch asks
        nothing) and set those records. Returns the ids still to watch: those some wait
        with time to wait is still on (all of ``ids`` without such waits). Loop
        thread, while registering."""
        read = getattr(self.transport, "finished_now", None)
        if read is None or not self.zero:
            return ids
        whole, each = self._ask(ids, read)
        for rec in whole if whole is not None else [r for recs in each.values() for r in recs]:
            self._fire(rec)
        with self.lock:  # (a failed wait is done: its id is not watched for it)
            return [
                i
                for i, futs in self.waits.items()
                if any(not f.done() and f not in self.zero for f in futs)
            ]

    def _ask(
        self, ids: list[str], call: Callable[[list[str]], _T]
    ) -> tuple[_T | None, dict[str, _T]]:
        """``call(ids)``: its answer for them all. One id the plane does not have fails
        the whole call, so ``call([id])`` is then made for each id alone (the answers by
        id; the waits on an id whose call fails get its error); any other error (the
        plane unreachable, the transport closed) is every wait's."""
        try:
            return call(ids), {}
        except (UnknownInvocation, ExpiredInvocation):
            each: dict[str, _T] = {}
            for inv_id in ids:
                try:
                    each[inv_id] = call([inv_id])
                except Exception as exc:
                    self._fail(self._waits_on([inv_id]), exc)
            return None, each
        except Exception as exc:
            self._fail(self._waits_on(ids), exc)
            return None, {}

    def _waits_on(self, ids: list[str]) -> list[asyncio.Future[Invocation]]:
        with self.lock:
            return [f for i in ids for f in self.waits.get(i, ())]

    @staticmethod
    def _fail(futs: list[asyncio.Future[Invocation]], exc: Exception) -> None:
        for k, fut in enumerate(futs):
            if not fut.done():  # (each wait raises an exception of its own)
                fut.set_exception(exc if k == 0 else copy.copy(exc))

    def _fire(self, rec: Invocation) -> None:
        here = self.here is not None and threading.get_ident() == self.here
        with self.lock:
            futs = list(self.waits.get(rec.id, ()))
        for fut in futs:
            if not here:
                self.inbox.put(fut, rec)
            elif not fut.done():  # (finished already: before any timer of the wait)
                fut.set_result(rec)

    def left_one(self, inv_id: str, fut: asyncio.Future[Invocation], answered: bool) -> None:
        """The wait ``fut`` on ``inv_id`` is over: ``answered`` with its record (the
        transport took the id off its books as it fired), or it gave up."""
        with self.lock:
            futs = self.waits.get(inv_id)
            if futs is not None and fut in futs:
                futs.remove(fut)
                if not futs:
                    del self.waits[inv_id]
                    futs = None
            last = futs is None
        self.zero.discard(fut)
        self.left -= 1
        if not self.registered:
            return  # (not registered yet: the id goes unwatched unless others wait on it)
        if not self.left:
            self._unwatch()
        elif last and not answered:
            self._unwatch_ids([inv_id])

    def _unwatch_ids(self, ids: list[str]) -> None:
        if self.whole is not None:
            self.whole(ids)
        for inv_id in ids:
            alone = self.alone.pop(inv_id, None)
            if alone is not None:
                alone()

    def _unwatch(self) -> None:
        whole, self.whole = self.whole, None
        alone, self.alone = self.alone, {}
        for unwatch in [*([whole] if whole else []), *alone.values()]:
            unwatch()


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

    async def exec(
        self,
        cmd: str | list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> str:
        """Submit a shell command (a string) or an argv (a list). Its result is
        ``{"exit_code", "stdout", "stderr"}``; a non-zero exit raises
        ``subprocess.CalledProcessError``. ``options`` are submit options without the
        underscore: ``timeout=``, ``delay=``, ``priority=``, ``idempotency_key=``, ..."""
        return self._submit_exec(cmd, env, cwd, options)

    async def result(self, inv_id: str, timeout: float | None = None) -> Any:
        """The invocation's return value; raises what it raised.

        Raises ``TimeoutError`` after ``timeout`` seconds (the invocation keeps going),
        :class:`~dreamlake.lakeshore.CancelledError`, ``UnknownInvocation`` and
        ``ExpiredInvocation``.
        """
        transport = self.dispatch.transport
        # (a runtime Protocol check costs ~20 µs: too much for a gather of thousands)
        if hasattr(transport, "aresult"):
            return await cast(AsyncResults, transport).aresult(inv_id, timeout)
        rec = await self._wait_async(inv_id, timeout)
        return outcome(rec, transport)

    async def status(self, inv_id: str) -> str:
        """``scheduled``, ``pending``, ``running``, ``succeeded``, ``failed``,
        ``cancelled`` or ``dead``."""
        return self._status(inv_id)

    async def cancel(self, inv_id: str) -> str:
        """Cancel it unless finished; return the state it is in afterwards."""
        return self.dispatch.transport.cancel(inv_id).value

    async def set_priority(self, inv_id: str, priority: float) -> None:
        """Move a pending invocation to another priority."""
        self.dispatch.transport.set_priority(inv_id, priority)

    async def update(self, **settings: Any) -> QueueSpec:
        """Change the queue's settings live (``temperature=``, ``anneal=``, ...)."""
        return self._update(settings)

    @property
    def sync(self) -> SyncQueue:
        """The blocking surface of the same queue."""
        new = SYNC_OF[type(self)].__new__(SYNC_OF[type(self)])
        new.__dict__.update(self.__dict__)
        new._check = list(self._check)
        new._settings = dict(self._settings)
        return new


class SyncQueue(_QueueHandle):
    """A queue, blocking surface. Safe inside a running event loop (Jupyter)."""

    def submit(self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> str:
        """As :meth:`Queue.submit`, blocking."""
        opts, kwargs = SubmitOptions.split(kwargs)
        return self._submit(fn, args, kwargs, opts)

    def exec(
        self,
        cmd: str | list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> str:
        """As :meth:`Queue.exec`, blocking."""
        return self._submit_exec(cmd, env, cwd, options)

    def result(self, inv_id: str, timeout: float | None = None) -> Any:
        """As :meth:`Queue.result`, blocking."""
        return outcome(self._wait_sync(inv_id, timeout), self.dispatch.transport)

    def status(self, inv_id: str) -> str:
        return self._status(inv_id)

    def cancel(self, inv_id: str) -> str:
        return self.dispatch.transport.cancel(inv_id).value

    def finished(self, inv_id: str) -> bool:
        return self.dispatch.transport.get(inv_id).state in FINISHED

    def set_priority(self, inv_id: str, priority: float) -> None:
        self.dispatch.transport.set_priority(inv_id, priority)

    def update(self, **settings: Any) -> QueueSpec:
        return self._update(settings)


class PriorityQueue(Queue):
    """Highest priority first, FIFO among equals. A call's priority is its keyword
    argument named ``priority_field`` (default ``"priority"``), else ``_priority=``."""

    fixed_kind = "priority"


class BoltzmannQueue(PriorityQueue):
    """Among the pending, choose with probability ∝ exp(priority / temperature);
    ``anneal`` lowers the temperature over time or claims."""

    fixed_kind = "boltzmann"


class FILOQueue(Queue):
    """Newest pending first."""

    fixed_kind = "filo"


class SyncPriorityQueue(SyncQueue):
    fixed_kind = "priority"


class SyncBoltzmannQueue(SyncPriorityQueue):
    fixed_kind = "boltzmann"


class SyncFILOQueue(SyncQueue):
    fixed_kind = "filo"


class Pool(Queue):
    """Deprecated: ``Pool(name, size=N)`` is ``Queue(name, elasticity={"kind": "fixed",
    "max": N})``."""

    def __init__(self, name: str, size: int, **kwargs: Any) -> None:
        warnings.warn(
            'Pool is deprecated; use Queue(name, elasticity={"kind": "fixed", "max": size})',
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(name, elasticity={"kind": "fixed", "max": size}, **kwargs)


SYNC_OF: dict[type[_QueueHandle], type[SyncQueue]] = {
    Queue: SyncQueue,
    Pool: SyncQueue,
    PriorityQueue: SyncPriorityQueue,
    BoltzmannQueue: SyncBoltzmannQueue,
    FILOQueue: SyncFILOQueue,
}


def handle_for(name: str, **options: Any) -> Queue:
    """The handle ``@udf(queue="name", **options)`` means: the options pick the class."""
    if "temperature" in options or "anneal" in options:
        return BoltzmannQueue(name, **options)
    if "priority_field" in options:
        return PriorityQueue(name, **options)
    return Queue(name, **options)
