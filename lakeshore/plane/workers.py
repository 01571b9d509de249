"""What workers do, and what happens when they do not: claims and leases, heartbeats,
results and failures (with the retry policy), output and progress, and the sweep that
hands expired leases on."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import islice
from typing import Any

from ..entropy import random_hex
from ..errors import InvalidRequest, LeaseLost, UnknownInvocation
from ..progress import MAX_MESSAGE
from .base import PlaneBase, Update
from .changes import LOOK_AGAIN, Taker
from .kinds import (
    BOLTZMANN_CANDIDATES,
    boltzmann_order,
    check_queue_name,
    running_cap,
    temperature,
)
from .model import Claim, HeartbeatAnswer, Invocation, LogEntry, QueueSpec, State

__all__ = ["WorkerOps"]

_log = logging.getLogger("dreamlake.lakeshore.plane")

#: log chunk numbers per attempt (an entry's seq is attempt * span + n)
_LOG_SEQ_SPAN = 1_000_000_000
#: how many expired leases one sweep pass handles
_SWEEP_BATCH = 500


class WorkerOps(PlaneBase):
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
        for name in queues:
            check_queue_name(name)  # (a misspelt queue is said, not waited on forever)
        deadline = time.monotonic() + max(0.0, wait)
        seen: int | None = None
        owed: frozenset[str] | None = None  # (a wake the last look took: see Look)
        while True:
            if self._changes.closed:
                return []  # the plane is closing: answer empty, promptly
            # (a blocking claim's look lasts until its wait begins: see Changes.look)
            look = self._changes.look(owed) if wait > 0 else None
            # (a waiting claim on a store other processes write: their writes since
            # this look keep a submit from handing the claim a record, see
            # Changes.reserve)
            marker = None
            try:
                if self.store.shared and wait > 0:
                    marker = self.store.change_marker()
                generation = self._changes.generation if look is None else look.generation
                finishes = self._changes.finishes
                looked_at = self.clock.now()
                self.maybe_sweep()
                capped: list[bool] = []
                drained: list[bool] = []
                # (nothing new since a look found these queues with nothing to take: none)
                due_at = self._changes.drained_until(queues, generation, looked_at)
                claims = (
                    []
                    if due_at is not None
                    else self._claim_now(
                        queues, worker, limit, lease_seconds or self.lease_seconds, capped, drained
                    )
                )
                # (these queues left with nothing to take now, and no cap holding work back)
                keep = due_at is None and all(drained) and not any(capped)
                # (its queues had nothing to take now, as it left them: see _hand_over)
                emptied = keep or due_at is not None
                if not claims and seen is not None and generation != seen:
                    self._changes.pass_on(look)  # woken for work not ours: wake another
                seen = generation
                remaining = deadline - time.monotonic()
                if claims or remaining <= 0 or (should_stop is not None and should_stop()):
                    if claims:
                        self._changes.took(c.queue for c in claims)
                        if keep:  # (it leased the last)
                            self._changes.drained(queues, generation, looked_at, None)
                    self._changes.looked(look, [c.id for c in claims])
                    look = None
                    return claims
                # Looked at again when scheduled work comes due; a blocking wait also
                # every LOOK_AGAIN seconds (its claims are what sweep expired leases), a
                # parked one not: its holder sweeps while claims are parked (PlaneASGI),
                # so an idle worker costs the plane nothing until work arrives. A capped
                # queue may have work held back by its cap: a finish frees a slot.
                if due_at is None:
                    due_at, clean = self._next_due(queues, looked_at)
                    if clean and keep:
                        self._changes.drained(queues, generation, looked_at, due_at)
                due = min(remaining, max(due_at - self.clock.now(), 0.001))
                # (blocking, its queues left with nothing to take: a submit in this
                # process may hand it its record meanwhile, see Changes.reserve)
                taker = None
                if emptied and not any(capped) and not self._changes.parks:
                    lease = lease_seconds or self.lease_seconds
                    taker = Taker(frozenset(queues), worker, lease, generation, due_at, marker)
                waited = self._changes.wait(
                    generation,
                    min(due, LOOK_AGAIN),
                    finishes=any(capped),
                    until=deadline,
                    queues=queues,
                    parked=due,
                    finish_since=finishes,
                    look=look,
                    taker=taker,
                )
                owed = None if look is None else look.owes
                look = None  # (the wait ended it)
                if taker is not None and taker.box and not taker.abandoned:
                    return list(taker.box)  # (handed over; one given up is handed back)
                if not waited:
                    # Parked: the event loop holding the request asks again, unless a
                    # submit on its thread hands it a record first (see _hand_over).
                    if emptied:  # (a look that lost a race may have left work pending)
                        self._changes.claimant(
                            worker,
                            lease_seconds or self.lease_seconds,
                            due_at,
                            marker,
                            self._hand_back,
                        )
                    return claims
            finally:
                self._changes.looked(look)

    def _hand_over(
        self, inv: Invocation, spec: QueueSpec, now: float
    ) -> tuple[Taker, Invocation] | None:
        """Lease the new record of a lone submit to a claim waiting for work on its queue
        (parked, or blocking in a thread of this process), as that claim's own look
        would have, before it is written: the claim's
        :class:`~.changes.Taker` and the record leased to its worker (what the submit
        writes), or None. Only a record due now, on a queue without a running cap
        (a cap is counted by a look) that is not Boltzmann-ordered (a look samples among
        the pending), goes over, and only to a claim whose look found its queues with
        nothing to take and nothing has changed since (:meth:`Changes.reserve`): the
        record is then what that look would find first. A batch is not handed over: a
        look orders a batch's records by their queue's order and the claim's queues."""
        if inv.available_at > now or spec.kind == "boltzmann" or running_cap(spec) is not None:
            return None
        taker = self._changes.reserve(inv.queue, now)
        if taker is None:
            return None
        try:
            _, _, lease = _lease_update(inv, taker.worker, now, taker.lease_seconds)
            return taker, replace(inv, **lease)
        except BaseException:
            self._changes.handed(taker)  # (nothing handed: back on the books)
            raise

    def _hand_back(self, claims: list[Claim]) -> None:
        """Claims handed to a parked claim that its holder could not deliver (its client
        went away, the server stops): pending again, untried. One that fails stays
        leased until its lease runs out (the sweep hands it on); the rest go back."""
        for claim in claims:
            try:
                self.release(claim.id, claim.lease_token)
            except (LeaseLost, UnknownInvocation):
                pass  # (it was handed on, or is gone: nothing to give back)
            except Exception:
                _log.exception("handing back claim %s failed; its lease will run out", claim.id)

    def _next_due(self, queues: Sequence[str], looked_at: float) -> tuple[float, bool]:
        """Plane time the earliest invocation of ``queues`` that was not due at
        ``looked_at`` (when the claim looked) comes due (one that came due since, the
        look missed: look again at once), infinite when none is scheduled; and whether
        no queue's earliest is a call due by then (one submitted during the look, which
        moved the generation the claim waits past, and hides that queue's scheduled
        calls from this read)."""
        soonest, clean = math.inf, True
        for name in queues:
            t = self.store.next_available_at(name)
            if t is None:
                continue
            if t > looked_at:
                soonest = min(soonest, t)
            else:
                clean = False
        return soonest, clean

    def _claim_now(
        self,
        queues: Sequence[str],
        worker: str,
        limit: int,
        lease_seconds: float,
        capped: list[bool] | None = None,
        drained: list[bool] | None = None,
    ) -> list[Claim]:
        """Lease what is there now; ``capped`` gets whether any queue has a running cap,
        ``drained`` whether each queue's last read came back short (nothing more on it
        to take now; a deleted queue has nothing)."""
        claims: list[Claim] = []
        with self.batch(limit > 1):
            for name in queues:
                try:
                    spec = self.store.get_queue(name)
                    if spec is None:
                        continue
                    if capped is not None:
                        capped.append(running_cap(spec) is not None)
                    more, short = True, False
                    while more and len(claims) < limit:
                        more, short = self._claim_from(
                            spec, worker, limit - len(claims), lease_seconds, claims
                        )
                    if drained is not None:
                        drained.append(short)
                except Exception:
                    if not claims:
                        raise
                    # What it leased is answered, not left leased to a claim that failed
                    # until the leases run out; the next claim looks at the rest. (It ends
                    # here: on SQLite an error may have rolled the batch's transaction
                    # back, and its commit then fails the claim with nothing leased.)
                    _log.warning(
                        "a claim ended early at queue %r; answering the %d calls it leased",
                        name,
                        len(claims),
                        exc_info=True,
                    )
                    if drained is not None:
                        drained.append(False)  # (not known: no later look is left out)
                    break
        for name in {c.queue for c in claims}:
            try:
                self._touch(name, self.clock.now())
            except Exception:  # (bookkeeping: the leases stand and are answered)
                _log.warning("recording activity on queue %r failed", name, exc_info=True)
        return claims

    def _claim_from(
        self, spec: QueueSpec, worker: str, want: int, lease_seconds: float, got: list[Claim]
    ) -> tuple[bool, bool]:
        """One pass over the head of one queue, adding what it leases to ``got`` as each
        lease is written (so a later step that fails leaves them answered, see
        :meth:`_claim_now`): whether another pass may find more (not when it leased
        nothing, nor when the read came back short and every lease held: the queue had
        no more then, and what arrived since woke the claim's wait), and whether it left
        nothing due on the queue (the read came back short and no lease was lost to
        another claim)."""
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
        rest = iter(ordered)
        lost_any = False
        start = len(got)
        while (taken := len(got) - start) < want:
            # Without a cap, the next as many as are still wanted at once; under a cap,
            # one at a time (a refusal may mean the cap is full).
            chunk = list(islice(rest, 1 if cap is not None else want - taken))
            if not chunk:
                break
            leased = self._lease_many(chunk, worker, now, lease_seconds, cap)
            got.extend(leased)
            lost = len(leased) < len(chunk)  # a race lost: the next ones are tried
            lost_any = lost_any or lost
            if lost and cap is not None and self._at_cap(spec.name, cap):
                break
        taken = len(got) - start
        if boltzmann and taken:
            try:
                self.store.queue_counter(spec.name, taken)
            except Exception:  # (the temperature's clock lags a little; the leases stand)
                _log.warning("counting queue %r's claims failed", spec.name, exc_info=True)
        short = len(candidates) < fetch and not lost_any
        return bool(taken) and not short, short

    def _at_cap(self, queue: str, cap: int) -> bool:
        return self.store.running(queue) >= cap

    def _lease_many(
        self,
        recs: Sequence[Invocation],
        worker: str,
        now: float,
        lease_seconds: float,
        cap: int | None,
    ) -> list[Claim]:
        """Lease each of ``recs`` still pending at the attempt read, in one store call
        (a store may write the leases of one group together); the claims won, in order.
        One lost to another claim, or without a payload, is left out."""
        updates = [_lease_update(rec, worker, now, lease_seconds) for rec in recs]
        answers = self.store.update_many_if(updates, running_below=cap)
        return [
            claim_of(updated)
            for updated in answers
            if updated is not None and updated.payload is not None
        ]

    def heartbeat(
        self, inv_id: str, lease_token: str, *, lease_seconds: float | None = None
    ) -> HeartbeatAnswer:
        """Extend a lease. The answer says whether to keep going or stop (cancel)."""
        rec = self._read(inv_id)
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
        updated = self.store.update_if(inv_id, _held(lease_token), {"lease_expires_at": expires})
        if updated is None:
            return HeartbeatAnswer(inv_id, ok=False, cancel=True, lease_expires_at=None)
        return HeartbeatAnswer(inv_id, ok=True, cancel=timed_out, lease_expires_at=expires)

    def complete_many(self, items: Sequence[tuple[str, str, bytes]]) -> list[Exception | None]:
        """:meth:`complete` for several ``(id, lease_token, result)``, written in one
        store call (a store may write a group's results together); each item's refusal
        (or None), in order. Each item is accepted or refused on its own."""
        answers = self.complete_records(items)
        return [answer if isinstance(answer, Exception) else None for answer in answers]

    def complete_records(
        self, items: Sequence[tuple[str, str, bytes]]
    ) -> list[Invocation | Exception]:
        """:meth:`complete_many`, answering each item's record after it (succeeded) or
        its refusal: what the API counts and logs, without reading the records again."""
        now = self.clock.now()
        updates = [
            (inv_id, _held(token), self._success_changes(result, now))
            for inv_id, token, result in items
        ]
        with self.batch(len(items) > 1):
            answers = self._update_where(updates, deadline_after=now)
            out: list[Invocation | Exception] = [
                updated if updated is not None else self._refusal(inv_id, token)
                for (inv_id, token, _), updated in zip(items, answers, strict=True)
            ]
        self._finished(updated for updated in answers if updated is not None)
        return out

    def _success_changes(self, result: bytes, now: float) -> dict[str, Any]:
        """What a result changes on a running record."""
        changes: dict[str, Any] = {
            "state": State.SUCCEEDED,
            "result": result,
            "error": None,
            "finished_at": now,
            "expires_at": now + self.retention,
            "lease_expires_at": None,
        }
        if not self.keep_payload:  # a succeeded invocation never runs again
            changes["payload"] = None
        return changes

    def fail_many(
        self, items: Sequence[tuple[str, str, dict[str, Any], bool]]
    ) -> list[Exception | None]:
        """:meth:`fail` for several ``(id, lease_token, error, retryable)``, read and
        written in one store call each; each item's refusal (or None), in order."""
        answers = self._fail_answers(items)
        return [answer if isinstance(answer, Exception) else None for answer in answers]

    def fail_states(
        self, items: Sequence[tuple[str, str, dict[str, Any], bool]]
    ) -> list[State | Exception]:
        """:meth:`fail_many`, answering each item's state after it (failed, or
        scheduled again by its retry policy) or its refusal: what the API reports."""
        now = self.clock.now()
        return [
            answer if isinstance(answer, Exception) else answer.public_state(now)
            for answer in self._fail_answers(items)
        ]

    def _fail_answers(
        self, items: Sequence[tuple[str, str, dict[str, Any], bool]]
    ) -> list[Invocation | Exception]:
        """Each failure's record after it (failed, or pending again for a retry) or its
        refusal, in order. A failure is refused unless its token holds the lease and the
        timeout has not passed (checked on the records read, then by the write)."""
        with self.batch(len(items) > 1):
            now = self.clock.now()
            recs = {rec.id: rec for rec in self._read_many([item[0] for item in items])}
            updates = [
                self._failure_update(recs.get(inv_id), token, error, retryable, now)
                for inv_id, token, error, retryable in items
            ]
            written = self._update_where(updates)
            answers = [
                updated if updated is not None else self._refusal(inv_id, token)
                for (inv_id, token, _, _), updated in zip(items, written, strict=True)
            ]
        self._finished(a for a in answers if isinstance(a, Invocation))
        # (a failure its policy retries: claimable again once its backoff ends)
        self.wake_idle(
            a.queue for a in answers if isinstance(a, Invocation) and a.state is State.PENDING
        )
        return answers

    def _failure_update(
        self,
        rec: Invocation | None,
        token: str,
        error: dict[str, Any],
        retryable: bool,
        now: float,
    ) -> Update | None:
        """The update that records a failure on ``rec``; None when it is refused (no
        such record, the lease not held by ``token``, or its timeout passed)."""
        if rec is None or not _holds(rec, token) or _past_deadline(rec, now):
            return None
        return rec.id, _held(token), self._failure_changes(rec, error, retryable, now)

    def _failure_changes(
        self, rec: Invocation, error: dict[str, Any], retryable: bool, now: float
    ) -> dict[str, Any]:
        """What a raise changes on a running record: back to pending after the policy's
        backoff while it allows another try, else failed."""
        retries_used = rec.attempt - 1
        if retryable and rec.retry is not None and retries_used < rec.retry.max:
            return {
                "state": State.PENDING,
                "available_at": now + rec.retry.delay(retries_used),
                "lease_token": None,
                "lease_expires_at": None,
                "worker": None,
                "error": error,
            }
        return {
            "state": State.FAILED,
            "error": error,
            "finished_at": now,
            "expires_at": now + self.retention,
            "lease_expires_at": None,
        }

    def release(self, inv_id: str, lease_token: str) -> None:
        """Hand a claimed invocation back untried: pending again, the attempt not counted
        (a worker stopping cold). Raises :class:`LeaseLost` unless the token is current."""
        rec = self._read(inv_id)
        if rec is None or not _holds(rec, lease_token):
            raise self._refusal(inv_id, lease_token)
        changes = {
            "state": State.PENDING,
            "attempt": max(0, rec.attempt - 1),
            "lease_token": None,
            "lease_expires_at": None,
            "worker": None,
        }
        expect = _held(lease_token)
        if self.store.update_if(inv_id, expect, changes) is None:
            raise self._refusal(inv_id, lease_token)
        self._changes.notify()
        self.wake_idle([rec.queue])

    def report_progress(
        self, inv_id: str, lease_token: str, fraction: float, message: str | None = None
    ) -> None:
        """Record how far a running job is (``fraction`` in [0, 1])."""
        if not (isinstance(fraction, int | float) and math.isfinite(fraction)) or not (
            0.0 <= fraction <= 1.0
        ):
            raise InvalidRequest("progress must be a fraction from 0 to 1")
        if message is not None and len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE]
        expect = _held(lease_token)
        changes = {"progress": float(fraction), "progress_message": message}
        if self.store.update_if(inv_id, expect, changes) is None:
            raise self._refusal(inv_id, lease_token)

    def append_logs(
        self, inv_id: str, lease_token: str, chunks: Sequence[tuple[int, str, str]]
    ) -> None:
        """Store a running job's output: ``(n, stream, text)`` chunks numbered by the
        worker from 1 within its attempt (a resent chunk is stored once)."""
        rec = self._read(inv_id)
        if rec is None or not _holds(rec, lease_token):
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
        order; none once it has expired (output goes with payload and result). Raises
        :class:`UnknownInvocation`."""
        if self.get(inv_id).is_expired(self.clock.now()):
            return []
        return self.store.read_logs(inv_id, after, limit)

    def complete(self, inv_id: str, lease_token: str, result: bytes) -> None:
        """Record the result. Raises :class:`LeaseLost` unless the token is current
        and the invocation's timeout has not passed (then it fails as timed out)."""
        (refusal,) = self.complete_many([(inv_id, lease_token, result)])
        if refusal is not None:
            raise refusal

    def fail(
        self, inv_id: str, lease_token: str, error: dict[str, Any], *, retryable: bool = True
    ) -> State:
        """Record a raise. Retried (back to scheduled) when the policy allows.

        Returns the state the invocation is in afterwards.
        """
        (answer,) = self._fail_answers([(inv_id, lease_token, error, retryable)])
        if isinstance(answer, Exception):
            raise answer
        return answer.public_state(self.clock.now())

    def _fail_or_retry(
        self, rec: Invocation, error: dict[str, Any], *, retryable: bool
    ) -> Invocation | None:
        """Record a failure on ``rec`` as read (its lease still held); None if it has
        changed since."""
        changes = self._failure_changes(rec, error, retryable, self.clock.now())
        updated = self.store.update_if(rec.id, _held(rec.lease_token), changes)
        if updated is not None:
            self._finished([updated])
        return updated

    def _refusal(self, inv_id: str, lease_token: str) -> Exception:
        """Why an answer was refused; records a timeout the answer came too late for."""
        rec = self._read(inv_id)
        if rec is None:
            return UnknownInvocation(f"no invocation {inv_id!r} on this plane")
        now = self.clock.now()
        held = _holds(rec, lease_token)
        if held and _past_deadline(rec, now):
            ended = self._expire_lease(rec, now)
            if ended is not None and ended.state is State.PENDING:
                self.wake_idle([rec.queue])  # (its policy retries it)
            return LeaseLost(
                f"invocation {inv_id!r} ran past its timeout of {rec.timeout:g}s; "
                "its answer is refused"
            )
        if rec.state is State.CANCELLED:
            return LeaseLost(f"invocation {inv_id!r} was cancelled; its answer is refused")
        if rec.lease_token != lease_token:
            return LeaseLost(
                f"lease on {inv_id!r} is not held by this lease token (it ran out and was"
                " handed on, or the token is wrong); answer refused"
            )
        return LeaseLost(f"invocation {inv_id!r} is {rec.state.value}; answer refused")

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
        again: set[str] = set()  # queues with work handed on
        while True:
            batch = self.store.expired_leases(now, _SWEEP_BATCH)
            for rec in batch:
                updated = self._expire_lease(rec, now)
                if updated is not None:
                    handled += 1
                    if updated.state is State.PENDING:
                        again.add(updated.queue)
            if len(batch) < _SWEEP_BATCH:
                break
        if handled:  # (told before anything else: a submit meanwhile hands over nothing)
            self._changes.notify()
            self.wake_idle(again)
        if purge or now >= self._next_purge:
            self._next_purge = now + 60.0
            self.store.purge(now, now - self.tombstone)
            for spec, _ in self.store.list_queues():
                if spec.delete_when_drained and self._drained(spec.name, now):
                    self.store.delete_queue(spec.name, invocations=False)
        return handled

    def _expire_lease(self, rec: Invocation, now: float) -> Invocation | None:
        """End ``rec``'s attempt whose lease ran out: it failed past its timeout (told to
        :attr:`on_attempt_ended`), or its worker was lost (handed on, or dead). The record
        afterwards; None if it changed since it was read."""
        if _past_deadline(rec, now):
            error = {
                "type": "dreamlake.lakeshore.InvocationTimeout",
                "message": f"invocation exceeded its timeout of {rec.timeout:g}s",
                "traceback": "",
                "pickled": None,
            }
            updated = self._fail_or_retry(rec, error, retryable=True)
            if updated is not None and self.on_attempt_ended is not None:
                outcome = "retried" if updated.state is State.PENDING else "failed"
                self.on_attempt_ended(rec, outcome, error["type"])
            return updated
        expect = _held(rec.lease_token)
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
            self._finished([updated])
        return updated


def _held(lease_token: str | None) -> dict[str, Any]:
    """The condition of an answer: the record is running under this lease."""
    return {"state": State.RUNNING, "lease_token": lease_token}


def _holds(rec: Invocation, lease_token: str) -> bool:
    """Whether ``rec`` as read is running under this lease."""
    return rec.state is State.RUNNING and rec.lease_token == lease_token


def claim_of(rec: Invocation) -> Claim:
    """The claim a record written leased stands for (its lease, as the store has it)."""
    assert rec.payload is not None and rec.lease_token is not None
    assert rec.lease_expires_at is not None
    return Claim(
        id=rec.id,
        queue=rec.queue,
        payload=rec.payload,
        lease_token=rec.lease_token,
        lease_expires_at=rec.lease_expires_at,
        attempt=rec.attempt,
        timeout=rec.timeout,
    )


def _lease_update(rec: Invocation, worker: str, now: float, lease_seconds: float) -> Update:
    """The update that leases ``rec`` to ``worker`` with a fresh token, on the condition
    that it is still pending at the attempt read; the lease ends by its timeout."""
    expires = now + lease_seconds
    if rec.timeout is not None:
        expires = min(expires, now + rec.timeout)
    changes: dict[str, Any] = {
        "state": State.RUNNING,
        "attempt": rec.attempt + 1,
        "lease_token": random_hex(8),
        "lease_expires_at": expires,
        "worker": worker,
        "started_at": now,
    }
    return rec.id, {"state": State.PENDING, "attempt": rec.attempt}, changes


def _past_deadline(rec: Invocation, now: float) -> bool:
    """Whether a running invocation's per-invocation timeout has passed."""
    return (
        rec.timeout is not None
        and rec.started_at is not None
        and now >= rec.started_at + rec.timeout
    )
