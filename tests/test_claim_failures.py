"""A claim that fails part-way on a plane file: what it leased is answered or was never
written, never left leased to a request that failed (its client's retry would lease
other calls, and these would wait out their leases). The DynamoDB store's cases are in
``test_dynamo_store.py``."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.plane import Plane, QueueSpec, State, Submission
from dreamlake.lakeshore.stores import SqliteStore


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    plane = Plane(SqliteStore(tmp_path / "plane.db"), clock=FakeClock())
    # a capped queue is leased one call at a time: its second lease is a second write
    plane.ensure_queue(QueueSpec("a", elasticity={"kind": "fixed", "max": 5}))
    plane.ensure_queue(QueueSpec("b"))
    plane.submit([Submission(f"a{n}", "a", b"x") for n in range(3)])
    plane.submit([Submission(f"b{n}", "b", b"x") for n in range(2)])
    yield plane
    plane.close()


def _second_lease_fails(plane: Plane, *, rolls_back: bool) -> None:
    store: Any = plane.store
    real = store.update_many_if
    calls: list[int] = []

    def failing(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            if rolls_back:  # (SQLite's answer to a full disk or an I/O error)
                store._db.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return real(*args, **kw)

    store.update_many_if = failing


def _states(plane: Plane) -> dict[str, State]:
    return {i: plane.get(i).state for i in ("a0", "a1", "a2", "b0", "b1")}


def test_a_claim_whose_later_lease_fails_answers_the_one_before(plane: Plane) -> None:
    # Given a claim of many whose second lease fails (the transaction still open)
    _second_lease_fails(plane, rolls_back=False)
    # When it claims on both queues
    claims = plane.claim(["a", "b"], "w", limit=5)
    # Then it answers the first call, written leased to it, and goes no further
    assert [c.id for c in claims] == ["a0"]
    assert plane.get("a0").lease_token == claims[0].lease_token
    assert _states(plane) == {
        "a0": State.RUNNING,
        "a1": State.PENDING,
        "a2": State.PENDING,
        "b0": State.PENDING,
        "b1": State.PENDING,
    }


def test_a_claim_whose_transaction_sqlite_rolled_back_fails_having_leased_nothing(
    plane: Plane,
) -> None:
    # Given a claim of many whose second lease fails and rolls the transaction back
    _second_lease_fails(plane, rolls_back=True)
    # When it claims on both queues, then it fails, and nothing is leased: not the first
    # lease (rolled back), nor the other queue's calls (never written outside the batch)
    with pytest.raises(sqlite3.OperationalError, match="rolled back"):
        plane.claim(["a", "b"], "w", limit=5)
    assert set(_states(plane).values()) == {State.PENDING}
    # And the plane goes on: the next claim takes them
    assert len(plane.claim(["a", "b"], "w", limit=5)) == 5


def test_a_claim_whose_commit_fails_leaves_nothing_leased_and_the_store_usable(
    plane: Plane,
) -> None:
    # Given a plane file whose next COMMIT is refused (as a failing disk would)
    store: Any = plane.store
    refused = [True]

    def authorizer(action: int, arg: str | None, *_: Any) -> int:
        if action == sqlite3.SQLITE_TRANSACTION and arg == "COMMIT" and refused[0]:
            refused[0] = False
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    store._db.set_authorizer(authorizer)
    # When a claim of many fails at its commit
    with pytest.raises(sqlite3.DatabaseError):
        plane.claim(["b"], "w", limit=2)
    # Then the connection is not left inside the failed transaction: another connection
    # sees nothing leased, and the next claims lease and commit as usual
    assert not store._db.in_transaction
    other = sqlite3.connect(store.path)
    try:
        rows = other.execute("SELECT count(*) FROM invocations WHERE state = 'running'")
        assert rows.fetchone() == (0,)
        assert len(plane.claim(["b"], "w", limit=2)) == 2
        assert len(plane.claim(["a"], "w")) == 1
        rows = other.execute("SELECT count(*) FROM invocations WHERE state = 'running'")
        assert rows.fetchone() == (3,)
    finally:
        other.close()
