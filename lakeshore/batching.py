"""``with dls.batch():`` — many submits in few requests, sent while the block runs.

::

    with dls.batch():
        ids = [square.submit(i) for i in range(10_000)]
    # here the plane has every one of them

Outside a batch each ``submit()`` is one request and returns once the plane has the
invocation. Inside one, ``submit()`` returns at once with the id the client made, and
the calls go to the plane in batches of up to ``max_batch`` (the plane's limit) from a
sender thread, while the block goes on making more. **The block's exit is the durability
point:** it sends what is left and waits until the plane has acknowledged every call,
and it raises if any could not be submitted (the exception's notes name how many). A
``result()`` inside the block first sends what is buffered, so waiting on an id made in
the block works.

Ids the client makes in a batch (not those given by ``_id=`` or an idempotency key) come
in groups of up to 16 per queue (see :mod:`dreamlake.lakeshore.plane.ids`), so a store can
claim and complete many of them in one write.

Submits are idempotent on their ids, so a batch that failed part way can be submitted
again with the same ids (``_id=``) without doubling anything. The order of submission is
kept: one sender sends the batches one after the other. The exit also sends when the
block raised — an id handed out is never silently dropped — and then re-raises the
block's own exception (a failure to submit is added as a note).

A batch is bound to the context it was opened in (a ``contextvars`` variable): threads
and tasks started inside see it only if they copy the context. ``async with`` works the
same way.
"""

from __future__ import annotations

import contextvars
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from .plane.ids import GROUP_SIZE
from .submit import IdGroups

if TYPE_CHECKING:
    from .dispatch import Dispatch
    from .plane.model import QueueSpec, Submission

__all__ = ["Batch", "batch", "current"]

_current: contextvars.ContextVar[Batch | None] = contextvars.ContextVar(
    "lakeshore_batch", default=None
)


def current() -> Batch | None:
    """The batch open in this context, if any."""
    return _current.get()


@dataclass
class _Group:
    """Buffered submits that go in one request: one dispatch, one queue spec."""

    dispatch: Dispatch
    spec: QueueSpec
    strict: bool
    check: tuple[str, ...]
    subs: list[Submission]


class Batch:
    """Buffers submits made in its block and sends them in batches (see the module)."""

    def __init__(self, size: int | None = None) -> None:
        if size is not None and size < 1:
            raise ValueError("batch size must be at least 1")
        self.size = size
        #: invocations the plane has acknowledged so far
        self.submitted = 0
        self._open: dict[tuple[int, str], _Group] = {}
        self._outbox: deque[_Group] = deque()
        self._cond = threading.Condition()
        self._sending = 0
        self._error: BaseException | None = None
        self._unsent = 0
        self._sender: threading.Thread | None = None
        self._closed = False
        self._token: contextvars.Token[Batch | None] | None = None
        self._ids = IdGroups()

    # --- what submits call ----------------------------------------------------------------
    def new_id(self, dispatch: Dispatch, queue: str) -> str:
        """An id for a submit to ``queue`` in this batch: the next of that queue's group."""
        return self._ids.next_id((id(dispatch), queue))

    def add(
        self,
        dispatch: Dispatch,
        subs: list[Submission],
        *,
        spec: QueueSpec,
        strict: bool,
        check: Iterable[str],
    ) -> list[str]:
        """Buffer ``subs`` and return their ids (known to the plane by the block's exit)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("this batch is closed: submit outside it")
            key = (id(dispatch), spec.name)
            group = self._open.get(key)
            if group is None or group.spec != spec:
                if group is not None:
                    self._queue(self._open.pop(key))
                group = self._open[key] = _Group(dispatch, spec, strict, tuple(check), [])
            group.subs.extend(subs)
            if len(group.subs) >= (self.size or _whole_groups(dispatch.transport_batch_size())):
                self._queue(self._open.pop(key))
        return [s.id for s in subs]

    def flush(self) -> None:
        """Send everything buffered and wait until the plane has it; raise what failed."""
        with self._cond:
            for group in self._open.values():
                self._queue(group)
            self._open.clear()
            self._cond.wait_for(lambda: not self._outbox and not self._sending)
            error, self._error = self._error, None
        if error is not None:
            raise error

    # --- the sender -----------------------------------------------------------------------
    def _queue(self, group: _Group) -> None:  # with self._cond held
        self._outbox.append(group)
        if self._sender is None:
            self._sender = threading.Thread(
                target=self._send_loop, name="lakeshore-batch", daemon=True
            )
            self._sender.start()
        self._cond.notify_all()

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._outbox) or self._closed)
                if not self._outbox:
                    return
                group = self._outbox.popleft()
                self._sending += 1
                failed = self._error is not None
            try:
                if failed:  # after a failure nothing more is sent: the exit raises
                    self._unsent += len(group.subs)
                else:
                    group.dispatch.submit(
                        group.subs, spec=group.spec, strict=group.strict, check=group.check
                    )
                    self.submitted += len(group.subs)
            except BaseException as exc:  # handed to the thread that flushes
                self._unsent += len(group.subs)
                with self._cond:
                    self._error = self._error or exc
            finally:
                with self._cond:
                    self._sending -= 1
                    self._cond.notify_all()

    def _finish(self) -> None:
        try:
            self.flush()
        except BaseException as exc:
            if self._unsent:
                exc.add_note(
                    f"{self._unsent} invocations of this batch were not submitted "
                    f"({self.submitted} were); submit them again with the same ids"
                )
            raise
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._sender is not None:
                self._sender.join()

    # --- the block --------------------------------------------------------------------------
    def __enter__(self) -> Batch:
        if self._token is not None or self._closed:
            raise RuntimeError("a batch is entered once")
        self._token = _current.set(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave()
        self._end(exc)

    async def __aenter__(self) -> Batch:
        return self.__enter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        import asyncio

        self._leave()
        await asyncio.to_thread(self._end, exc)  # it waits for the plane: off the loop

    def _leave(self) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None

    def _end(self, exc: BaseException | None) -> None:
        """Send the rest; a failure raises, or is noted on the block's own exception."""
        if exc is None:
            self._finish()
            return
        try:
            self._finish()
        except BaseException as failed:
            exc.add_note(f"and submitting the batch failed too: {failed!r}")


def _whole_groups(limit: int) -> int:
    """A request's calls by default: the plane's limit, cut to whole id groups (so no
    group of ids is split between two requests), or the limit if it is below a group."""
    return limit - limit % GROUP_SIZE or limit


def batch(size: int | None = None) -> Batch:
    """Submit in batches while the block runs (see the module). ``size`` caps a request's
    calls (default: the plane's ``max_batch``)."""
    return Batch(size)
