"""What producers do: submit (idempotently), read, watch and wait, cancel, re-prioritise."""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import Conflict, IdempotencyConflict, InvalidRequest, UnknownInvocation
from .base import PlaneBase
from .changes import LOOK_AGAIN
from .ids import nameable
from .kinds import check_retry
from .model import FINISHED, Invocation, QueueSpec, RetryPolicy, State, Submission
from .ordering import order_key
from .workers import claim_of

if TYPE_CHECKING:
    from ..transport import Unwatch

__all__ = ["ProducerOps", "request_digest"]


def request_digest(sub: Submission) -> str:
    """What makes two submissions "the same request" for idempotency."""
    h = hashlib.sha256()
    h.update(sub.queue.encode())
    h.update(b"\0")
    h.update(sub.payload)
    h.update(repr((sub.priority, sub.delay, sub.timeout, sub.max_attempts, sub.retry)).encode())
    return h.hexdigest()


class ProducerOps(PlaneBase):
    def submit(self, subs: Sequence[Submission]) -> list[str]:
        """Accept invocations; return their ids once they are durable.

        A submission whose id exists with the same request is a replay (its id is
        returned again); with another request it raises :class:`IdempotencyConflict`.
        The queue must exist (see :meth:`ensure_queue`). Every submission is checked
        before any is written, and all are written in one store call, so a store can
        write a batch's records together; each record is accepted or refused on its own.
        """
        now = self.clock.now()
        specs: dict[str, QueueSpec] = {}
        idle: set[str] = set()
        invs = [self._pending_record(sub, specs, idle, now) for sub in subs]
        # (a claim waiting for a lone call takes it as it is written: _hand_over)
        handed = None
        if len(invs) == 1 and self._changes.takers:
            handed = self._hand_over(invs[0], specs[invs[0].queue], now)
        taker = None if handed is None else handed[0]
        if handed is not None:
            invs[0] = handed[1]
        told = self._changes.told
        given = taken = False
        try:
            existing = self.store.insert_many(invs)
            given = taker is not None and existing[0] is None  # (not a replay's record)
            if taker is not None and given:
                # First, before anything else may fail: the record is written leased.
                taker.box.append(claim_of(invs[0]))
        finally:
            # (nothing handed, the write failed or found a replay: back on the books)
            if taker is not None:
                taken = self._changes.handed(taker)
        if taker is not None and given and not taken:  # (its claim gave up on this write)
            self._hand_back(list(taker.box))
        self._changes.submitted(
            (inv.id for inv, found in zip(invs, existing, strict=True) if found is None), told
        )
        for name in specs:
            self._touch(name, now)
        if not given:
            self._changes.notify(
                len(invs),
                specs,
                [inv.id for inv in invs],
                due_now=all(inv.available_at <= now for inv in invs),
            )
        self.wake_idle(idle, marked=True)
        # A claim that finds nothing marks its queues idle, then looks once more. One that
        # did both between this submit's read of the mark and its write was woken by no
        # one above, and its workers would wait out their fallback claim (120 s): the
        # other queues' marks are read again, strongly, now that the records exist.
        self.wake_idle(set(specs) - idle)
        for inv, found in zip(invs, existing, strict=True):
            if found is not None and found.request_digest != inv.request_digest:
                raise IdempotencyConflict(f"invocation {inv.id!r} exists with a different request")
        return [inv.id for inv in invs]

    def _pending_record(
        self, sub: Submission, specs: dict[str, QueueSpec], idle: set[str], now: float
    ) -> Invocation:
        """The new record a valid submission stands for (raises for an invalid one or a
        missing queue); ``specs`` caches the queues read so far, ``idle`` gathers those
        of them marked idle (their workers watch wake objects: see :meth:`wake_idle`)."""
        _validate_submission(sub)
        spec = specs.get(sub.queue)
        if spec is None:
            spec = specs[sub.queue] = self._queue_marking_idle(sub.queue, idle)
        retry = sub.retry or (RetryPolicy(**spec.retry) if spec.retry else None)
        available = now + max(0.0, sub.delay)
        return Invocation(
            id=sub.id,
            queue=sub.queue,
            state=State.PENDING,
            payload=sub.payload,
            request_digest=request_digest(sub),
            order_key=order_key(spec.kind, sub.priority, available),
            priority=float(sub.priority),
            available_at=available,
            created_at=now,
            max_attempts=sub.max_attempts or self.max_attempts,
            timeout=sub.timeout,
            retry=retry,
        )

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        return self._read_many(ids)

    def state(self, inv_id: str) -> State:
        return self.get(inv_id).public_state(self.clock.now())

    def _wait_lately(
        self,
        ids: Sequence[str],
        timeout: float,
        since: float,
        lately: Callable[[Sequence[str], float], list[Invocation]],
    ) -> list[Invocation]:
        """A cursor wait: look at what finished after cursor ``since`` and, while none of
        ``ids`` is among it, sleep until the next finish anywhere. Nothing is
        registered per id, so a poll of ten thousand ids costs what finished lately;
        after a look that found none of them, the cursor moves past what it looked at
        (so a wait beside busy queues does not read their finishes again and again)."""
        deadline = time.monotonic() + timeout
        while True:
            count = self._changes.finishes
            mark = self.wait_cursor()  # before the look: all up to it is looked at
            now = self.clock.now()
            shown = (self.visible(r, now) for r in lately(ids, since))
            done = [r for r in shown if r is not None]
            left = deadline - time.monotonic()
            if done or left <= 0 or self._changes.closed:
                return done
            since = max(since, mark)
            # (parked, it is looked at again on a finish only: a cross-process one too,
            # which the poller counts)
            if not self._changes.wait_finish(
                count, min(left, LOOK_AGAIN), until=deadline, parked=left
            ):
                return done  # parked: the event loop holding the request asks again

    def wait_cursor(self) -> float:
        """The ``since`` for the next :meth:`wait` on the same ids, taken *before* this
        wait looks, so a finish committed while it looked is looked at again (an id
        answered twice is harmless; one missed would hang): the store's finish sequence
        (``finish_cursor``), or 0 for a store without one (it ignores ``since``)."""
        cursor = getattr(self.store, "finish_cursor", None)
        return float(cursor()) if callable(cursor) else 0.0

    def watch(self, ids: Sequence[str], callback: Callable[[Invocation], None]) -> Unwatch:
        """Call ``callback(record)`` once for each id when it reaches a finished state.

        Already-finished ids fire at once (from this thread). Unknown ids raise
        :class:`UnknownInvocation` before anything is registered. Returns a function
        that removes the watch.
        """
        ids = list(dict.fromkeys(ids))
        unwatch = self._changes.watch(ids, callback)
        if self._changes.fresh(ids):
            return unwatch  # (known to exist, unfinished: the watch hears of the finish)
        known, finished = self._finished_among(ids)
        if len(known) != len(ids):
            unwatch()
            missing = sorted(set(ids) - known)
            raise UnknownInvocation(f"no invocation {missing[0]!r} on this plane")
        self._changes.deliver(finished)
        return unwatch

    def _finished_among(self, ids: list[str]) -> tuple[set[str], list[Invocation]]:
        """The ids the plane shows and the records of the finished ones. A store that
        can answer without decoding every record (``finished_among``) does: a wait on
        thousands of ids, of which a few have finished, reads those few."""
        light = getattr(self.store, "finished_among", None)
        if not callable(light):
            recs = self._read_many(ids)
            return {r.id for r in recs}, [r for r in recs if r.state in FINISHED]
        now = self.clock.now()
        expiry, done = light(ids)
        shown = {i for i, exp in expiry.items() if exp is None or exp >= now - self.tombstone}
        visible = (self.visible(rec, now) for rec in done)
        return shown, [rec for rec in visible if rec is not None and rec.state in FINISHED]

    def wait(
        self, ids: Sequence[str], timeout: float, *, since: float | None = None
    ) -> list[Invocation]:
        """Block until at least one of ``ids`` is finished or ``timeout`` passes.

        Returns the finished records among ``ids`` (possibly none). With ``since`` (the
        cursor of an earlier wait on these ids, see :meth:`wait_cursor`) the ids
        are known to exist and ids finished before ``since`` have been answered already:
        a store that can find what finished lately (``finished_since``) then reads only
        that, not every id — what keeps a wait on thousands of ids cheap.
        """
        lately = getattr(self.store, "finished_since", None)
        if since is not None and callable(lately):
            return self._wait_lately(ids, timeout, since, lately)
        done: list[Invocation] = []
        event = threading.Event()

        def on_done(rec: Invocation) -> None:
            done.append(rec)
            if not event.is_set():  # (a look may hand in thousands)
                event.set()

        count = self._changes.finishes  # before the watch looks: a later finish is a change
        unwatch = self.watch(ids, on_done)
        deadline = time.monotonic() + timeout
        kept = False
        try:
            # in slices, so closing the plane ends the wait promptly
            while not event.is_set() and not self._changes.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if self._changes.parks:  # held by an event loop: it asks again on a finish
                    # of these ids (the watch brings it, the poller's for another
                    # process's write too), not on a timer
                    if not self._changes.wait_finish(
                        count, min(left, LOOK_AGAIN), until=deadline, parked=left
                    ):
                        # parked: the watch stays, so the records a finish brings are
                        # the answer without a second look (the holder releases it)
                        self._changes.keep(done, unwatch)
                        kept = True
                    break
                event.wait(min(left, LOOK_AGAIN))
        finally:
            if not kept:
                unwatch()
        return list(done)

    def cancel(self, inv_id: str) -> State:
        """Cancel a scheduled, pending or running invocation; return its state after.

        A running one is marked cancelled at once (its result will be refused) and its
        worker learns it at the next heartbeat. Finished invocations stay as they are.
        """
        while True:
            rec = self.get(inv_id)
            if rec.state in FINISHED:
                return rec.state
            now = self.clock.now()
            changes: dict[str, Any] = {
                "state": State.CANCELLED,
                "finished_at": now,
                "expires_at": now + self.retention,
            }
            if rec.state is State.PENDING:
                expect: dict[str, Any] = {"state": State.PENDING, "attempt": rec.attempt}
            else:
                expect = {"state": State.RUNNING, "lease_token": rec.lease_token}
            updated = self.store.update_if(inv_id, expect, changes)
            if updated is not None:
                if rec.state is State.PENDING:  # (no slot freed: no queue to wake)
                    self._changes.finished([updated])
                else:
                    self._finished([updated])
                return updated.state

    def list_invocations(
        self, queue: str, state: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Invocation]:
        """A queue's invocations by id, after the id ``after``; ``state`` filters by
        public state."""
        if state is not None and state not in {s.value for s in State}:
            raise InvalidRequest(f"unknown state {state!r}")
        if after is not None and not nameable(after):
            raise InvalidRequest(
                f"cursor must be an invocation id (a page's next): {_quoted(after)}"
            )
        found: list[Invocation] = []
        while len(found) < limit:
            now, want = self.clock.now(), limit - len(found)
            page = self.store.list_invocations(queue, state, now, after, want)
            found += [r for r in (self.visible(rec, now) for rec in page) if r is not None]
            if len(page) < want:
                break  # the store has no more
            after = page[-1].id  # some were past their tombstone: read on
        return found

    def retry(self, inv_id: str) -> Invocation:
        """Run a failed or dead invocation again, as a new attempt with a fresh budget of
        ``max_attempts`` claims. Other states are refused."""
        while True:
            rec = self.get(inv_id)
            if rec.state not in (State.FAILED, State.DEAD):
                raise Conflict(  # (out of order: a request fine in another state)
                    f"invocation {inv_id!r} is {rec.state.value}; only failed or dead ones retry"
                )
            if rec.payload is None:
                raise InvalidRequest(f"invocation {inv_id!r} passed retention; it cannot retry")
            now = self.clock.now()
            changes: dict[str, Any] = {
                "state": State.PENDING,
                "available_at": now,
                "max_attempts": rec.attempt + self.max_attempts,
                "finished_at": None,
                "expires_at": None,
                "result": None,
                "lease_token": None,
                "lease_expires_at": None,
                "worker": None,
            }
            expect = {"state": rec.state, "attempt": rec.attempt}
            updated = self.store.update_if(inv_id, expect, changes)
            if updated is not None:
                self._changes.notify()
                self.wake_idle([rec.queue])
                return updated

    def set_priority(self, inv_id: str, priority: float) -> Invocation:
        """Change a pending invocation's priority (its place in a priority queue)."""
        if not math.isfinite(priority):
            raise InvalidRequest("priority must be a finite number")
        while True:
            rec = self.get(inv_id)
            if rec.state is not State.PENDING:
                raise Conflict(
                    f"invocation {inv_id!r} is {rec.state.value}; only pending ones move"
                )
            spec = self.get_queue(rec.queue)
            changes = {
                "priority": float(priority),
                "order_key": order_key(spec.kind, priority, rec.available_at),
            }
            expect = {"state": State.PENDING, "order_key": rec.order_key}
            updated = self.store.update_if(inv_id, expect, changes)
            if updated is not None:
                self._changes.notify()
                return updated


def _quoted(name: str) -> str:
    """``name`` quoted, one far past any limit cut to its first 60 characters and its
    length (as the API's one-line reasons cut names: an id may hold spaces, which they
    do not cut at)."""
    if len(name) <= 256:
        return repr(name)
    cut = repr(name[:60])
    return f"{cut[:-1]}…{cut[-1]} ({len(name):,} characters)"


def _validate_submission(sub: Submission) -> None:
    if not nameable(sub.id):
        raise InvalidRequest(
            "invocation id must be 1-128 letters, digits or -._~()'!*:@,;=+&$%<> []{}|^"
            f" (no / ? # quotes or control characters): {_quoted(sub.id)}"
        )
    try:
        _check_options(sub)
    except InvalidRequest as exc:  # (which of a batch's calls: its id)
        raise InvalidRequest(f"invocation {sub.id!r}: {exc}") from None


def _check_options(sub: Submission) -> None:
    if sub.timeout is not None and not sub.timeout > 0:
        raise InvalidRequest("timeout must be > 0 seconds")
    if sub.timeout is not None and not math.isfinite(sub.timeout):
        raise InvalidRequest("timeout must be a finite number of seconds")
    if sub.max_attempts is not None and sub.max_attempts < 1:
        raise InvalidRequest("max_attempts must be at least 1")
    if not math.isfinite(sub.priority):
        raise InvalidRequest("priority must be a finite number")
    if not math.isfinite(sub.delay) or sub.delay < 0:
        raise InvalidRequest("delay must be a finite number of seconds >= 0")
    check_retry(sub.retry)
