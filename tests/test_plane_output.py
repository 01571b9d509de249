"""A running job's output and progress, and handing a claim back untried."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.errors import InvalidRequest, LeaseLost, UnknownInvocation
from dreamlake.lakeshore.plane import Plane, QueueSpec, State, Submission
from dreamlake.lakeshore.stores import SqliteStore


@pytest.fixture
def plane() -> Iterator[Plane]:
    p = Plane(SqliteStore(":memory:"), clock=FakeClock(), lease_seconds=10)
    p.ensure_queue(QueueSpec("q"))
    p.submit([Submission(id="job", queue="q", payload=b"x")])
    yield p
    p.close()


def test_logs_are_kept_in_order_across_attempts_and_resends_are_ignored(plane: Plane) -> None:
    # Given a first attempt that writes two chunks, one of them sent twice
    (first,) = plane.claim(["q"], "w1")
    plane.append_logs("job", first.lease_token, [(1, "stdout", "hello\n"), (2, "stderr", "oops\n")])
    plane.append_logs("job", first.lease_token, [(2, "stderr", "oops\n")])
    # When its lease expires and a second attempt writes again
    plane.clock.advance(11)  # type: ignore[attr-defined]
    plane.sweep()
    (second,) = plane.claim(["q"], "w2")
    plane.append_logs("job", second.lease_token, [(1, "stdout", "again\n")])
    # Then reading gives every chunk once, attempt by attempt, with a cursor to follow
    entries = plane.read_logs("job")
    assert [(e.attempt, e.stream, e.text) for e in entries] == [
        (1, "stdout", "hello\n"),
        (1, "stderr", "oops\n"),
        (2, "stdout", "again\n"),
    ]
    assert [e.text for e in plane.read_logs("job", after=entries[1].seq)] == ["again\n"]


def test_only_the_lease_holder_writes_output_or_progress(plane: Plane) -> None:
    (claim,) = plane.claim(["q"], "w")
    with pytest.raises(LeaseLost):
        plane.append_logs("job", "stale", [(1, "stdout", "x")])
    with pytest.raises(LeaseLost):
        plane.report_progress("job", "stale", 0.5)
    with pytest.raises(InvalidRequest):
        plane.append_logs("job", claim.lease_token, [(0, "stdout", "x")])
    with pytest.raises(InvalidRequest):
        plane.append_logs("job", claim.lease_token, [(1, "stdin", "x")])
    with pytest.raises(UnknownInvocation):
        plane.read_logs("nope")


def test_progress_is_recorded_on_the_invocation(plane: Plane) -> None:
    (claim,) = plane.claim(["q"], "w")
    plane.report_progress("job", claim.lease_token, 0.25, "epoch 1/4")
    rec = plane.get("job")
    assert (rec.progress, rec.progress_message) == (0.25, "epoch 1/4")
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InvalidRequest):
            plane.report_progress("job", claim.lease_token, bad)


def test_release_hands_a_claim_back_without_counting_the_attempt(plane: Plane) -> None:
    (claim,) = plane.claim(["q"], "w")
    plane.release("job", claim.lease_token)
    rec = plane.get("job")
    assert (rec.state, rec.attempt, rec.lease_token) == (State.PENDING, 0, None)
    with pytest.raises(LeaseLost):
        plane.complete("job", claim.lease_token, b"late")
    (again,) = plane.claim(["q"], "w")
    assert again.attempt == 1
