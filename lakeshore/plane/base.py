"""What every part of the plane shares: its settings, its store and clock, and the
reads the other parts build on."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias, cast

from .. import logs
from ..clock import Clock
from ..errors import QueueNotFound, UnknownInvocation
from .changes import Changes, Taker
from .kinds import running_cap
from .model import FINISHED, Invocation, QueueSpec
from .store import Store, wake_objects

__all__ = ["PlaneBase", "Update"]

_log = logging.getLogger("dreamlake.lakeshore.plane")

#: one compare-and-set for :meth:`Store.update_many_if`: ``(id, expect, changes)``
Update: TypeAlias = tuple[str, Mapping[str, Any], Mapping[str, Any]]

#: seconds a plane trusts what it read of whether a queue has a running cap (see
#: :meth:`PlaneBase._finished`): a cap set from another process wakes on finishes
#: within this
CAP_TTL = 5.0


class PlaneBase:
    """State and shared reads of a :class:`~.core.Plane` (see there for the settings)."""

    store: Store
    clock: Clock
    lease_seconds: float
    max_attempts: int
    retention: float
    tombstone: float
    sweep_interval: float
    #: keep a succeeded invocation's payload (False: complete drops it, as nothing runs
    #: it again; its record is then smaller to write and to keep, but shows no call)
    keep_payload: bool
    _rng: random.Random
    _inline_limit: int
    _changes: Changes
    _next_sweep: float
    _next_purge: float
    _sweep_lock: threading.Lock
    _touched: dict[str, float]
    #: queue → (monotonic time it is read again, whether it has a running cap)
    _caps: dict[str, tuple[float, bool]]
    #: told when the plane fails an attempt itself (its lease ran out past the call's
    #: timeout: the worker's late answer, or the sweep), with the record as it ran, the
    #: outcome ("failed" for good, or "retried" by the call's policy) and the error
    #: type; a worker's own answers are counted where they are taken (the service)
    on_attempt_ended: Callable[[Invocation, str, str | None], None] | None

    def now(self) -> float:
        return self.clock.now()

    def batch(self, many: bool = True) -> contextlib.AbstractContextManager[object]:
        """Group the store writes of the block (one SQLite commit for a batch of
        completions); a no-op for stores that write item by item (DynamoDB), and when
        not ``many`` (one write needs no group, and the group holds the store's lock
        for the whole block). Every lifecycle rule still applies to each invocation."""
        transaction = getattr(self.store, "transaction", None)
        if not many or not callable(transaction):
            return contextlib.nullcontext()
        return cast(contextlib.AbstractContextManager[object], transaction())

    def get_queue(self, name: str) -> QueueSpec:
        spec = self.store.get_queue(name)
        if spec is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        return spec

    def _queue_marking_idle(self, name: str, idle: set[str]) -> QueueSpec:
        """:meth:`get_queue` for a submit: on a store with wake objects the same read
        tells whether the queue is marked idle (then its name joins ``idle``)."""
        wakes = wake_objects(self.store)
        if wakes is None:
            return self.get_queue(name)
        spec, marked = wakes.queue_and_idle(name)
        if spec is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        if marked:
            idle.add(name)
        return spec

    def wake_idle(self, queues: Iterable[str], *, marked: bool = False) -> None:
        """New work on ``queues``, after it is written: on a store with wake objects (the
        DynamoDB + S3 plane) the workers watching an idle one's object look now, not at
        their fallback claim. A submit (for the queues its spec read found marked:
        ``marked``), a retry, a failure its policy retries, a hand-back, a lease the
        sweep hands on and a queue's settings changed or resumed come through here,
        whoever asks it of the plane (an API request, the ``aws://`` transport, the
        sweeper), and a finish on a queue with a running cap (:meth:`_finished`). A
        queue not known marked is read first, strongly: a claim that finds nothing sets
        the mark, then looks once more, so a mark set before this read began must be
        seen — that claim's look may have been made before the write this wake follows
        (an eventually consistent read could miss it, and the queue's workers would wait
        out their fallback claim). Best effort: the write it follows stands whatever
        happens here; a wake that fails is logged, and its queue's workers claim at their
        fallback."""
        wakes = wake_objects(self.store)
        if wakes is None:
            return
        for name in sorted(set(queues)):
            try:
                idle = marked or wakes.queue_and_idle(name, consistent=True)[1]
                if idle and wakes.wake(name):
                    logs.event(_log, "queue.woken", queue=name)
            except Exception:
                _log.warning(
                    "waking idle queue %r failed; its workers claim at their fallback",
                    name,
                    exc_info=True,
                )

    def _finished(self, records: Iterable[Invocation]) -> None:
        """Records written finished, or pending again: the process's waits are told.
        On a store with wake objects a finish on a queue with a running cap also wakes
        the queue (:meth:`wake_idle`: if it is marked idle): it frees a slot, and the
        workers the cap turned away watch the queue's object. The worker that freed the
        slot may claim no more (its other slots wait on that object too, it is
        stopping, it serves other queues)."""
        done = list(records)
        self._changes.finished(done)
        if wake_objects(self.store) is None:
            return
        capped = []
        for name in sorted({r.queue for r in done if r.state in FINISHED}):
            try:
                if self._capped(name):
                    capped.append(name)
            except Exception:  # (best effort, as the wake itself: the finish stands)
                _log.warning("reading queue %r's running cap failed", name, exc_info=True)
        self.wake_idle(capped)

    def _capped(self, name: str) -> bool:
        """Whether the queue has a running cap, as read in the last :data:`CAP_TTL`
        seconds (a queue that does not exist has none)."""
        now = time.monotonic()
        known = self._caps.get(name)
        if known is not None and known[0] > now:
            return known[1]
        spec = self.store.get_queue(name)
        capped = spec is not None and running_cap(spec) is not None
        if len(self._caps) > 4096:
            self._caps.clear()
        self._caps[name] = (now + CAP_TTL, capped)
        return capped

    def get(self, inv_id: str) -> Invocation:
        """The record of one invocation. Raises :class:`UnknownInvocation`."""
        rec = self._read(inv_id)
        if rec is None:
            raise UnknownInvocation(f"no invocation {inv_id!r} on this plane")
        return rec

    def visible(self, rec: Invocation | None, now: float | None = None) -> Invocation | None:
        """What the plane shows of a stored record: nothing once its tombstone has
        passed (the id is unknown), no payload and result once it has expired.

        Every read of records goes through here, so a store may leave both steps of
        :meth:`Store.purge` to its own expiry (DynamoDB's TTL) and still answer as if it
        had purged on time. The record is changed in place and returned.
        """
        if rec is None or rec.expires_at is None:
            return rec
        now = self.clock.now() if now is None else now
        if rec.expires_at < now - self.tombstone:
            return None
        if now >= rec.expires_at:
            rec.payload = None
            rec.result = None
        return rec

    def _read(self, inv_id: str) -> Invocation | None:
        """One record as the plane shows it (:meth:`visible`), None when unknown."""
        return self.visible(self.store.get(inv_id))

    def _read_many(self, ids: Sequence[str]) -> list[Invocation]:
        """The records among ``ids`` the plane shows (:meth:`visible`)."""
        now = self.clock.now()
        shown = (self.visible(rec, now) for rec in self.store.get_many(ids))
        return [rec for rec in shown if rec is not None]

    def _update_where(
        self, updates: Sequence[Update | None], *, deadline_after: float | None = None
    ) -> list[Invocation | None]:
        """:meth:`Store.update_many_if` over the updates given, in one store call (none
        when there is nothing to write); None in place of each missing one (an answer
        refused before it reached the store), so answers line up with ``updates``."""
        given = [update for update in updates if update is not None]
        answers = self.store.update_many_if(given, deadline_after=deadline_after) if given else []
        written = iter(answers)
        return [None if update is None else next(written) for update in updates]

    def _hand_over(
        self, inv: Invocation, spec: QueueSpec, now: float
    ) -> tuple[Taker, Invocation] | None:
        """A parked claim to hand the new record of a lone submit to, and the record
        leased to it (see :meth:`WorkerOps._hand_over <.workers.WorkerOps._hand_over>`);
        None here."""
        return None

    def _hand_back(self, claims: list[Any]) -> None:
        """Claims handed over that no claim took, pending again (see
        :meth:`WorkerOps._hand_back <.workers.WorkerOps._hand_back>`); none here."""

    def _touch(self, queue: str, now: float) -> None:
        """Record activity on a queue, at most once a second per queue and plane."""
        if self._touched.get(queue, -1.0) + 1.0 <= now:
            self._touched[queue] = now
            self.store.touch_queue(queue, now)

    def _drained(self, name: str, now: float) -> bool:
        raw = self.store.counts(name, now)
        return not (raw.get("pending", 0) + raw.get("scheduled", 0) + raw.get("running", 0))
