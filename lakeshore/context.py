"""Run contexts: ``with dls.context.run(run_id):`` scopes queues to one run.

A queue handle made with ``scope="run"`` submits to ``<name>.run-<id>`` while a run is
active. When the ``with`` block ends, every run-scoped queue it used is marked to be
removed by the plane once drained (its finished invocations stay until retention).

The active run is a :class:`contextvars.ContextVar`: each thread has its own, and
asyncio tasks inherit the run of the code that created them. To carry a run into a
thread you start, run the thread's target in ``contextvars.copy_context()``.
"""

from __future__ import annotations

import contextvars
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dispatch import Dispatch

__all__ = ["Run", "current_run", "run"]


@dataclass
class Run:
    id: str
    #: run-scoped queues used in this run, per Dispatch
    used: dict[int, tuple[Dispatch, set[str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def note(self, dispatch: Dispatch, queue: str) -> None:
        with self._lock:
            self.used.setdefault(id(dispatch), (dispatch, set()))[1].add(queue)


_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("lakeshore_run", default=None)


def current_run() -> Run | None:
    """The run active in this thread or task, if any."""
    return _current.get()


@contextmanager
def run(run_id: str | None = None) -> Iterator[Run]:
    """Make ``run_id`` (a fresh one if omitted) the active run inside the block."""
    active = Run(run_id or uuid.uuid4().hex[:12])
    token = _current.set(active)
    try:
        yield active
    finally:
        _current.reset(token)
        for dispatch, names in active.used.values():
            for name in names:
                dispatch.transport.update_queue(name, delete_when_drained=True)
