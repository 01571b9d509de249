"""A claim's look left out while nothing new came (``Changes.drained``).

On a store no other process writes (``:memory:``), a claim right after a look that left
its queues with nothing to take does not read them again until a change is told, its
queues' scheduled work comes due, or ``LOOK_AGAIN`` passes: a worker that has just
finished a job waits at once. Each test here fails if one of those rules is dropped.
Time passes on the plane's FakeClock; real waits are short and bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.plane import Plane, QueueSpec, RetryPolicy, Submission
from dreamlake.lakeshore.plane import changes as changes_module
from dreamlake.lakeshore.plane import workers as workers_module
from dreamlake.lakeshore.stores import SqliteStore

pytestmark = pytest.mark.timeout(60)

QUEUE = "jobs"
ERROR = {"type": "builtins.ValueError", "message": "boom", "traceback": "tb", "pickled": None}


@pytest.fixture
def plane(clock: FakeClock) -> Iterator[Plane]:
    plane = Plane(SqliteStore(":memory:"), clock=clock)
    plane.ensure_queue(QueueSpec(QUEUE))
    yield plane
    plane.close()


def submit(plane: Plane, inv_id: str, **options: Any) -> None:
    plane.submit([Submission(inv_id, QUEUE, b"x", **options)])


def take(plane: Plane, wait: float = 0.0) -> list[str]:
    return [c.id for c in plane.claim([QUEUE], "w", wait=wait)]


def looks(plane: Plane) -> Callable[[], int]:
    """Counts the statements that read a queue's head or its next due time."""
    seen: list[str] = []
    plane.store._db.set_trace_callback(seen.append)  # type: ignore[attr-defined]

    def count() -> int:
        n = sum("inv_pending" in s or "min(available_at)" in s for s in seen)
        seen.clear()
        return n

    return count


def drain(plane: Plane) -> None:
    """Take the queue's last call after an empty look that waited: the queue is known
    drained, nothing scheduled."""
    assert take(plane, wait=0.01) == []
    submit(plane, "first")
    assert take(plane) == ["first"]


def test_a_claim_after_the_last_call_was_taken_waits_without_reading_the_queue(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queue whose last call was just taken (and claims that do not look again
    # on their own, nor forget that look, for a minute)
    monkeypatch.setattr(changes_module, "LOOK_AGAIN", 60.0)
    monkeypatch.setattr(workers_module, "LOOK_AGAIN", 60.0)
    drain(plane)
    count = looks(plane)
    # When a worker claims again, waiting, and a call comes while it waits
    got: list[list[str]] = []
    worker = threading.Thread(target=lambda: got.append(take(plane, wait=10)))
    worker.start()
    wait_for(lambda: len(plane._changes._sleepers) == 1, 5, "the claim did not wait")
    # Then it waited without reading the queue
    assert count() == 0
    submit(plane, "second")
    worker.join(10)
    # and the call was handed to it: it took the call without a look either
    assert got == [["second"]]
    assert count() == 0
    # When it claims again, and a batch comes while it waits (not handed over)
    worker = threading.Thread(target=lambda: got.append(take(plane, wait=10)))
    worker.start()
    wait_for(lambda: len(plane._changes._sleepers) == 1, 5, "the claim did not wait")
    assert count() == 0
    plane.submit([Submission(f"third-{n}", QUEUE, b"x") for n in range(2)])
    worker.join(10)
    # Then the batch woke it: it looked and took the first call
    assert got[1:] == [["third-0"]]
    assert count() == 1


def test_a_call_scheduled_before_the_look_is_taken_when_it_comes_due(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a call delayed 10 s, found not due by an empty look
    submit(plane, "later", delay=10)
    assert take(plane, wait=0.01) == []
    # When its time comes and a worker claims
    clock.advance(11)
    # Then it is taken (the look is not left out past the time it came due)
    assert take(plane) == ["later"]


def test_a_delayed_call_submitted_since_the_last_look_is_taken_when_due(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a drained queue, then a call delayed 10 s and one due now; a claim takes the
    # one due now, leaving the delayed one (its short read says nothing is due)
    drain(plane)
    submit(plane, "later", delay=10)
    submit(plane, "now")
    assert take(plane) == ["now"]
    # When the delayed one comes due
    clock.advance(11)
    # Then the next claim takes it: that look took the last due call, but not the last
    # of the queue
    assert take(plane) == ["later"]


def test_a_retry_scheduled_since_the_last_look_is_taken_when_due(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a drained queue whose last call failed and will be retried in 1 s, and a
    # claim since that took the only call due
    drain(plane)
    submit(plane, "flaky", retry=RetryPolicy(max=1, backoff=1))
    (claim,) = plane.claim([QUEUE], "w")
    plane.fail(claim.id, claim.lease_token, ERROR)
    submit(plane, "now")
    assert take(plane) == ["now"]
    # When the retry comes due
    clock.advance(2)
    # Then it is claimed
    assert take(plane) == ["flaky"]


def test_a_look_is_left_out_only_where_every_write_is_told_here(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two planes on one file, the first not watching the file (as if its poller
    # had not seen the other's write yet), and a queue the first just drained
    path = str(tmp_path / "plane.db")
    first = Plane(SqliteStore(path), clock=clock)
    second = Plane(SqliteStore(path), clock=clock)
    monkeypatch.setattr(first._changes, "_ensure_poller", lambda: None)
    try:
        first.ensure_queue(QueueSpec(QUEUE))
        drain(first)
        # When the second submits and the first claims at once
        submit(second, "elsewhere")
        # Then the first looks and takes it (it is not told of the other's writes)
        assert take(first) == ["elsewhere"]
    finally:
        first.close()
        second.close()


def test_a_look_left_out_is_taken_again_after_the_look_again_pace(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queue just drained, and a call the store has that no change told of
    drain(plane)
    monkeypatch.setattr(plane._changes, "notify", lambda *a, **k: None)
    submit(plane, "untold")
    assert take(plane) == []  # (the look is left out: nothing was told)
    # When LOOK_AGAIN passes
    # Then a claim looks and takes it
    wait_for(lambda: take(plane) == ["untold"], 5, "the untold call was not taken")


def test_a_lease_the_claims_own_sweep_hands_back_is_taken_by_that_claim(
    clock: FakeClock,
) -> None:
    # Given a call leased and a claim that found the queue empty since
    plane = Plane(SqliteStore(":memory:"), clock=clock, lease_seconds=5, sweep_interval=1)
    try:
        plane.ensure_queue(QueueSpec(QUEUE))
        submit(plane, "leased")
        assert take(plane) == ["leased"]
        assert take(plane, wait=0.01) == []
        # When the lease runs out and a claim comes (its sweep hands the call back)
        clock.advance(10)
        # Then that claim takes it (the sweep's change is seen, not the look before it)
        assert take(plane) == ["leased"]
    finally:
        plane.close()


def test_a_call_submitted_during_an_empty_look_does_not_hide_a_scheduled_one(
    plane: Plane, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a call scheduled in 10 s, and a claim whose look reads the queue's head just
    # before a call due now lands (its read of the next due time then finds that one)
    submit(plane, "scheduled", delay=10)
    read = plane.store.pending
    landed: list[bool] = []

    def pending(queue: str, now: float, limit: int) -> Any:
        rows = read(queue, now, limit)
        if not landed:
            landed.append(True)
            submit(plane, "now")
        return rows

    monkeypatch.setattr(plane.store, "pending", pending)
    # When the claim takes the call due now (on its next look), and the scheduled one
    # comes due
    assert take(plane, wait=5) == ["now"]
    clock.advance(11)
    # Then a claim takes the scheduled one
    assert take(plane) == ["scheduled"]
