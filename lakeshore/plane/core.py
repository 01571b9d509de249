"""The plane core: every lifecycle rule of an invocation, in one place.

::

    submit ─▶ pending ──claim──▶ running ──complete──▶ succeeded
      │  (scheduled while       │   │  └──fail──▶ failed   (or back to pending: retry policy)
      │   its delay runs)       │   └──lease expires──▶ pending (attempt + 1) │ dead
      └──────────cancel─────────┴──cancel──▶ cancelled

Rules the core enforces (stores only persist and compare-and-set):

- A claim leases an invocation to one worker with a fresh lease token. Only the holder
  of the current token may heartbeat, complete or fail it, so a result is recorded
  exactly once even when execution happens more than once.
- A lease that runs out (no heartbeat) is swept: back to pending with its place in the
  queue kept, or ``dead`` once ``max_attempts`` claims have been made. A per-invocation
  ``timeout`` caps the lease: past it the invocation fails with a timeout error.
- A raise fails the invocation, unless its retry policy allows another try after a
  backoff. Worker death is always redelivered (up to ``max_attempts``).
- Submit is idempotent on the invocation id: the same id with the same request returns
  the existing invocation, with another request it is a conflict.
- Finished invocations keep their result for ``retention`` seconds; after that the plane
  answers "expired", which stays distinct from "unknown" for ``tombstone`` more seconds.

Every time comes from the injected clock; nothing here sleeps to let time pass.
"""

from __future__ import annotations

import hashlib
import math
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..clock import Clock, SystemClock
from ..errors import (
    IdempotencyConflict,
    InvalidRequest,
    LeaseLost,
    QueueNotFound,
    UnknownInvocation,
)
from .changes import Changes
from .kinds import (
    BOLTZMANN_CANDIDATES,
    anneal_origin,
    boltzmann_order,
    check_settings,
    running_cap,
    temperature,
    validate_spec,
)
from .model import (
    FINISHED,
    Claim,
    HeartbeatAnswer,
    Invocation,
    LogEntry,
    QueueSpec,
    RetryPolicy,
    State,
    Submission,
)
from .ordering import order_key
from .store import Store

__all__ = ["Plane", "request_digest"]

#: log chunk numbers per attempt (an entry's seq is attempt * span + n)
_LOG_SEQ_SPAN = 1_000_000_000
_MAX_PROGRESS_MESSAGE = 1000

#: how many expired leases one sweep pass handles
_SWEEP_BATCH = 500


def request_digest(sub: Submission) -> str:
    """What makes two submissions "the same request" for idempotency."""
    h = hashlib.sha256()
    h.update(sub.queue.encode())
    h.update(b"\0")
    h.update(sub.payload)
    h.update(repr((sub.priority, sub.delay, sub.timeout, sub.max_attempts, sub.retry)).encode())
    return h.hexdigest()


class Plane:
    """The control plane over one :class:`~.store.Store`.

    Thread-safe: every decision is a compare-and-set on the store, so any number of
    threads (and, on a shared store, processes) may call it at once.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        lease_seconds: float = 60.0,
        max_attempts: int = 3,
        retention: float = 7 * 86400.0,
        tombstone: float = 30 * 86400.0,
        sweep_interval: float = 1.0,
        rng: random.Random | None = None,
        inline_limit: int = 256 * 1024,
    ) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.retention = retention
        self.tombstone = tombstone
        self.sweep_interval = sweep_interval
        self._rng = rng or random.Random()
        self._inline_limit = inline_limit
        self._changes = Changes(store)
        self._next_sweep = 0.0
        self._next_purge = 0.0
        self._sweep_lock = threading.Lock()
        self._touched: dict[str, float] = {}

    def now(self) -> float:
        return self.clock.now()

    def inline_limit(self) -> int:
        return self._inline_limit

    # ------------------------------------------------------------------ queues
    def ensure_queue(
        self, spec: QueueSpec, *, create: bool = True, check: Iterable[str] = ()
    ) -> QueueSpec:
        """Return the queue, creating it from ``spec`` when missing and ``create``.

        Raises :class:`QueueMismatch` when it exists and any setting named in ``check``
        differs from ``spec``; :class:`QueueNotFound` when missing and not ``create``.
        """
        validate_spec(spec)
        stored = self.store.get_queue(spec.name)
        if stored is None:
            if not create:
                raise QueueNotFound(f"queue {spec.name!r} does not exist (strict mode)")
            now = self.clock.now()
            stored = self.store.put_queue(anneal_origin(spec, now, 0), now)
        check_settings(spec, stored, check)
        return stored

    def get_queue(self, name: str) -> QueueSpec:
        spec = self.store.get_queue(name)
        if spec is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        return spec

    def list_queues(self) -> list[dict[str, Any]]:
        """Every queue with its last activity (submit or claim) and counts by state."""
        return [
            {"spec": spec, "last_activity": last, "counts": self.counts(spec.name)}
            for spec, last in self.store.list_queues()
        ]

    def prune_queues(self, older_than: float) -> list[str]:
        """Remove queues idle for ``older_than`` seconds with nothing pending or running.

        Their finished invocations stay until retention ends. Returns the names removed.
        """
        now = self.clock.now()
        removed = []
        for spec, last in self.store.list_queues():
            if last <= now - older_than and self._drained(spec.name, now):
                self.store.delete_queue(spec.name, invocations=False)
                removed.append(spec.name)
        return removed

    def _drained(self, name: str, now: float) -> bool:
        raw = self.store.counts(name, now)
        return not (raw.get("pending", 0) + raw.get("scheduled", 0) + raw.get("running", 0))

    def counts(self, name: str) -> dict[str, int]:
        """Invocations of a queue by public state (``scheduled`` split from pending)."""
        raw = self.store.counts(name, self.clock.now())
        return {s.value: raw.get(s.value, 0) for s in State}

    def update_queue(self, name: str, **settings: Any) -> QueueSpec:
        """Change a queue's settings live (``temperature``, ``anneal``, ``elasticity``,
        ...). A new ``anneal`` schedule starts now."""
        spec = self.get_queue(name)
        unknown = set(settings) - set(spec.settings())
        if unknown:
            raise InvalidRequest(f"unknown queue settings: {', '.join(sorted(unknown))}")
        new = QueueSpec(name=name, **{**spec.settings(), **settings})
        validate_spec(new)
        now = self.clock.now()
        if "anneal" in settings or "temperature" in settings:
            new = anneal_origin(new, now, self.store.queue_counter(name, 0))
        if not self.store.replace_queue(new, now):
            raise QueueNotFound(f"queue {name!r} does not exist")
        self._changes.notify()
        return new

    def delete_queue(self, name: str, *, force: bool = False) -> int:
        """Remove a queue. Without ``force`` only when nothing is pending or running."""
        self.get_queue(name)
        if not force:
            raw = self.store.counts(name, self.clock.now())
            busy = raw.get("pending", 0) + raw.get("scheduled", 0) + raw.get("running", 0)
            if busy:
                raise InvalidRequest(
                    f"queue {name!r} has {busy} pending or running invocations; use force"
                )
        return self.store.delete_queue(name)

    # ------------------------------------------------------------------ submit
    def submit(self, subs: Sequence[Submission]) -> list[str]:
        """Accept invocations; return their ids once they are durable.

        A submission whose id exists with the same request is a replay (its id is
        returned again); with another request it raises :class:`IdempotencyConflict`.
        The queue must exist (see :meth:`ensure_queue`).
        """
        now = self.clock.now()
        specs: dict[str, QueueSpec] = {}
        ids: list[str] = []
        for sub in subs:
            _validate_submission(sub)
            spec = specs.get(sub.queue) or self.get_queue(sub.queue)
            specs[sub.queue] = spec
            retry = sub.retry or (RetryPolicy(**spec.retry) if spec.retry else None)
            available = now + max(0.0, sub.delay)
            inv = Invocation(
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
            existing = self.store.insert(inv)
            if existing is not None and existing.request_digest != inv.request_digest:
                raise IdempotencyConflict(f"invocation {sub.id!r} exists with a different request")
            ids.append(sub.id)
        for name in specs:
            self._touch(name, now)
        self._changes.notify()
        return ids

    def _touch(self, queue: str, now: float) -> None:
        """Record activity on a queue, at most once a second per queue and plane."""
        if self._touched.get(queue, -1.0) + 1.0 <= now:
            self._touched[queue] = now
            self.store.touch_queue(queue, now)

    # ------------------------------------------------------------------ reading
    def get(self, inv_id: str) -> Invocation:
        """The record of one invocation. Raises :class:`UnknownInvocation`."""
        rec = self.store.get(inv_id)
        if rec is None:
            raise UnknownInvocation(f"no invocation {inv_id!r} on this plane")
        return rec

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        return self.store.get_many(ids)

    def state(self, inv_id: str) -> State:
        return self.get(inv_id).public_state(self.clock.now())

    def watch(
        self, ids: Sequence[str], callback: Callable[[Invocation], None]
    ) -> Callable[[], None]:
        """Call ``callback(record)`` once for each id when it reaches a finished state.

        Already-finished ids fire at once (from this thread). Unknown ids raise
        :class:`UnknownInvocation` before anything is registered. Returns a function
        that removes the watch.
        """
        ids = list(dict.fromkeys(ids))
        unwatch = self._changes.watch(ids, callback)
        recs = self.store.get_many(ids)
        if len(recs) != len(ids):
            unwatch()
            missing = sorted(set(ids) - {r.id for r in recs})
            raise UnknownInvocation(f"no invocation {missing[0]!r} on this plane")
        self._changes.finished(recs)
        return unwatch

    def wait(self, ids: Sequence[str], timeout: float) -> list[Invocation]:
        """Block until at least one of ``ids`` is finished or ``timeout`` passes.

        Returns the finished records among ``ids`` (possibly none).
        """
        done: list[Invocation] = []
        event = threading.Event()

        def on_done(rec: Invocation) -> None:
            done.append(rec)
            event.set()

        unwatch = self.watch(ids, on_done)
        try:
            event.wait(timeout)
        finally:
            unwatch()
        return list(done)

    # ------------------------------------------------------------------ cancel
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
                self._changes.finished([updated])
                return updated.state

    def set_priority(self, inv_id: str, priority: float) -> Invocation:
        """Change a pending invocation's priority (its place in a priority queue)."""
        if not math.isfinite(priority):
            raise InvalidRequest("priority must be a finite number")
        while True:
            rec = self.get(inv_id)
            if rec.state is not State.PENDING:
                raise InvalidRequest(
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

    # ------------------------------------------------------------------ workers
    def claim(
        self,
        queues: Sequence[str],
        worker: str,
        *,
        limit: int = 1,
        wait: float = 0.0,
        lease_seconds: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Claim]:
        """Lease up to ``limit`` invocations from ``queues`` (in the order given).

        With ``wait`` > 0, blocks up to that many seconds for work to arrive.
        """
        if limit < 1:
            raise InvalidRequest("claim limit must be at least 1")
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            generation = self._changes.generation
            self.maybe_sweep()
            claims = self._claim_now(queues, worker, limit, lease_seconds or self.lease_seconds)
            remaining = deadline - time.monotonic()
            if claims or remaining <= 0 or (should_stop is not None and should_stop()):
                return claims
            self._changes.wait(generation, min(remaining, self._next_due_in(queues)))

    def _next_due_in(self, queues: Sequence[str]) -> float:
        """Seconds until the earliest scheduled invocation of ``queues`` comes due."""
        now = self.clock.now()
        soonest = 0.25
        for name in queues:
            t = self.store.next_available_at(name)
            if t is not None and t > now:
                soonest = min(soonest, t - now)
        return max(soonest, 0.001)

    def _claim_now(
        self, queues: Sequence[str], worker: str, limit: int, lease_seconds: float
    ) -> list[Claim]:
        claims: list[Claim] = []
        for name in queues:
            spec = self.store.get_queue(name)
            if spec is None:
                continue
            while len(claims) < limit:
                got = self._claim_from(spec, worker, limit - len(claims), lease_seconds)
                claims.extend(got)
                if not got:
                    break
        for name in {c.queue for c in claims}:
            self._touch(name, self.clock.now())
        return claims

    def _claim_from(
        self, spec: QueueSpec, worker: str, want: int, lease_seconds: float
    ) -> list[Claim]:
        """One pass over the head of one queue; returns what it leased."""
        now = self.clock.now()
        cap = running_cap(spec)
        boltzmann = spec.kind == "boltzmann"
        # Ordered kinds take the head; Boltzmann samples among many.
        fetch = max(BOLTZMANN_CANDIDATES, want) if boltzmann else want + 1
        candidates = self.store.pending(spec.name, now, fetch)
        if boltzmann:
            claims_so_far = self.store.queue_counter(spec.name, 0)
            temp = temperature(spec, now, claims_so_far)
            ordered: Iterable[Invocation] = boltzmann_order(candidates, temp, self._rng)
        else:
            ordered = candidates
        got: list[Claim] = []
        for rec in ordered:
            claim = self._lease(rec, worker, now, lease_seconds, cap)
            if claim is None:
                if cap is not None and self._at_cap(spec.name, cap):
                    break
                continue  # lost a race for this one: try the next
            got.append(claim)
            if len(got) >= want:
                break
        if boltzmann and got:
            self.store.queue_counter(spec.name, len(got))
        return got

    def _at_cap(self, queue: str, cap: int) -> bool:
        return self.store.counts(queue, self.clock.now()).get("running", 0) >= cap

    def _lease(
        self, rec: Invocation, worker: str, now: float, lease_seconds: float, cap: int | None
    ) -> Claim | None:
        token = secrets.token_hex(8)
        expires = now + lease_seconds
        if rec.timeout is not None:
            expires = min(expires, now + rec.timeout)
        updated = self.store.update_if(
            rec.id,
            {"state": State.PENDING, "attempt": rec.attempt},
            {
                "state": State.RUNNING,
                "attempt": rec.attempt + 1,
                "lease_token": token,
                "lease_expires_at": expires,
                "worker": worker,
                "started_at": now,
            },
            running_below=cap,
        )
        if updated is None or updated.payload is None:
            return None
        return Claim(
            id=updated.id,
            queue=updated.queue,
            payload=updated.payload,
            lease_token=token,
            lease_expires_at=expires,
            attempt=updated.attempt,
            timeout=updated.timeout,
        )

    def heartbeat(
        self, inv_id: str, lease_token: str, *, lease_seconds: float | None = None
    ) -> HeartbeatAnswer:
        """Extend a lease. The answer says whether to keep going or stop (cancel)."""
        rec = self.store.get(inv_id)
        if rec is None or rec.lease_token != lease_token:
            return HeartbeatAnswer(inv_id, ok=False, cancel=True, lease_expires_at=None)
        if rec.state is not State.RUNNING:
            return HeartbeatAnswer(inv_id, ok=False, cancel=True, lease_expires_at=None)
        now = self.clock.now()
        expires = now + (lease_seconds or self.lease_seconds)
        timed_out = False
        if rec.timeout is not None and rec.started_at is not None:
            deadline = rec.started_at + rec.timeout
            expires = min(expires, deadline)
            timed_out = now >= deadline
        updated = self.store.update_if(
            inv_id,
            {"state": State.RUNNING, "lease_token": lease_token},
            {"lease_expires_at": expires},
        )
        if updated is None:
            return HeartbeatAnswer(inv_id, ok=False, cancel=True, lease_expires_at=None)
        return HeartbeatAnswer(inv_id, ok=True, cancel=timed_out, lease_expires_at=expires)

    def release(self, inv_id: str, lease_token: str) -> None:
        """Hand a claimed invocation back untried: pending again, the attempt not counted
        (a worker stopping cold). Raises :class:`LeaseLost` unless the token is current."""
        rec = self.store.get(inv_id)
        if rec is None or rec.state is not State.RUNNING or rec.lease_token != lease_token:
            raise self._refusal(inv_id, lease_token)
        changes = {
            "state": State.PENDING,
            "attempt": max(0, rec.attempt - 1),
            "lease_token": None,
            "lease_expires_at": None,
            "worker": None,
        }
        expect = {"state": State.RUNNING, "lease_token": lease_token}
        if self.store.update_if(inv_id, expect, changes) is None:
            raise self._refusal(inv_id, lease_token)
        self._changes.notify()

    def report_progress(
        self, inv_id: str, lease_token: str, fraction: float, message: str | None = None
    ) -> None:
        """Record how far a running job is (``fraction`` in [0, 1])."""
        if not (isinstance(fraction, int | float) and math.isfinite(fraction)) or not (
            0.0 <= fraction <= 1.0
        ):
            raise InvalidRequest("progress must be a fraction from 0 to 1")
        if message is not None and len(message) > _MAX_PROGRESS_MESSAGE:
            message = message[:_MAX_PROGRESS_MESSAGE]
        expect = {"state": State.RUNNING, "lease_token": lease_token}
        changes = {"progress": float(fraction), "progress_message": message}
        if self.store.update_if(inv_id, expect, changes) is None:
            raise self._refusal(inv_id, lease_token)

    def append_logs(
        self, inv_id: str, lease_token: str, chunks: Sequence[tuple[int, str, str]]
    ) -> None:
        """Store a running job's output: ``(n, stream, text)`` chunks numbered by the
        worker from 1 within its attempt (a resent chunk is stored once)."""
        rec = self.store.get(inv_id)
        if rec is None or rec.state is not State.RUNNING or rec.lease_token != lease_token:
            raise self._refusal(inv_id, lease_token)
        now = self.clock.now()
        entries = []
        for n, stream, text in chunks:
            if stream not in ("stdout", "stderr") or not 0 < n < _LOG_SEQ_SPAN:
                raise InvalidRequest("a log chunk is (n >= 1, 'stdout' | 'stderr', text)")
            entries.append(
                LogEntry(rec.attempt * _LOG_SEQ_SPAN + n, stream, text, now, rec.attempt)
            )
        self.store.append_logs(inv_id, entries)

    def read_logs(self, inv_id: str, after: int = 0, limit: int = 1000) -> list[LogEntry]:
        """A job's output after cursor ``after`` (an entry's ``seq``), every attempt in
        order. Raises :class:`UnknownInvocation`."""
        self.get(inv_id)
        return self.store.read_logs(inv_id, after, limit)

    def complete(self, inv_id: str, lease_token: str, result: bytes) -> None:
        """Record the result. Raises :class:`LeaseLost` unless the token is current
        and the invocation's timeout has not passed (then it fails as timed out)."""
        now = self.clock.now()
        updated = self.store.update_if(
            inv_id,
            {"state": State.RUNNING, "lease_token": lease_token},
            {
                "state": State.SUCCEEDED,
                "result": result,
                "error": None,
                "finished_at": now,
                "expires_at": now + self.retention,
                "lease_expires_at": None,
            },
            deadline_after=now,
        )
        if updated is None:
            raise self._refusal(inv_id, lease_token)
        self._changes.finished([updated])

    def fail(
        self, inv_id: str, lease_token: str, error: dict[str, Any], *, retryable: bool = True
    ) -> State:
        """Record a raise. Retried (back to scheduled) when the policy allows.

        Returns the state the invocation is in afterwards.
        """
        rec = self.store.get(inv_id)
        if rec is None or rec.state is not State.RUNNING or rec.lease_token != lease_token:
            raise self._refusal(inv_id, lease_token)
        if _past_deadline(rec, self.clock.now()):
            raise self._refusal(inv_id, lease_token)
        updated = self._fail_or_retry(rec, error, retryable=retryable)
        if updated is None:
            raise self._refusal(inv_id, lease_token)
        return updated.public_state(self.clock.now())

    def _fail_or_retry(
        self, rec: Invocation, error: dict[str, Any], *, retryable: bool
    ) -> Invocation | None:
        now = self.clock.now()
        expect = {"state": State.RUNNING, "lease_token": rec.lease_token}
        retries_used = rec.attempt - 1
        if retryable and rec.retry is not None and retries_used < rec.retry.max:
            changes: dict[str, Any] = {
                "state": State.PENDING,
                "available_at": now + rec.retry.delay(retries_used),
                "lease_token": None,
                "lease_expires_at": None,
                "worker": None,
                "error": error,
            }
        else:
            changes = {
                "state": State.FAILED,
                "error": error,
                "finished_at": now,
                "expires_at": now + self.retention,
                "lease_expires_at": None,
            }
        updated = self.store.update_if(rec.id, expect, changes)
        if updated is not None:
            self._changes.finished([updated])
        return updated

    def _refusal(self, inv_id: str, lease_token: str) -> Exception:
        """Why an answer was refused; records a timeout the answer came too late for."""
        rec = self.store.get(inv_id)
        if rec is None:
            return UnknownInvocation(f"no invocation {inv_id!r} on this plane")
        now = self.clock.now()
        held = rec.state is State.RUNNING and rec.lease_token == lease_token
        if held and _past_deadline(rec, now):
            self._expire_lease(rec, now)
            return LeaseLost(
                f"invocation {inv_id!r} ran past its timeout of {rec.timeout:g}s; "
                "its answer is refused"
            )
        if rec.state is State.CANCELLED:
            return LeaseLost(f"invocation {inv_id!r} was cancelled; its answer is refused")
        if rec.lease_token != lease_token:
            return LeaseLost(
                f"lease on {inv_id!r} is no longer held (expired and handed on); answer refused"
            )
        return LeaseLost(f"invocation {inv_id!r} is {rec.state.value}; answer refused")

    # ------------------------------------------------------------------ sweeping
    def maybe_sweep(self) -> None:
        """Sweep at most once per ``sweep_interval`` (called on every claim)."""
        now = self.clock.now()
        if now < self._next_sweep or not self._sweep_lock.acquire(blocking=False):
            return
        try:
            self._next_sweep = now + self.sweep_interval
            self._sweep(now)
        finally:
            self._sweep_lock.release()

    def sweep(self) -> int:
        """Handle every expired lease and purge past-retention data now."""
        with self._sweep_lock:
            return self._sweep(self.clock.now(), purge=True)

    def _sweep(self, now: float, *, purge: bool = False) -> int:
        handled = 0
        while True:
            batch = self.store.expired_leases(now, _SWEEP_BATCH)
            for rec in batch:
                if self._expire_lease(rec, now) is not None:
                    handled += 1
            if len(batch) < _SWEEP_BATCH:
                break
        if purge or now >= self._next_purge:
            self._next_purge = now + 60.0
            self.store.purge(now, now - self.tombstone)
            for spec, _ in self.store.list_queues():
                if spec.delete_when_drained and self._drained(spec.name, now):
                    self.store.delete_queue(spec.name, invocations=False)
        if handled:
            self._changes.notify()
        return handled

    def _expire_lease(self, rec: Invocation, now: float) -> Invocation | None:
        if _past_deadline(rec, now):
            error = {
                "type": "dreamlake.lakeshore.InvocationTimeout",
                "message": f"invocation exceeded its timeout of {rec.timeout:g}s",
                "traceback": "",
                "pickled": None,
            }
            return self._fail_or_retry(rec, error, retryable=True)
        expect = {"state": State.RUNNING, "lease_token": rec.lease_token}
        if rec.attempt >= rec.max_attempts:
            changes: dict[str, Any] = {
                "state": State.DEAD,
                "error": {
                    "type": "dreamlake.lakeshore.InvocationDead",
                    "message": (
                        f"lost its worker on each of {rec.attempt} attempts "
                        f"(max_attempts={rec.max_attempts})"
                    ),
                    "traceback": "",
                    "pickled": None,
                },
                "finished_at": now,
                "expires_at": now + self.retention,
                "lease_expires_at": None,
            }
        else:
            changes = {
                "state": State.PENDING,
                "lease_token": None,
                "lease_expires_at": None,
                "worker": None,
            }
        updated = self.store.update_if(rec.id, expect, changes)
        if updated is not None:
            self._changes.finished([updated])
        return updated

    # ------------------------------------------------------------------ blobs
    def put_blob(self, digest: str, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != digest:
            raise InvalidRequest("blob digest does not match its bytes")
        self.store.put_blob(digest, data, self.clock.now())

    def get_blob(self, digest: str) -> bytes:
        data = self.store.get_blob(digest)
        if data is None:
            raise UnknownInvocation(f"no blob {digest!r} on this plane")
        return data

    def missing_blobs(self, digests: Iterable[str]) -> set[str]:
        wanted = set(digests)
        return wanted - self.store.has_blobs(wanted)

    def close(self) -> None:
        self._changes.close()
        self.store.close()


def _past_deadline(rec: Invocation, now: float) -> bool:
    """Whether a running invocation's per-invocation timeout has passed."""
    return (
        rec.timeout is not None
        and rec.started_at is not None
        and now >= rec.started_at + rec.timeout
    )


def _validate_submission(sub: Submission) -> None:
    if not sub.id or len(sub.id) > 128:
        raise InvalidRequest("invocation id must be 1-128 characters")
    if sub.timeout is not None and not sub.timeout > 0:
        raise InvalidRequest("timeout must be > 0 seconds")
    if sub.max_attempts is not None and sub.max_attempts < 1:
        raise InvalidRequest("max_attempts must be at least 1")
    if not math.isfinite(sub.priority):
        raise InvalidRequest("priority must be a finite number")
    if not math.isfinite(sub.delay) or sub.delay < 0:
        raise InvalidRequest("delay must be a finite number of seconds >= 0")
    if sub.timeout is not None and not math.isfinite(sub.timeout):
        raise InvalidRequest("timeout must be a finite number of seconds")
