"""Every lifecycle rule of the plane core, driven by an injected FakeClock.

scheduled → pending → running → succeeded | failed | cancelled | dead. Time passes only
when a test advances the clock; nothing here sleeps.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import counting_calls, wait_for

from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidRequest,
    LeaseLost,
    QueueMismatch,
    QueueNotFound,
    UnknownInvocation,
)
from dreamlake.lakeshore.plane import (
    Claim,
    Invocation,
    Plane,
    QueueSpec,
    RetryPolicy,
    State,
    Submission,
)
from dreamlake.lakeshore.plane import workers as workers_module
from dreamlake.lakeshore.plane.changes import PARKED_LOOK
from dreamlake.lakeshore.stores import SqliteStore

LEASE = 60.0
RETENTION = 100.0
TOMBSTONE = 1000.0
QUEUE = "jobs"
ERROR = {"type": "builtins.ValueError", "message": "boom", "traceback": "tb", "pickled": None}


@pytest.fixture
def make_plane(clock: FakeClock) -> Iterator[Callable[..., Plane]]:
    """Builds planes over fresh in-memory stores on the test's clock; closes them after."""
    planes: list[Plane] = []

    def make(**settings: Any) -> Plane:
        settings = {
            "lease_seconds": LEASE,
            "max_attempts": 3,
            "retention": RETENTION,
            "tombstone": TOMBSTONE,
            **settings,
        }
        plane = Plane(SqliteStore(":memory:"), clock=clock, **settings)
        planes.append(plane)
        return plane

    yield make
    for plane in planes:
        plane.close()


@pytest.fixture
def plane(make_plane: Callable[..., Plane]) -> Plane:
    """A plane with a fifo queue named ``jobs``."""
    plane = make_plane()
    plane.ensure_queue(QueueSpec(QUEUE))
    return plane


def submit(plane: Plane, inv_id: str = "job-1", *, queue: str = QUEUE, **options: Any) -> str:
    payload = options.pop("payload", b"x")
    return plane.submit([Submission(inv_id, queue, payload, **options)])[0]


def claim_one(plane: Plane, worker: str = "w1", *, queue: str = QUEUE) -> Claim | None:
    claims = plane.claim([queue], worker)
    assert len(claims) <= 1
    return claims[0] if claims else None


def running(plane: Plane, inv_id: str = "job-1", worker: str = "w1", **options: Any) -> Claim:
    """Submit ``inv_id`` and claim it; the claim."""
    submit(plane, inv_id, **options)
    claim = claim_one(plane, worker)
    assert claim is not None and claim.id == inv_id
    return claim


def finished(plane: Plane) -> None:
    """Submit ``job-1`` and complete it with result b"result"."""
    claim = running(plane, payload=b"args")
    plane.complete("job-1", claim.lease_token, b"result")


# =======================================================================================
# States
# =======================================================================================


def test_a_submitted_invocation_is_pending(plane: Plane) -> None:
    # When an invocation is submitted
    submit(plane)
    # Then it is pending, at attempt 0, with its payload
    rec = plane.get("job-1")
    assert (rec.state, rec.attempt, rec.payload) == (State.PENDING, 0, b"x")
    assert plane.state("job-1") is State.PENDING


def test_a_delayed_invocation_is_scheduled_until_its_time_then_pending(
    plane: Plane, clock: FakeClock
) -> None:
    # Given an invocation delayed by 30 s
    submitted_at = clock.now()
    submit(plane, delay=30)
    # Then it is scheduled (stored pending, not yet due) until 30 s have passed
    assert plane.state("job-1") is State.SCHEDULED
    assert plane.get("job-1").state is State.PENDING
    assert plane.counts(QUEUE)["scheduled"] == 1
    clock.set(submitted_at + 29.999)
    assert plane.state("job-1") is State.SCHEDULED
    # And pending once due
    clock.set(submitted_at + 30)
    assert plane.state("job-1") is State.PENDING
    assert plane.counts(QUEUE)["pending"] == 1


@pytest.mark.parametrize(
    ("state", "now", "public"),
    [
        (State.PENDING, 9.0, State.SCHEDULED),
        (State.PENDING, 10.0, State.PENDING),
        (State.RUNNING, 9.0, State.RUNNING),
        (State.SUCCEEDED, 9.0, State.SUCCEEDED),
    ],
)
def test_public_state_reports_a_not_yet_due_pending_record_as_scheduled(
    state: State, now: float, public: State
) -> None:
    # Given a record available at 10
    rec = Invocation("i", "q", state, b"x", "d", "k", 0.0, 10.0, 0.0, 3)
    # Then its public state splits scheduled from pending by that time
    assert rec.public_state(now) is public


def test_a_claim_grants_a_lease_and_a_token(plane: Plane, clock: FakeClock) -> None:
    # Given a pending invocation
    submit(plane, payload=b"args")
    # When a worker claims it
    claim = claim_one(plane, "w1")
    # Then it gets the payload, a token, a lease of lease_seconds and attempt 1
    assert claim is not None
    assert (claim.id, claim.queue, claim.payload, claim.attempt) == ("job-1", QUEUE, b"args", 1)
    assert claim.lease_token
    assert claim.lease_expires_at == clock.now() + LEASE
    # And the invocation is running, held by that worker with that token
    rec = plane.get("job-1")
    assert (rec.state, rec.worker, rec.lease_token) == (State.RUNNING, "w1", claim.lease_token)
    assert rec.started_at == clock.now()


def test_a_claim_may_ask_for_its_own_lease_length(plane: Plane, clock: FakeClock) -> None:
    submit(plane)
    (claim,) = plane.claim([QUEUE], "w1", lease_seconds=5)
    assert claim.lease_expires_at == clock.now() + 5


def test_a_running_invocation_is_not_handed_out_again(plane: Plane) -> None:
    # Given a claimed invocation
    running(plane)
    # When another worker claims
    # Then it gets nothing
    assert claim_one(plane, "w2") is None


def test_each_claim_gets_a_fresh_token(plane: Plane, clock: FakeClock) -> None:
    # Given an invocation claimed once whose lease then ran out
    first = running(plane)
    clock.advance(LEASE + 1)
    plane.sweep()
    # When it is claimed again
    second = claim_one(plane, "w2")
    # Then the new lease has another token
    assert second is not None and second.lease_token != first.lease_token


def test_complete_records_the_result_and_succeeds(plane: Plane, clock: FakeClock) -> None:
    # Given a running invocation
    claim = running(plane)
    # When its worker completes it
    plane.complete("job-1", claim.lease_token, b"result")
    # Then it succeeded with that result
    rec = plane.get("job-1")
    assert (rec.state, rec.result, rec.error) == (State.SUCCEEDED, b"result", None)
    assert rec.finished_at == clock.now()
    assert rec.lease_expires_at is None


def test_fail_without_a_retry_policy_fails_with_the_error(plane: Plane) -> None:
    # Given a running invocation without a retry policy
    claim = running(plane)
    # When its worker reports a raise
    state = plane.fail("job-1", claim.lease_token, ERROR)
    # Then it failed and keeps the error
    assert state is State.FAILED
    rec = plane.get("job-1")
    assert (rec.state, rec.error) == (State.FAILED, ERROR)


def test_counts_report_every_public_state(plane: Plane) -> None:
    # Given one invocation succeeded, one running, one scheduled and one pending
    done = running(plane, "done")
    plane.complete("done", done.lease_token, b"r")
    running(plane, "running")
    submit(plane, "scheduled", delay=10)
    submit(plane, "pending")
    # When the queue is counted
    counts = plane.counts(QUEUE)
    # Then every public state is reported, zero when empty
    assert counts == {
        "scheduled": 1,
        "pending": 1,
        "running": 1,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
        "dead": 0,
    }


# =======================================================================================
# Heartbeats
# =======================================================================================


def test_heartbeat_extends_the_lease(plane: Plane, clock: FakeClock) -> None:
    # Given a running invocation 50 s into its 60 s lease
    claim = running(plane)
    clock.advance(50)
    # When its worker heartbeats
    answer = plane.heartbeat("job-1", claim.lease_token)
    # Then the lease runs a full lease_seconds from now
    assert (answer.ok, answer.cancel) == (True, False)
    assert answer.lease_expires_at == clock.now() + LEASE
    assert plane.get("job-1").lease_expires_at == clock.now() + LEASE


def test_a_heartbeat_keeps_the_invocation_from_being_swept(plane: Plane, clock: FakeClock) -> None:
    # Given a running invocation that heartbeats before its lease runs out
    claim = running(plane)
    clock.advance(50)
    plane.heartbeat("job-1", claim.lease_token)
    # When the original lease has passed and the plane sweeps
    clock.advance(20)
    plane.sweep()
    # Then it is still running under the same lease
    rec = plane.get("job-1")
    assert (rec.state, rec.lease_token) == (State.RUNNING, claim.lease_token)


def test_heartbeat_with_a_stale_token_is_not_ok(plane: Plane, clock: FakeClock) -> None:
    # Given an invocation whose first lease ran out and was handed to another worker
    old = running(plane, worker="w1")
    clock.advance(LEASE + 1)
    plane.sweep()
    new = claim_one(plane, "w2")
    assert new is not None
    # When the first worker heartbeats with its old token
    answer = plane.heartbeat("job-1", old.lease_token)
    # Then it is told to stop, and the new holder's lease is untouched
    assert answer.ok is False
    assert plane.get("job-1").lease_expires_at == new.lease_expires_at


def test_heartbeat_with_a_wrong_token_is_not_ok(plane: Plane) -> None:
    running(plane)
    assert plane.heartbeat("job-1", "not-the-token").ok is False


def test_heartbeat_of_an_unknown_invocation_is_not_ok(plane: Plane) -> None:
    assert plane.heartbeat("ghost", "token").ok is False


def test_heartbeat_after_cancel_of_a_running_invocation_answers_cancel(plane: Plane) -> None:
    # Given a running invocation that the producer cancels
    claim = running(plane)
    plane.cancel("job-1")
    # When its worker heartbeats
    answer = plane.heartbeat("job-1", claim.lease_token)
    # Then it is told to cancel
    assert answer.cancel is True
    assert answer.ok is False


def test_heartbeat_past_the_invocation_timeout_answers_cancel(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a running invocation with a 10 s timeout
    claim = running(plane, timeout=10)
    # When its worker heartbeats before the timeout
    early = plane.heartbeat("job-1", claim.lease_token)
    # Then it keeps going, with the lease capped at the timeout
    assert (early.ok, early.cancel) == (True, False)
    assert early.lease_expires_at == claim.lease_expires_at == clock.now() + 10
    # When it heartbeats once the timeout has passed
    clock.advance(10)
    late = plane.heartbeat("job-1", claim.lease_token)
    # Then it is told to cancel
    assert late.cancel is True


# =======================================================================================
# Only the current lease token answers
# =======================================================================================


def test_complete_with_a_stale_token_raises_lease_lost(plane: Plane) -> None:
    # Given a running invocation
    running(plane)
    # When a complete presents another token
    # Then it is refused and nothing is recorded
    with pytest.raises(LeaseLost):
        plane.complete("job-1", "not-the-token", b"forged")
    rec = plane.get("job-1")
    assert (rec.state, rec.result) == (State.RUNNING, None)


def test_fail_with_a_stale_token_raises_lease_lost(plane: Plane) -> None:
    running(plane)
    with pytest.raises(LeaseLost):
        plane.fail("job-1", "not-the-token", ERROR)
    assert plane.get("job-1").state is State.RUNNING


def test_complete_of_an_unknown_invocation_raises_unknown_invocation(plane: Plane) -> None:
    with pytest.raises(UnknownInvocation):
        plane.complete("ghost", "token", b"r")


def test_complete_twice_records_the_first_result_only(plane: Plane) -> None:
    # Given a completed invocation
    claim = running(plane)
    plane.complete("job-1", claim.lease_token, b"first")
    # When the same holder completes it again
    # Then the second answer is refused and the first result stays
    with pytest.raises(LeaseLost):
        plane.complete("job-1", claim.lease_token, b"second")
    assert plane.get("job-1").result == b"first"


def test_a_late_complete_after_lease_expiry_is_refused(plane: Plane, clock: FakeClock) -> None:
    # Given a worker whose lease ran out and was swept
    late = running(plane, worker="slow")
    clock.advance(LEASE + 1)
    plane.sweep()
    # When it completes late
    # Then the answer is refused and nothing is recorded
    with pytest.raises(LeaseLost):
        plane.complete("job-1", late.lease_token, b"late")
    rec = plane.get("job-1")
    assert (rec.state, rec.result) == (State.PENDING, None)


def test_only_one_result_is_recorded_when_two_workers_complete(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a first worker whose lease ran out, and a second worker that got it next
    first = running(plane, worker="slow")
    clock.advance(LEASE + 1)
    plane.sweep()
    second = claim_one(plane, "fast")
    assert second is not None
    # When both complete, the second first
    plane.complete("job-1", second.lease_token, b"from fast")
    with pytest.raises(LeaseLost):
        plane.complete("job-1", first.lease_token, b"from slow")
    # Then the current holder's result is the one recorded
    rec = plane.get("job-1")
    assert (rec.state, rec.result, rec.worker) == (State.SUCCEEDED, b"from fast", "fast")


# =======================================================================================
# Lease expiry: redelivery, then dead
# =======================================================================================


def test_an_expired_lease_returns_the_invocation_to_pending(plane: Plane, clock: FakeClock) -> None:
    # Given a running invocation whose worker stops heartbeating
    running(plane)
    # When the lease has passed and the plane sweeps
    clock.advance(LEASE + 1)
    handled = plane.sweep()
    # Then it is pending again, without a lease
    assert handled == 1
    rec = plane.get("job-1")
    assert (rec.state, rec.lease_token, rec.worker) == (State.PENDING, None, None)


def test_a_lease_is_not_expired_before_its_time(plane: Plane, clock: FakeClock) -> None:
    running(plane)
    clock.advance(LEASE - 1)
    assert plane.sweep() == 0
    assert plane.get("job-1").state is State.RUNNING


def test_a_redelivered_invocation_is_claimed_at_the_next_attempt(
    plane: Plane, clock: FakeClock
) -> None:
    # Given an invocation whose first lease expired
    running(plane)
    clock.advance(LEASE + 1)
    # When a worker claims (a claim sweeps expired leases on its way)
    claim = claim_one(plane, "w2")
    # Then it gets the invocation at attempt 2
    assert claim is not None
    assert (claim.id, claim.attempt) == ("job-1", 2)


def test_a_redelivered_invocation_keeps_its_place_in_the_queue(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a fifo queue where the oldest invocation was claimed and lost
    running(plane, "oldest")
    clock.advance(1)
    submit(plane, "newer")
    clock.advance(LEASE + 1)
    plane.sweep()
    # When a worker claims
    claim = claim_one(plane, "w2")
    # Then the oldest comes first again
    assert claim is not None and claim.id == "oldest"


def test_an_invocation_is_dead_once_max_attempts_leases_expired(
    plane: Plane, clock: FakeClock
) -> None:
    # Given an invocation whose worker is lost on each of its 3 attempts
    submit(plane)
    for attempt in (1, 2):
        claim = claim_one(plane)
        assert claim is not None and claim.attempt == attempt
        clock.advance(LEASE + 1)
        plane.sweep()
        assert plane.state("job-1") is State.PENDING
    last = claim_one(plane)
    assert last is not None and last.attempt == 3
    # When the third lease runs out
    clock.advance(LEASE + 1)
    plane.sweep()
    # Then it is dead with an InvocationDead error, and not handed out again
    rec = plane.get("job-1")
    assert rec.state is State.DEAD
    assert rec.error is not None and rec.error["type"] == "dreamlake.lakeshore.InvocationDead"
    assert rec.finished_at == clock.now()
    assert claim_one(plane) is None


def test_a_submission_may_set_its_own_max_attempts(plane: Plane, clock: FakeClock) -> None:
    # Given an invocation allowed a single attempt
    running(plane, max_attempts=1)
    # When its lease runs out
    clock.advance(LEASE + 1)
    plane.sweep()
    # Then it is dead at once
    assert plane.state("job-1") is State.DEAD


def test_a_dead_invocations_late_complete_is_refused(
    make_plane: Callable[..., Plane], clock: FakeClock
) -> None:
    # Given a plane allowing one attempt, and an invocation whose lease ran out
    plane = make_plane(max_attempts=1)
    plane.ensure_queue(QueueSpec(QUEUE))
    claim = running(plane)
    clock.advance(LEASE + 1)
    plane.sweep()
    # When its worker completes late
    # Then the answer is refused and it stays dead
    with pytest.raises(LeaseLost):
        plane.complete("job-1", claim.lease_token, b"too late")
    assert plane.get("job-1").state is State.DEAD


# =======================================================================================
# Retries on raise
# =======================================================================================


def test_a_raise_is_retried_after_backoff_then_failed(plane: Plane, clock: FakeClock) -> None:
    # Given an invocation with two retries, 1 s backoff doubling
    submit(plane, retry=RetryPolicy(max=2, backoff=1))
    for backoff in (1.0, 2.0):
        # When its attempt raises
        claim = claim_one(plane)
        assert claim is not None
        failed_at = clock.now()
        plane.fail("job-1", claim.lease_token, ERROR)
        # Then it is scheduled, and not claimable before its backoff passes
        assert plane.state("job-1") is State.SCHEDULED
        clock.set(failed_at + backoff - 0.001)
        assert claim_one(plane) is None
        clock.set(failed_at + backoff)
    # When the third attempt raises too
    claim = claim_one(plane)
    assert claim is not None and claim.attempt == 3
    final = plane.fail("job-1", claim.lease_token, ERROR)
    # Then the invocation failed with the error
    assert final is State.FAILED
    rec = plane.get("job-1")
    assert (rec.state, rec.error) == (State.FAILED, ERROR)


def test_fail_answers_scheduled_when_the_raise_will_be_retried(plane: Plane) -> None:
    # Given a running invocation with a retry policy
    claim = running(plane, retry=RetryPolicy(max=2, backoff=1))
    # When it raises
    state = plane.fail("job-1", claim.lease_token, ERROR)
    # Then fail answers the state it is in now: scheduled for its retry
    assert state is plane.state("job-1") is State.SCHEDULED


def test_a_non_retryable_raise_is_not_retried(plane: Plane, clock: FakeClock) -> None:
    # Given a running invocation with a retry policy
    claim = running(plane, retry=RetryPolicy(max=2, backoff=1))
    # When it raises with retryable=False
    state = plane.fail("job-1", claim.lease_token, ERROR, retryable=False)
    # Then it failed at once and is never handed out again
    assert state is State.FAILED
    clock.advance(10)
    assert claim_one(plane) is None
    assert plane.state("job-1") is State.FAILED


def test_the_queue_retry_setting_applies_to_its_submissions(plane: Plane, clock: FakeClock) -> None:
    # Given a queue that retries once after 5 s
    plane.ensure_queue(QueueSpec("retrying", retry={"max": 1, "backoff": 5.0}))
    submit(plane, queue="retrying")
    (claim,) = plane.claim(["retrying"], "w1")
    # When its invocation raises
    plane.fail("job-1", claim.lease_token, ERROR)
    # Then it is retried after the backoff
    assert plane.state("job-1") is State.SCHEDULED
    clock.advance(5)
    assert [c.attempt for c in plane.claim(["retrying"], "w1")] == [2]


# =======================================================================================
# Per-invocation timeout
# =======================================================================================


def test_the_timeout_caps_the_lease(plane: Plane, clock: FakeClock) -> None:
    claim = running(plane, timeout=10)
    assert claim.timeout == 10
    assert claim.lease_expires_at == clock.now() + 10


def test_an_invocation_past_its_timeout_is_failed_by_the_sweep(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a running invocation with a 10 s timeout, still heartbeating
    claim = running(plane, timeout=10)
    clock.advance(9)
    plane.heartbeat("job-1", claim.lease_token)
    # When the timeout has passed and the plane sweeps
    clock.advance(1.5)
    plane.sweep()
    # Then it failed with a timeout error, not redelivered
    rec = plane.get("job-1")
    assert rec.state is State.FAILED
    assert rec.error is not None and rec.error["type"] == "dreamlake.lakeshore.InvocationTimeout"
    assert claim_one(plane) is None
    # And the worker's late answer is refused
    with pytest.raises(LeaseLost):
        plane.complete("job-1", claim.lease_token, b"late")


# =======================================================================================
# Cancel
# =======================================================================================


def test_cancel_of_a_pending_invocation_cancels_it(plane: Plane) -> None:
    # Given a pending invocation
    submit(plane)
    # When it is cancelled
    state = plane.cancel("job-1")
    # Then it is cancelled and no claim returns it
    assert state is State.CANCELLED
    assert plane.state("job-1") is State.CANCELLED
    assert claim_one(plane) is None


def test_cancel_of_a_scheduled_invocation_cancels_it(plane: Plane, clock: FakeClock) -> None:
    submit(plane, delay=10)
    assert plane.cancel("job-1") is State.CANCELLED
    clock.advance(20)
    assert claim_one(plane) is None


def test_cancel_of_a_running_invocation_refuses_its_result(plane: Plane) -> None:
    # Given a running invocation
    claim = running(plane)
    # When it is cancelled
    state = plane.cancel("job-1")
    # Then it is cancelled at once, and its worker's complete is refused
    assert state is State.CANCELLED
    with pytest.raises(LeaseLost):
        plane.complete("job-1", claim.lease_token, b"result")
    rec = plane.get("job-1")
    assert (rec.state, rec.result) == (State.CANCELLED, None)


def test_cancel_of_a_running_invocation_refuses_its_failure(plane: Plane) -> None:
    claim = running(plane)
    plane.cancel("job-1")
    with pytest.raises(LeaseLost):
        plane.fail("job-1", claim.lease_token, ERROR)
    assert plane.state("job-1") is State.CANCELLED


def test_cancel_of_a_finished_invocation_leaves_it(plane: Plane) -> None:
    # Given a succeeded invocation
    claim = running(plane)
    plane.complete("job-1", claim.lease_token, b"result")
    # When it is cancelled
    state = plane.cancel("job-1")
    # Then it stays succeeded with its result
    assert state is State.SUCCEEDED
    rec = plane.get("job-1")
    assert (rec.state, rec.result) == (State.SUCCEEDED, b"result")


def test_cancel_of_an_unknown_invocation_raises_unknown_invocation(plane: Plane) -> None:
    with pytest.raises(UnknownInvocation):
        plane.cancel("ghost")


def test_a_cancelled_invocation_is_not_swept_back_to_pending(
    plane: Plane, clock: FakeClock
) -> None:
    running(plane)
    plane.cancel("job-1")
    clock.advance(LEASE + 1)
    plane.sweep()
    assert plane.state("job-1") is State.CANCELLED


# =======================================================================================
# Idempotent submit
# =======================================================================================


def test_submit_of_the_same_id_and_request_returns_the_same_id_and_one_record(
    plane: Plane,
) -> None:
    # Given a submitted invocation
    first = submit(plane, payload=b"args", priority=2)
    # When the same request is submitted again under the same id
    again = submit(plane, payload=b"args", priority=2)
    # Then the id is the same and there is one invocation
    assert first == again == "job-1"
    assert plane.counts(QUEUE)["pending"] == 1


def test_a_replayed_submit_leaves_a_finished_invocation_as_it_is(plane: Plane) -> None:
    # Given an invocation that already succeeded
    claim = running(plane)
    plane.complete("job-1", claim.lease_token, b"result")
    # When its submit is replayed
    submit(plane)
    # Then it stays succeeded with its result (no second run)
    rec = plane.get("job-1")
    assert (rec.state, rec.result) == (State.SUCCEEDED, b"result")
    assert claim_one(plane) is None


@pytest.mark.parametrize(
    "other",
    [{"payload": b"other args"}, {"priority": 9}, {"delay": 5}, {"timeout": 3}],
    ids=["payload", "priority", "delay", "timeout"],
)
def test_submit_of_the_same_id_with_another_request_is_a_conflict(
    plane: Plane, other: dict[str, Any]
) -> None:
    # Given a submitted invocation
    submit(plane, payload=b"args")
    # When the same id is submitted with another request
    # Then it is a conflict, and the first request stays
    with pytest.raises(IdempotencyConflict):
        submit(plane, **{"payload": b"args", **other})
    assert plane.get("job-1").payload == b"args"


def test_submit_of_the_same_id_to_another_queue_is_a_conflict(plane: Plane) -> None:
    plane.ensure_queue(QueueSpec("elsewhere"))
    submit(plane)
    with pytest.raises(IdempotencyConflict):
        submit(plane, queue="elsewhere")


def test_submit_to_a_missing_queue_raises_queue_not_found(plane: Plane) -> None:
    with pytest.raises(QueueNotFound):
        submit(plane, queue="no-such-queue")


# =======================================================================================
# Retention
# =======================================================================================


def test_a_finished_invocation_expires_after_retention(plane: Plane, clock: FakeClock) -> None:
    # Given a finished invocation
    finished(plane)
    finished_at = clock.now()
    # Then it is not expired until retention seconds have passed
    clock.set(finished_at + RETENTION - 0.001)
    assert plane.get("job-1").is_expired(clock.now()) is False
    clock.set(finished_at + RETENTION)
    assert plane.get("job-1").is_expired(clock.now()) is True


def test_an_unfinished_invocation_never_expires(plane: Plane, clock: FakeClock) -> None:
    submit(plane)
    clock.advance(RETENTION + TOMBSTONE + 1)
    plane.sweep()
    rec = plane.get("job-1")
    assert (rec.is_expired(clock.now()), rec.payload) == (False, b"x")


def test_the_sweep_keeps_payload_and_result_within_retention(
    plane: Plane, clock: FakeClock
) -> None:
    finished(plane)
    clock.advance(RETENTION - 1)
    plane.sweep()
    rec = plane.get("job-1")
    assert (rec.payload, rec.result) == (b"args", b"result")


def test_the_sweep_strips_payload_and_result_past_retention(plane: Plane, clock: FakeClock) -> None:
    # Given a finished invocation past its retention
    finished(plane)
    clock.advance(RETENTION + 1)
    # When the plane sweeps
    plane.sweep()
    # Then its payload and result are gone, but the record still answers (expired)
    rec = plane.get("job-1")
    assert (rec.payload, rec.result, rec.state) == (None, None, State.SUCCEEDED)
    assert rec.is_expired(clock.now())


def test_a_record_is_gone_a_tombstone_after_it_expired(plane: Plane, clock: FakeClock) -> None:
    # Given a finished invocation
    finished(plane)
    # When retention and then the tombstone period have passed, and the plane sweeps
    clock.advance(RETENTION + TOMBSTONE - 1)
    plane.sweep()
    assert plane.get("job-1").is_expired(clock.now())
    clock.advance(2)
    plane.sweep()
    # Then the invocation is unknown
    with pytest.raises(UnknownInvocation):
        plane.get("job-1")


def test_a_plane_that_does_not_keep_payloads_drops_them_on_success_only(
    make_plane: Callable[..., Plane],
) -> None:
    # Given a plane that does not keep payloads, and a plane that does (the default)
    lean, keeping = make_plane(keep_payload=False), make_plane()
    for plane in (lean, keeping):
        plane.ensure_queue(QueueSpec(QUEUE))
        finished(plane)
    # Then a succeeded invocation keeps its payload only on the default plane
    assert (lean.get("job-1").payload, lean.get("job-1").result) == (None, b"result")
    assert (keeping.get("job-1").payload, keeping.get("job-1").result) == (b"args", b"result")
    # And a failed one keeps it everywhere, so it can be run again
    claim = running(lean, "job-2", payload=b"again")
    lean.fail("job-2", claim.lease_token, ERROR, retryable=False)
    assert lean.get("job-2").payload == b"again"
    assert lean.retry("job-2").payload == b"again"


# =======================================================================================
# Elasticity
# =======================================================================================


def test_fixed_elasticity_caps_running_invocations(plane: Plane) -> None:
    # Given a queue capped at 2 running invocations, with 5 pending
    plane.ensure_queue(QueueSpec("capped", elasticity={"kind": "fixed", "max": 2}))
    for i in range(5):
        submit(plane, f"job-{i}", queue="capped")
    # When a worker asks for 5
    claims = plane.claim(["capped"], "w1", limit=5)
    # Then it gets 2, and nothing more while they run
    assert len(claims) == 2
    assert plane.claim(["capped"], "w2", limit=5) == []
    # And when one finishes, one more can start
    plane.complete(claims[0].id, claims[0].lease_token, b"r")
    assert len(plane.claim(["capped"], "w2", limit=5)) == 1


def test_claim_takes_up_to_limit_from_an_uncapped_queue(plane: Plane) -> None:
    for i in range(5):
        submit(plane, f"job-{i}")
    assert [c.id for c in plane.claim([QUEUE], "w1", limit=3)] == ["job-0", "job-1", "job-2"]


def test_a_claim_of_many_reads_the_queue_head_once_when_it_holds_fewer(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queue holding 2 jobs (reads of its head counted: on DynamoDB each is a query)
    for i in range(2):
        submit(plane, f"job-{i}")
    reads: list[int] = []
    pending = plane.store.pending

    def counted(queue: str, now: float, limit: int) -> list[Invocation]:
        reads.append(limit)
        return pending(queue, now, limit)

    monkeypatch.setattr(plane.store, "pending", counted)
    # When a worker asks for up to 8
    assert [c.id for c in plane.claim([QUEUE], "w1", limit=8)] == ["job-0", "job-1"]
    # Then the short read said the queue had no more: no second look
    assert reads == [9]
    # and a claim that got as many as it asked for looks no further either
    for i in range(2, 6):
        submit(plane, f"job-{i}")
    reads.clear()
    assert len(plane.claim([QUEUE], "w1", limit=2)) == 2
    assert reads == [3]


# =======================================================================================
# watch and wait
# =======================================================================================


def test_watch_fires_once_when_the_invocation_finishes(plane: Plane) -> None:
    # Given a watch on a running invocation
    claim = running(plane)
    seen: list[Invocation] = []
    plane.watch(["job-1"], seen.append)
    assert seen == []
    # When it finishes, and is later touched again
    plane.complete("job-1", claim.lease_token, b"result")
    plane.cancel("job-1")
    # Then the callback fired exactly once with the finished record
    assert [(r.id, r.state, r.result) for r in seen] == [("job-1", State.SUCCEEDED, b"result")]


@pytest.mark.parametrize("outcome", ["failed", "cancelled", "dead"])
def test_watch_fires_for_every_finished_state(plane: Plane, clock: FakeClock, outcome: str) -> None:
    # Given a watch on a running invocation allowed one attempt
    claim = running(plane, max_attempts=1)
    seen: list[Invocation] = []
    plane.watch(["job-1"], seen.append)
    # When it finishes that way
    if outcome == "failed":
        plane.fail("job-1", claim.lease_token, ERROR)
    elif outcome == "cancelled":
        plane.cancel("job-1")
    else:
        clock.advance(LEASE + 1)
        plane.sweep()
    # Then the callback fired with that state
    assert [r.state.value for r in seen] == [outcome]


def test_watch_fires_at_once_for_an_already_finished_invocation(plane: Plane) -> None:
    finished(plane)
    told: list[object] = []
    unsubscribe = plane.changes.subscribe(lambda n, queues: told.append(n))
    finishes = plane.changes.finishes
    seen: list[Invocation] = []
    plane.watch(["job-1"], seen.append)
    assert [(r.id, r.result) for r in seen] == [("job-1", b"result")]
    # and nothing else hears of it: that finish was news when it happened, not now
    # (parked waits and cursor waits would all look again)
    assert (told, plane.changes.finishes) == ([], finishes)
    unsubscribe()


def test_watch_does_not_fire_for_a_retry(plane: Plane) -> None:
    # Given a watch on a running invocation that will be retried
    claim = running(plane, retry=RetryPolicy(max=1, backoff=1))
    seen: list[Invocation] = []
    plane.watch(["job-1"], seen.append)
    # When it raises and is scheduled for a retry
    plane.fail("job-1", claim.lease_token, ERROR)
    # Then it has not finished, so nothing fired
    assert seen == []


def test_watch_fires_for_each_watched_id(plane: Plane) -> None:
    # Given two finished invocations and a running one
    finished(plane)
    submit(plane, "job-2")
    claim2 = claim_one(plane)
    assert claim2 is not None
    plane.complete("job-2", claim2.lease_token, b"two")
    claim3 = running(plane, "job-3")
    # When one watch covers all three, and the third then finishes
    seen: list[str] = []
    plane.watch(["job-1", "job-2", "job-3"], lambda rec: seen.append(rec.id))
    plane.complete("job-3", claim3.lease_token, b"three")
    # Then the callback fired once for each id
    assert sorted(seen) == ["job-1", "job-2", "job-3"]


def test_watch_of_an_unknown_id_raises_and_registers_nothing(plane: Plane) -> None:
    # Given a running invocation
    claim = running(plane)
    seen: list[Invocation] = []
    # When a watch names it and an unknown id
    # Then it raises UnknownInvocation
    with pytest.raises(UnknownInvocation):
        plane.watch(["job-1", "ghost"], seen.append)
    # And nothing was registered
    plane.complete("job-1", claim.lease_token, b"r")
    assert seen == []


def test_a_watch_of_calls_just_submitted_here_needs_no_read_of_the_store(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (an in-memory store: every write, every finish, goes through this plane)
    reads: list[str] = []

    def counted(name: str) -> Callable[..., Any]:
        real = getattr(plane.store, name)

        def read(*args: Any, **kwargs: Any) -> Any:
            reads.append(name)
            return real(*args, **kwargs)

        return read

    for name in ("finished_among", "get_many", "get"):
        monkeypatch.setattr(plane.store, name, counted(name))
    # Given two calls just submitted
    submit(plane, "job-1")
    submit(plane, "job-2")
    seen: list[str] = []
    # When one watch covers both
    plane.watch(["job-1", "job-2"], lambda rec: seen.append(rec.id))
    # Then it read nothing from the store, and still hears of each finish
    assert reads == []
    for claim in plane.claim([QUEUE], "w1", limit=2):
        plane.complete(claim.id, claim.lease_token, b"r")
    assert sorted(seen) == ["job-1", "job-2"]
    # And a watch after the finish reads the store and fires at once
    late: list[str] = []
    plane.watch(["job-1"], lambda rec: late.append(rec.id))
    assert late == ["job-1"] and reads


def test_a_call_finished_as_its_submit_returns_is_found_by_a_watch_at_once(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker that claims and completes a call between the store taking it and
    # the submit returning (another thread, in the gap after the store's write)
    written = plane.store.insert_many

    def and_run_at_once(invs: Any) -> Any:
        answers = written(invs)
        claim = claim_one(plane)
        assert claim is not None
        plane.complete(claim.id, claim.lease_token, b"fast")
        return answers

    monkeypatch.setattr(plane.store, "insert_many", and_run_at_once)
    submit(plane, "job-1")
    # Then a watch of it fires at once: its finish was told before the submit ended
    seen: list[bytes | None] = []
    plane.watch(["job-1"], lambda rec: seen.append(rec.result))
    assert seen == [b"fast"]


def test_a_watch_of_a_call_whose_queue_was_deleted_with_it_raises(plane: Plane) -> None:
    # Given a call just submitted, then its queue deleted with its invocations
    submit(plane, "job-1")
    plane.delete_queue(QUEUE, force=True)
    # Then a watch of it raises UnknownInvocation (it is not waited for in vain)
    with pytest.raises(UnknownInvocation):
        plane.watch(["job-1"], lambda rec: None)


@pytest.fixture
def two_on_a_file(tmp_path: Path) -> Iterator[tuple[Plane, Plane]]:
    """Two planes on one plane file (as two processes), the queue ``jobs`` made."""
    first, second = (Plane(SqliteStore(str(tmp_path / "plane.db"))) for _ in range(2))
    first.ensure_queue(QueueSpec(QUEUE))
    yield first, second
    first.close()
    second.close()


def test_a_watch_on_a_shared_store_reads_it_for_a_call_submitted_here(
    two_on_a_file: tuple[Plane, Plane],
) -> None:
    # Given two planes on one plane file, a call submitted through the first and
    # completed through the second (the first is not told)
    first, second = two_on_a_file
    submit(first, "job-1")
    claim = claim_one(second)
    assert claim is not None
    second.complete("job-1", claim.lease_token, b"r")
    # When the first watches it
    seen: list[str] = []
    first.watch(["job-1"], lambda rec: seen.append(rec.id))
    # Then it fires at once: the first read the file
    assert seen == ["job-1"]


def test_unwatch_stops_the_callback(plane: Plane) -> None:
    claim = running(plane)
    seen: list[Invocation] = []
    unwatch = plane.watch(["job-1"], seen.append)
    unwatch()
    plane.complete("job-1", claim.lease_token, b"r")
    assert seen == []


def test_wait_returns_the_finished_records(plane: Plane) -> None:
    finished(plane)
    submit(plane, "job-2")
    done = plane.wait(["job-1", "job-2"], timeout=0)
    assert [(r.id, r.state) for r in done] == [("job-1", State.SUCCEEDED)]


def test_wait_returns_every_finished_record_among_the_ids(plane: Plane) -> None:
    # Given two finished invocations
    finished(plane)
    claim = running(plane, "job-2")
    plane.complete("job-2", claim.lease_token, b"two")
    # When both are waited for
    done = plane.wait(["job-1", "job-2"], timeout=0)
    # Then both finished records come back
    assert sorted(r.id for r in done) == ["job-1", "job-2"]


def test_wait_returns_nothing_when_none_finished(plane: Plane) -> None:
    submit(plane)
    assert plane.wait(["job-1"], timeout=0) == []


def test_wait_returns_once_another_thread_finishes_the_invocation(plane: Plane) -> None:
    # Given a thread waiting on a running invocation
    claim = running(plane)
    done: list[list[Invocation]] = []
    waiter = threading.Thread(target=lambda: done.append(plane.wait(["job-1"], timeout=60)))
    waiter.start()
    # When this thread completes it
    plane.complete("job-1", claim.lease_token, b"result")
    waiter.join()
    # Then the waiter got the finished record (whether it started before or after)
    assert [[(r.id, r.result) for r in recs] for recs in done] == [[("job-1", b"result")]]


def test_wait_of_an_unknown_id_raises_unknown_invocation(plane: Plane) -> None:
    with pytest.raises(UnknownInvocation):
        plane.wait(["ghost"], timeout=0)


# =======================================================================================
# set_priority
# =======================================================================================


def test_set_priority_moves_a_pending_invocation_in_a_priority_queue(plane: Plane) -> None:
    # Given a priority queue with three pending invocations
    plane.ensure_queue(QueueSpec("urgent", kind="priority"))
    for inv_id, priority in [("a", 5), ("b", 3), ("c", 1)]:
        submit(plane, inv_id, queue="urgent", priority=priority)
    # When the lowest is raised above the others
    moved = plane.set_priority("c", 9)
    # Then it is handed out first
    assert moved.priority == 9
    claimed = plane.claim(["urgent"], "w1", limit=3)
    assert [c.id for c in claimed] == ["c", "a", "b"]


def test_set_priority_is_refused_for_a_running_invocation(plane: Plane) -> None:
    plane.ensure_queue(QueueSpec("urgent", kind="priority"))
    submit(plane, queue="urgent", priority=1)
    assert plane.claim(["urgent"], "w1")
    with pytest.raises(Conflict, match="is running; only pending ones move"):
        plane.set_priority("job-1", 9)
    assert plane.get("job-1").priority == 1


def test_retry_is_refused_as_a_conflict_unless_the_invocation_failed(plane: Plane) -> None:
    # Given a pending invocation (a request fine once it has failed: out of order now)
    submit(plane)
    # When it is retried, then it is a conflict (409), and it stays as it was
    with pytest.raises(Conflict, match="is pending; only failed or dead ones retry"):
        plane.retry("job-1")
    assert plane.get("job-1").attempt == 0


@pytest.mark.parametrize("priority", [math.nan, math.inf], ids=["nan", "inf"])
def test_set_priority_rejects_a_non_finite_priority(plane: Plane, priority: float) -> None:
    # Given a pending invocation in a priority queue
    plane.ensure_queue(QueueSpec("urgent", kind="priority"))
    submit(plane, queue="urgent", priority=1)
    # When its priority is set to a non-finite number
    # Then it is refused with InvalidRequest, as it is at submit
    with pytest.raises(InvalidRequest):
        plane.set_priority("job-1", priority)
    assert plane.get("job-1").priority == 1


def test_set_priority_of_an_unknown_invocation_raises_unknown_invocation(plane: Plane) -> None:
    with pytest.raises(UnknownInvocation):
        plane.set_priority("ghost", 1)


# =======================================================================================
# Queues: ensure_queue, delete_queue
# =======================================================================================


def test_ensure_queue_creates_a_missing_queue(make_plane: Callable[..., Plane]) -> None:
    plane = make_plane()
    spec = QueueSpec("fresh", kind="filo")
    assert plane.ensure_queue(spec) == spec
    assert plane.get_queue("fresh") == spec


def test_ensure_queue_returns_the_existing_queue(plane: Plane) -> None:
    # Given a fifo queue
    # When it is ensured with another kind but nothing checked
    got = plane.ensure_queue(QueueSpec(QUEUE, kind="filo"))
    # Then the existing queue is returned unchanged
    assert got == QueueSpec(QUEUE)
    assert plane.get_queue(QUEUE) == QueueSpec(QUEUE)


def test_ensure_queue_raises_queue_mismatch_when_a_checked_setting_differs(
    plane: Plane,
) -> None:
    with pytest.raises(QueueMismatch):
        plane.ensure_queue(QueueSpec(QUEUE, kind="filo"), check=["kind"])
    assert plane.get_queue(QUEUE).kind == "fifo"


def test_ensure_queue_accepts_a_difference_in_an_unchecked_setting(plane: Plane) -> None:
    spec = QueueSpec(QUEUE, elasticity={"kind": "fixed", "max": 3})
    assert plane.ensure_queue(spec, check=["kind"]) == QueueSpec(QUEUE)


def test_ensure_queue_without_create_raises_queue_not_found_for_a_missing_queue(
    plane: Plane,
) -> None:
    with pytest.raises(QueueNotFound):
        plane.ensure_queue(QueueSpec("missing"), create=False)
    with pytest.raises(QueueNotFound):
        plane.get_queue("missing")


def test_ensure_queue_without_create_returns_an_existing_queue(plane: Plane) -> None:
    assert plane.ensure_queue(QueueSpec(QUEUE), create=False) == QueueSpec(QUEUE)


@pytest.mark.parametrize("busy", ["pending", "scheduled", "running"])
def test_delete_queue_without_force_refuses_a_busy_queue(plane: Plane, busy: str) -> None:
    # Given a queue with one invocation that is pending, scheduled or running
    submit(plane, delay=10 if busy == "scheduled" else 0)
    if busy == "running":
        assert claim_one(plane) is not None
    # When it is deleted without force
    # Then it is refused, and the queue and invocation stay
    with pytest.raises(InvalidRequest, match="--force, force=true, force=True"):
        plane.delete_queue(QUEUE)  # (saying how to, on each surface)
    assert plane.get_queue(QUEUE) == QueueSpec(QUEUE)
    assert plane.get("job-1").public_state(plane.now()).value == busy


def test_delete_queue_with_force_removes_a_busy_queue_and_its_invocations(
    plane: Plane,
) -> None:
    submit(plane, "job-1")
    submit(plane, "job-2")
    assert plane.delete_queue(QUEUE, force=True) == 2
    with pytest.raises(QueueNotFound):
        plane.get_queue(QUEUE)
    with pytest.raises(UnknownInvocation):
        plane.get("job-1")


def test_delete_queue_without_force_removes_a_queue_of_finished_work(plane: Plane) -> None:
    finished(plane)
    assert plane.delete_queue(QUEUE) == 1
    with pytest.raises(QueueNotFound):
        plane.get_queue(QUEUE)


def test_delete_queue_of_a_missing_queue_raises_queue_not_found(plane: Plane) -> None:
    with pytest.raises(QueueNotFound):
        plane.delete_queue("missing")


# =======================================================================================
# Validation
# =======================================================================================


@pytest.mark.parametrize(
    "spec",
    [
        QueueSpec(""),
        QueueSpec("q", kind="lifo"),
        QueueSpec("q", kind="boltzmann", temperature=0),
        QueueSpec("q", kind="boltzmann", temperature=-1.0),
        QueueSpec("q", kind="boltzmann", temperature=math.nan),
        QueueSpec("q", elasticity={"kind": "auto", "max": 2}),
        QueueSpec("q", elasticity={"kind": "fixed"}),
        QueueSpec("q", elasticity={"kind": "fixed", "max": 0}),
        QueueSpec("q", elasticity={"kind": "fixed", "max": 2.5}),
    ],
    ids=[
        "empty-name",
        "unknown-kind",
        "zero-temperature",
        "negative-temperature",
        "nan-temperature",
        "unknown-elasticity",
        "elasticity-without-max",
        "elasticity-max-0",
        "elasticity-max-not-int",
    ],
)
def test_ensure_queue_rejects_an_invalid_spec(
    make_plane: Callable[..., Plane], spec: QueueSpec
) -> None:
    plane = make_plane()
    with pytest.raises(InvalidRequest):
        plane.ensure_queue(spec)
    assert plane.list_queues() == []


@pytest.mark.parametrize(
    "submission",
    [
        Submission("", QUEUE, b"x"),
        Submission("x" * 129, QUEUE, b"x"),
        Submission("i", QUEUE, b"x", timeout=0),
        Submission("i", QUEUE, b"x", timeout=-5),
        Submission("i", QUEUE, b"x", max_attempts=0),
        Submission("i", QUEUE, b"x", priority=math.nan),
        Submission("i", QUEUE, b"x", priority=math.inf),
        Submission("i", QUEUE, b"x", delay=math.inf),
    ],
    ids=[
        "empty-id",
        "id-too-long",
        "zero-timeout",
        "negative-timeout",
        "zero-max-attempts",
        "nan-priority",
        "infinite-priority",
        "infinite-delay",
    ],
)
def test_submit_rejects_an_invalid_submission(plane: Plane, submission: Submission) -> None:
    with pytest.raises(InvalidRequest):
        plane.submit([submission])
    assert not any(plane.counts(QUEUE).values())


def test_a_refusal_in_a_batch_names_the_call_it_is_about() -> None:
    # Given a batch of calls, the second with a timeout of zero
    plane = Plane(SqliteStore(":memory:"))
    plane.ensure_queue(QueueSpec(QUEUE))
    calls = [Submission("ok-1", QUEUE, b"x"), Submission("zero", QUEUE, b"x", timeout=0)]
    # When it is submitted, then the refusal says which call (nothing is taken)
    with pytest.raises(InvalidRequest, match=r"^invocation 'zero': timeout must be > 0 seconds$"):
        plane.submit(calls)
    assert not any(plane.counts(QUEUE).values())
    plane.close()


def test_a_delayed_call_comes_due_for_a_claim_after_a_look_that_left_nothing_due(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a call delayed 5 s and one due now, the second taken (the head read short)
    submit(plane, "later", delay=5.0)
    submit(plane, "now")
    taken = claim_one(plane)
    assert taken is not None and taken.id == "now"
    assert claim_one(plane) is None
    # When the delay passes, with nothing written since
    clock.advance(5.0)
    # Then a claim takes the delayed call
    late = claim_one(plane)
    assert late is not None and late.id == "later"


def test_a_retry_comes_due_for_a_claim_after_a_look_that_left_nothing_due(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a call that raised and waits out a 1 s backoff, and a claim that found
    # nothing due since
    claim = running(plane, retry=RetryPolicy(max=1, backoff=1))
    plane.fail("job-1", claim.lease_token, ERROR)
    assert claim_one(plane) is None
    assert claim_one(plane) is None
    # When the backoff passes, with nothing written since
    clock.advance(1.0)
    # Then a claim takes the retry
    retry = claim_one(plane)
    assert retry is not None and (retry.id, retry.attempt) == ("job-1", 2)


def test_a_claim_takes_a_call_another_process_submitted_to_the_plane_file(
    two_on_a_file: tuple[Plane, Plane],
) -> None:
    # Given a plane file and a claim that took its one call
    first, other = two_on_a_file
    assert running(first).id == "job-1"
    # When another process submits (this plane is not told)
    submit(other, "job-2")
    # Then the next claim here takes it
    again = claim_one(first)
    assert again is not None and again.id == "job-2"


def test_claim_rejects_a_limit_below_one(plane: Plane) -> None:
    with pytest.raises(InvalidRequest):
        plane.claim([QUEUE], "w1", limit=0)


def test_a_cursor_wait_moves_past_other_finishes_and_still_answers_its_own(
    plane: Plane,
) -> None:
    # Given a cursor taken before thirty invocations finish, and one more still running
    plane.submit([Submission(f"j{n}", QUEUE, b"x") for n in range(31)])
    cursor = plane.wait_cursor()
    by_id = {c.id: c for c in plane.claim([QUEUE], "w", limit=31)}
    for n in range(30):
        plane.complete(f"j{n}", by_id[f"j{n}"].lease_token, b"r")
    looked: list[float] = []
    store: Any = plane.store
    lately = store.finished_since

    def counted(ids: Any, since: float) -> list[Invocation]:
        looked.append(since)
        return list(lately(ids, since))

    store.finished_since = counted
    # When a wait on the running one looks (0.3 s: three looks, a quarter second apart)
    assert plane.wait(["j30"], 0.3, since=cursor) == []
    # Then after its first look found none of its own, it looked past what it had seen
    assert looked[0] == cursor and len(looked) >= 2 and looked[1] > cursor
    # And a wait from the same cursor still answers it once it finishes
    plane.complete("j30", by_id["j30"].lease_token, b"r")
    assert [r.id for r in plane.wait(["j30"], 1.0, since=cursor)] == ["j30"]


def test_finishes_in_this_process_do_not_wake_the_cross_process_poller(
    tmp_path: Any, clock: FakeClock
) -> None:
    # Given a plane file (another process may write it: a poller reads its change
    # marker every poll interval while anybody waits) and a result wait held on it
    store = SqliteStore(tmp_path / "plane.db")
    store.poll_interval = 30.0
    plane = Plane(store, clock=clock)
    plane.ensure_queue(QueueSpec(QUEUE))
    reads: list[int] = []
    read_marker = store.change_marker

    def counting() -> int:
        if threading.current_thread().name == "lakeshore-changes":  # (the poller's reads)
            reads.append(1)
        return read_marker()

    store.change_marker = counting  # type: ignore[method-assign]
    park = None
    try:
        submit(plane, "held")
        with plane.changes.parking() as parked:
            assert plane.wait(["held"], 60) == []
        park = parked()
        assert park is not None
        plane.changes.hold(park)
        polling = [t for t in threading.enumerate() if t.name == "lakeshore-changes"]
        assert polling and polling[0].is_alive(), "no poller runs for the held wait"
        # When twenty invocations finish in this process (each told to the result waits)
        for i in range(20):
            submit(plane, f"job-{i}")
            (claim,) = plane.claim([QUEUE], "w1")
            plane.complete(claim.id, claim.lease_token, b"r")
        # Then the poller slept through them: its first read is a poll interval away
        assert reads == [], f"the poller read the marker {len(reads)} times"
    finally:
        if park is not None:
            plane.changes.unhold(park)
        plane.close()


# =======================================================================================
# Parking: waits an event loop holds instead of a thread
# =======================================================================================


def test_a_parking_claim_answers_at_once_and_says_what_it_waits_for(plane: Plane) -> None:
    changes = plane.changes
    told: list[int] = []
    unsubscribe = changes.subscribe(lambda n, queues: told.append((n, queues)))
    began = time.monotonic()
    with changes.parking() as parked:
        assert plane.claim([QUEUE], "w1", wait=30) == []
    park = parked()
    assert park is not None and park.kind == "generation" and not park.finishes
    assert time.monotonic() - began < 5 and park.until > began + 29
    # nothing is scheduled: it looks again on a change, else only every PARKED_LOOK
    assert park.timeout == PARKED_LOOK
    assert not changes.changed(park)
    # a submit is the change it waits for, and subscribers are told of it
    submit(plane)
    # (worth waking one claim wait, on the submit's queue)
    assert changes.changed(park) and told == [(1, frozenset({QUEUE}))]
    assert park.queues == frozenset({QUEUE})
    with changes.parking() as parked:
        (claim,) = plane.claim([QUEUE], "w1", wait=30)
    assert parked() is None and claim.id == "job-1"
    unsubscribe()


def test_a_parking_result_wait_waits_for_a_finish(plane: Plane) -> None:
    claim = running(plane)
    changes = plane.changes
    cursor = plane.wait_cursor()
    for since in (None, cursor):
        with changes.parking() as parked:
            assert plane.wait(["job-1"], 30, since=since) == []
        park = parked()
        assert park is not None and park.kind == "finishes" and not changes.changed(park)
    plane.complete("job-1", claim.lease_token, b"result")
    assert changes.changed(park)
    with changes.parking() as parked:
        (done,) = plane.wait(["job-1"], 30, since=cursor)
    assert parked() is None and done.state is State.SUCCEEDED


def test_a_parking_result_wait_keeps_its_watch_and_layers_wrap_its_answer(
    plane: Plane,
) -> None:
    claim = running(plane)
    changes = plane.changes
    # A parked result wait keeps its watch: the park holds the box the watch fills
    with changes.parking() as parked:
        assert plane.wait(["job-1"], 30) == []
        changes.then(lambda inner: lambda recs: {"ids": [r.id for r in inner(recs)]})
    park = parked()
    assert park is not None and park.box == [] and park.release is not None
    assert park.settled() is None  # (nothing yet: the holder would look again)
    plane.complete("job-1", claim.lease_token, b"result")
    assert [r.id for r in park.box] == ["job-1"] and park.settled() == {"ids": ["job-1"]}
    park.release()
    # The thread keeps no park once the block is over
    with changes.parking() as parked:
        pass
    assert parked() is None
    # A claim's park holds the box a submit's hand-over fills (test_handoff.py), and
    # layers wrap its answer too; outside parking, nothing to wrap
    with changes.parking() as parked:
        assert plane.claim([QUEUE], "w1", wait=30) == []
        changes.then(lambda inner: lambda got: {"n": len(inner(got))})
    claim_park = parked()
    assert claim_park is not None and claim_park.box == [] and claim_park.taker is not None
    assert claim_park.settled() is None
    assert claim_park.answer is not None and claim_park.answer([1, 2]) == {"n": 2}
    changes.then(lambda inner: inner)
    # Keeping a watch without a park releases it at once
    released: list[int] = []
    changes.keep([], lambda: released.append(1))
    assert released == [1]


def test_a_held_park_on_a_capped_queue_is_woken_by_a_finish(plane: Plane) -> None:
    plane.ensure_queue(QueueSpec("capped", elasticity={"kind": "fixed", "max": 1}))
    submit(plane, "a", queue="capped")
    submit(plane, "b", queue="capped")
    (first,) = plane.claim(["capped"], "w1")
    changes = plane.changes
    with changes.parking() as parked:
        assert plane.claim(["capped"], "w2", wait=30) == []
    park = parked()
    assert park is not None and park.finishes
    changes.hold(park)  # as a server holding the request does
    plane.complete("a", first.lease_token, b"r")
    changes.unhold(park)
    assert changes.changed(park)


def asleep(changes: Any) -> int:
    """Claim waits asleep now and not woken since (each sleeps on a wake of its own:
    ``Changes._sleepers`` is their line)."""
    return len(changes._sleepers)


def waiting(changes: Any, n: int) -> None:
    """Return once ``n`` threads sleep in claim waits (nothing announces it: the sleepers
    are looked at until there are ``n``)."""
    wait_for(lambda: asleep(changes) >= n, 5, "the claim waits did not start", 0.001)


def handing_nothing_over(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    """Submits hand no record to a waiting claim (as for a batch, or a call on a capped
    or Boltzmann queue: see test_handoff.py): what is left is the wakes."""
    monkeypatch.setattr(plane, "_hand_over", lambda *args: None)


def test_a_submit_wakes_as_many_claim_waits_as_records_and_a_wake_is_passed_on(
    plane: Plane,
) -> None:
    changes = plane.changes
    woke: list[str] = []
    first = threading.Event()

    def wait(name: str) -> None:
        changes.wait(changes.generation, 5.0)
        woke.append(name)
        first.set()

    # Given two claim waits asleep
    since = changes.generation
    threads = [threading.Thread(target=wait, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    waiting(changes, 2)
    # When a submit of one record notifies
    changes.notify(1)
    assert changes.generation == since + 1
    # Then one wakes and the other sleeps on (a notify takes its sleepers off at once)
    assert asleep(changes) == 1
    assert first.wait(3) and len(woke) == 1
    # And when that one found nothing and passes the wake on, the other wakes
    changes.pass_on()
    assert not asleep(changes)
    for t in threads:
        t.join(3)
    assert sorted(woke) == ["a", "b"]


def looking(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, who: str, *, after: bool = False
) -> tuple[Any, Any]:
    """Hold the first look at the store of thread ``who``'s claim, before it reads (or
    ``after``): returns the events (it is held, let it go on). Its look is made even
    where a look just before found its queues drained (see ``Changes.drained``)."""
    inside, go = threading.Event(), threading.Event()
    real = plane._claim_now
    monkeypatch.setattr(plane.changes, "drained_until", lambda *args: None)

    def held(*args: Any, **kwargs: Any) -> Any:
        first = threading.current_thread().name == who and not inside.is_set()
        if first and not after:
            inside.set()
            assert go.wait(10)
        found = real(*args, **kwargs)
        if first and after:
            inside.set()
            assert go.wait(10)
        return found

    monkeypatch.setattr(plane, "_claim_now", held)
    return inside, go


def claiming(
    plane: Plane, got: dict[str, list[Claim]], name: str, queues: list[str]
) -> threading.Thread:
    """A thread named ``name`` making a blocking claim on ``queues`` (up to 30 s), its
    answer into ``got[name]``; started."""

    def claim() -> None:
        got[name] = plane.claim(queues, name, wait=30)

    thread = threading.Thread(target=claim, name=name)
    thread.start()
    return thread


def test_a_submit_during_a_claims_look_leaves_its_wake_to_that_claim(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim asleep, and another in the middle of its look at an empty queue (a
    # call is not handed to the sleeper)
    handing_nothing_over(plane, monkeypatch)
    got: dict[str, list[Claim]] = {}
    sleeper = claiming(plane, got, "sleeper", [QUEUE])
    waiting(plane.changes, 1)
    inside, go = looking(plane, monkeypatch, "looker")
    looker = claiming(plane, got, "looker", [QUEUE])
    assert inside.wait(10)
    # When a call is submitted meanwhile
    submit(plane)
    # Then the sleeping claim is not woken (it would only race the looker for it)
    assert asleep(plane.changes) == 1
    # and the looker, done with its look, sees the change and takes the call
    go.set()
    looker.join(10)
    assert [c.id for c in got["looker"]] == ["job-1"]
    assert asleep(plane.changes) == 1
    submit(plane, "job-2")
    sleeper.join(10)
    assert [c.id for c in got["sleeper"]] == ["job-2"]


def test_a_claim_that_took_other_work_passes_on_the_wake_left_to_it(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim asleep on one queue (its naps long: only a wake brings it back), and
    # a claim in the middle of its look at another queue, which holds a call (a call is
    # not handed to the sleeper)
    monkeypatch.setattr(workers_module, "LOOK_AGAIN", 60.0)
    handing_nothing_over(plane, monkeypatch)
    plane.ensure_queue(QueueSpec("other"))
    submit(plane, "other-1", queue="other")
    got: dict[str, list[Claim]] = {}
    sleeper = claiming(plane, got, "sleeper", [QUEUE])
    waiting(plane.changes, 1)
    inside, go = looking(plane, monkeypatch, "looker")
    looker = claiming(plane, got, "looker", ["other"])
    assert inside.wait(10)
    # When a call is submitted to the sleeper's queue meanwhile (its wake left to the
    # looker), and the looker's look takes the call it found
    submit(plane)
    go.set()
    looker.join(10)
    assert [c.id for c in got["looker"]] == ["other-1"]
    # Then the looker passed the wake on: the sleeper takes the new call now
    sleeper.join(10)
    assert not sleeper.is_alive() and [c.id for c in got["sleeper"]] == ["job-1"]


@pytest.mark.parametrize("looker_queue", [QUEUE, "other"])
def test_a_claim_whose_next_look_takes_other_work_passes_on_the_wake_it_owed(
    plane: Plane, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, looker_queue: str
) -> None:
    # Given a call delayed on the looker's queue, a claim asleep on "jobs" (its naps
    # long: only a wake brings it back), and a claim held just after a look that found
    # nothing (a call is not handed to the sleeper)
    monkeypatch.setattr(workers_module, "LOOK_AGAIN", 60.0)
    handing_nothing_over(plane, monkeypatch)
    plane.ensure_queue(QueueSpec("other"))
    submit(plane, "early", queue=looker_queue, delay=50)
    got: dict[str, list[Claim]] = {}
    sleeper = claiming(plane, got, "sleeper", [QUEUE])
    waiting(plane.changes, 1)
    looked, go = looking(plane, monkeypatch, "looker", after=True)
    looker = claiming(plane, got, "looker", [looker_queue])
    assert looked.wait(10)
    # When the delayed call comes due, and a call to "jobs" is submitted during the look
    # (its wake left to the looker), whose next look takes the call that came due
    clock.advance(100)
    submit(plane)
    go.set()
    looker.join(10)
    assert [c.id for c in got["looker"]] == ["early"]
    # Then the wake it owed went on to the sleeper, which takes the new call now
    sleeper.join(10)
    assert not sleeper.is_alive() and [c.id for c in got["sleeper"]] == ["job-1"]


@pytest.mark.parametrize("handed", [True, False], ids=["handed", "woken"])
def test_a_claim_on_another_queue_than_the_submit_still_gets_its_work(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, handed: bool
) -> None:
    # a wait on "other", asleep first, takes the one wake of a submit to "jobs": it
    # finds nothing there and passes it on (or the call is handed to the wait on "jobs")
    # (the claims do not look again on their own: a lost wake would leave them asleep)
    monkeypatch.setattr(workers_module, "LOOK_AGAIN", 60.0)
    if not handed:
        handing_nothing_over(plane, monkeypatch)
    plane.ensure_queue(QueueSpec("other"))
    got: dict[str, list[Claim]] = {}
    looks = counting_calls(plane, "_claim_now", monkeypatch)

    def claim(queue: str) -> None:
        got[queue] = plane.claim([queue], f"w-{queue}", wait=30)

    threads = [threading.Thread(target=claim, args=(q,)) for q in ("other", QUEUE)]
    for n, t in enumerate(threads, 1):
        t.start()
        waiting(plane.changes, n)
    first_looks = len(looks)
    submit(plane)
    threads[1].join(5)
    assert not threads[1].is_alive() and [c.id for c in got[QUEUE]] == ["job-1"]
    # (handed: nobody looked; woken: the claim on "other" looked and passed it on)
    assert len(looks) - first_looks == (0 if handed else 2)
    submit(plane, "job-2", queue="other")
    threads[0].join(5)
    assert not threads[0].is_alive() and [c.id for c in got["other"]] == ["job-2"]


def test_a_queue_stored_with_a_retry_now_refused_still_takes_other_updates(
    plane: Plane,
) -> None:
    # Given a queue whose stored retry backoff is below zero (taken before the check)
    plane.store.put_queue(QueueSpec("old", retry={"max": 1, "backoff": -1.0}), plane.now())
    # When another of its settings changes, then that is taken
    updated = plane.update_queue("old", elasticity={"kind": "fixed", "max": 2})
    assert updated.elasticity == {"kind": "fixed", "max": 2}
    # while a retry given now is checked
    with pytest.raises(InvalidRequest, match=r"retry\.backoff"):
        plane.update_queue("old", retry={"max": 1, "backoff": -2.0})
