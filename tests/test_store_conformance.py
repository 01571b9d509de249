"""Store conformance: every Store primitive, as the protocol documents it, on every store.

Each test takes the one ``store`` fixture, parametrised over :data:`STORES`. A new store
(DynamoDB under moto, say) joins the suite by adding one entry to that table; nothing else
in this file names a store. The second half runs each queue kind's ordering through the
plane core over each store, since the order a claim hands work out is where a store's
sort and the core's order keys meet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.errors import Conflict, LeaseLost, UnknownInvocation
from dreamlake.lakeshore.plane import (
    Invocation,
    Plane,
    QueueSpec,
    RetryPolicy,
    State,
    Store,
    Submission,
)
from dreamlake.lakeshore.plane.ids import group_ids
from dreamlake.lakeshore.plane.model import DaemonRecord
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.submit import new_id

# ---------------------------------------------------------------------------------------
# The stores under test.
#
# Each entry is a context manager: given a scratch directory, it sets up one store (and
# whatever it needs, e.g. a moto mock and tables built from template.yaml) and yields an
# opener. Each call of the opener returns a new handle; when the store is ``shared``, every
# handle sees the same data (as separate processes would). The ``store`` fixture closes
# the handles, then leaves the context. To run the whole suite on another store, write its
# context manager and add one line to STORES.
# ---------------------------------------------------------------------------------------
Opener = Callable[[], Store]


@contextmanager
def sqlite_memory(scratch: Path) -> Iterator[Opener]:
    # Each ":memory:" handle is its own private database.
    yield lambda: SqliteStore(":memory:")


@contextmanager
def sqlite_file(scratch: Path) -> Iterator[Opener]:
    yield lambda: SqliteStore(scratch / "plane.db")


@contextmanager
def dynamodb_moto(scratch: Path) -> Iterator[Opener]:
    # moto in-process, tables and bucket built from template.yaml's own definitions
    # (infra/tables.py), requests serialised because moto's conditional writes are not
    # atomic under threads (the real service's are). Each handle is another process.
    pytest.importorskip("moto")
    from dreamlake.lakeshore.stores.dynamo import DynamoStore
    from infra.tables import moto_stack

    with moto_stack() as (resources, ddb, s3):
        yield lambda: DynamoStore(resources, dynamodb=ddb, s3=s3)


STORES: dict[str, Callable[[Path], AbstractContextManager[Opener]]] = {
    "sqlite-memory": sqlite_memory,
    "sqlite-file": sqlite_file,
    "dynamodb-moto": dynamodb_moto,
}
#: the stores whose handles share data, as separate processes would
SHARED_STORES = ["sqlite-file", "dynamodb-moto"]

T0 = 1_700_000_000.0
_OPENER = pytest.StashKey[Opener]()


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each kind in STORES; every handle opened on it is closed after."""
    handles: list[Store] = []
    with STORES[request.param](tmp_path) as opener:

        def open_handle() -> Store:
            handle = opener()
            handles.append(handle)
            return handle

        request.node.stash[_OPENER] = open_handle
        try:
            yield open_handle()
        finally:
            for handle in reversed(handles):
                handle.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every store test runs on every store; those that open a second handle, on the
    # shared stores only.
    if "store" in metafunc.fixturenames:
        shared = "open_another" in metafunc.fixturenames
        metafunc.parametrize("store", SHARED_STORES if shared else list(STORES), indirect=True)


@pytest.fixture
def open_another(store: Store, request: pytest.FixtureRequest) -> Opener:
    """Opens another handle onto ``store``'s data: what a second process would hold."""
    assert store.shared
    return request.node.stash[_OPENER]


def record(
    inv_id: str,
    queue: str = "q",
    *,
    state: State = State.PENDING,
    order_key: str | None = None,
    available_at: float = T0,
    **fields: Any,
) -> Invocation:
    """An invocation record as the core would build it; ``order_key`` defaults to the id."""
    return Invocation(
        id=inv_id,
        queue=queue,
        state=state,
        payload=fields.pop("payload", b"payload of " + inv_id.encode()),
        request_digest=fields.pop("request_digest", "digest-" + inv_id),
        order_key=order_key if order_key is not None else inv_id,
        priority=fields.pop("priority", 0.0),
        available_at=available_at,
        created_at=fields.pop("created_at", T0),
        max_attempts=fields.pop("max_attempts", 3),
        **fields,
    )


def insert_all(store: Store, *records: Invocation) -> None:
    for rec in records:
        assert store.insert(rec) is None


# =======================================================================================
# Queues
# =======================================================================================


def test_put_queue_creates_the_queue_and_returns_the_stored_spec(store: Store) -> None:
    # Given a queue spec with non-default settings
    spec = QueueSpec(
        "jobs",
        kind="priority",
        priority_field="p",
        elasticity={"kind": "fixed", "max": 4},
        retry={"max": 2, "backoff": 1.0, "max_backoff": 30.0},
    )
    # When it is put into an empty store
    stored = store.put_queue(spec, T0)
    # Then the store returns it and keeps it
    assert stored == spec
    assert store.get_queue("jobs") == spec


def test_put_queue_returns_the_existing_queue_unchanged(store: Store) -> None:
    # Given a fifo queue
    store.put_queue(QueueSpec("jobs", kind="fifo"), T0)
    # When a spec of the same name with other settings is put
    stored = store.put_queue(QueueSpec("jobs", kind="filo"), T0 + 1)
    # Then the existing queue is returned and nothing is overwritten
    assert stored == QueueSpec("jobs", kind="fifo")
    assert store.get_queue("jobs") == QueueSpec("jobs", kind="fifo")


def test_get_queue_of_an_unknown_name_is_none(store: Store) -> None:
    assert store.get_queue("nope") is None


def test_list_queues_lists_every_queue_with_its_last_activity(store: Store) -> None:
    # Given two queues created at different times
    store.put_queue(QueueSpec("a"), T0)
    store.put_queue(QueueSpec("b", kind="filo"), T0 + 5)
    # When they are listed
    listed = {spec.name: (spec, last) for spec, last in store.list_queues()}
    # Then each comes with its spec and last activity
    assert listed == {"a": (QueueSpec("a"), T0), "b": (QueueSpec("b", kind="filo"), T0 + 5)}


def test_touch_queue_records_later_activity(store: Store) -> None:
    # Given a queue created at T0
    store.put_queue(QueueSpec("a"), T0)
    # When activity is recorded later
    store.touch_queue("a", T0 + 30)
    # Then the listing shows it
    assert store.list_queues() == [(QueueSpec("a"), T0 + 30)]


def test_replace_queue_overwrites_an_existing_queue(store: Store) -> None:
    # Given a fifo queue
    store.put_queue(QueueSpec("jobs"), T0)
    # When it is replaced with other settings
    replaced = store.replace_queue(QueueSpec("jobs", elasticity={"kind": "fixed", "max": 2}), T0)
    # Then the new settings are stored
    assert replaced is True
    assert store.get_queue("jobs") == QueueSpec("jobs", elasticity={"kind": "fixed", "max": 2})


def test_replace_queue_of_a_missing_queue_is_false_and_creates_nothing(store: Store) -> None:
    assert store.replace_queue(QueueSpec("ghost"), T0) is False
    assert store.get_queue("ghost") is None


def test_delete_queue_removes_the_queue_and_only_its_invocations(store: Store) -> None:
    # Given two queues with invocations in several states
    store.put_queue(QueueSpec("doomed"), T0)
    store.put_queue(QueueSpec("kept"), T0)
    insert_all(
        store,
        record("d1", "doomed"),
        record("d2", "doomed", state=State.RUNNING),
        record("d3", "doomed", state=State.SUCCEEDED),
        record("k1", "kept"),
    )
    # When one queue is deleted
    gone = store.delete_queue("doomed")
    # Then it and its invocations are gone, and the other queue is untouched
    assert gone == 3
    assert store.get_queue("doomed") is None
    assert store.get_many(["d1", "d2", "d3"]) == []
    assert store.get_queue("kept") == QueueSpec("kept")
    assert store.get("k1") is not None


def test_delete_queue_without_invocations_keeps_its_invocations(store: Store) -> None:
    # Given a queue with a finished invocation
    store.put_queue(QueueSpec("done"), T0)
    insert_all(store, record("d1", "done", state=State.SUCCEEDED, result=b"r"))
    # When the queue alone is deleted
    gone = store.delete_queue("done", invocations=False)
    # Then the queue is gone and its invocation stays readable
    assert gone == 0
    assert store.get_queue("done") is None
    assert store.get("d1") == record("d1", "done", state=State.SUCCEEDED, result=b"r")


def test_queue_counter_adds_and_returns_the_new_value(store: Store) -> None:
    # Given a new queue
    store.put_queue(QueueSpec("jobs"), T0)
    # Then its counter starts at zero and adds up
    assert store.queue_counter("jobs", 0) == 0
    assert store.queue_counter("jobs", 3) == 3
    assert store.queue_counter("jobs", 2) == 5
    assert store.queue_counter("jobs", 0) == 5


def test_queue_counter_of_a_missing_queue_is_zero_and_creates_nothing(store: Store) -> None:
    assert store.queue_counter("ghost", 4) == 0
    assert store.get_queue("ghost") is None


def test_queue_counter_adds_atomically_from_many_threads(store: Store) -> None:
    # Given a queue and 8 threads that each add 1 fifty times
    store.put_queue(QueueSpec("jobs"), T0)
    start = threading.Barrier(8)

    def add_fifty(_: int) -> None:
        start.wait(timeout=30)
        for _ in range(50):
            store.queue_counter("jobs", 1)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(add_fifty, range(8)))
    # Then no add was lost
    assert store.queue_counter("jobs", 0) == 400


def test_a_queue_spec_changed_through_another_handle_is_read_anew(
    store: Store, open_another: Opener
) -> None:
    # Given a queue read through this handle (a store may keep what it read)
    store.put_queue(QueueSpec("jobs"), T0)
    assert store.get_queue("jobs") == QueueSpec("jobs")
    other = open_another()
    # When another handle (another process) changes it, deletes it, makes it again
    changed = QueueSpec("jobs", kind="priority")
    assert other.replace_queue(changed, T0 + 1)
    # Then this handle reads each change
    assert store.get_queue("jobs") == changed
    other.delete_queue("jobs")
    assert store.get_queue("jobs") is None
    other.put_queue(QueueSpec("jobs", kind="filo"), T0 + 2)
    assert store.get_queue("jobs") == QueueSpec("jobs", kind="filo")
    # and its own changes too
    assert store.replace_queue(QueueSpec("jobs"), T0 + 3)
    assert store.get_queue("jobs") == QueueSpec("jobs")
    store.delete_queue("jobs")
    assert store.get_queue("jobs") is None


def test_queue_counter_adds_atomically_from_two_handles_on_the_same_data(
    store: Store, open_another: Opener
) -> None:
    # Given a queue and a second handle onto the same data (another process)
    store.put_queue(QueueSpec("jobs"), T0)
    handles = [store, open_another()] * 4
    start = threading.Barrier(len(handles))

    def add_fifty(n: int) -> None:
        start.wait(timeout=30)
        for _ in range(50):
            handles[n].queue_counter("jobs", 1)

    # When 8 threads on the two handles each add 1 fifty times
    with ThreadPoolExecutor(max_workers=len(handles)) as pool:
        list(pool.map(add_fifty, range(len(handles))))
    # Then no add was lost
    assert store.queue_counter("jobs", 0) == 400


# =======================================================================================
# Invocations: insert, get, get_many
# =======================================================================================


def daemon(daemon_id: str, *, draining: bool = False) -> DaemonRecord:
    return DaemonRecord(
        daemon_id, daemon_id[2:], "host", ["q"], 1, "3.11", [5], 1.0, 1.0, 0, draining
    )


def put_daemon(store: Store, rec: DaemonRecord) -> None:
    """Write ``rec`` whatever is there (what registering a daemon does)."""
    assert store.change_daemon(rec.id, lambda _old: rec) == rec


def test_delete_daemon_removes_only_that_daemon(store: Store) -> None:
    # Given two daemon records
    for name in ("a", "b"):
        put_daemon(store, daemon(f"d-{name}"))
    # When one is deleted, then that says it was there, and only the other is left
    assert store.delete_daemon("d-a") is True
    assert [d.id for d in store.list_daemons()] == ["d-b"]
    assert store.get_daemon("d-a") is None
    # and deleting it again, or one that never was, says there was none
    assert store.delete_daemon("d-a") is False
    assert store.delete_daemon("d-none") is False


def test_change_daemon_hands_over_the_record_and_writes_what_comes_back(store: Store) -> None:
    # Given a daemon record
    put_daemon(store, daemon("d-a"))
    seen: list[DaemonRecord | None] = []

    def drain(rec: DaemonRecord | None) -> DaemonRecord | None:
        seen.append(None if rec is None else replace(rec))
        if rec is not None:
            rec.draining, rec.running = True, 3
        return rec

    # When it is changed, then the change saw it, and the record written comes back and
    # is what is stored
    got = store.change_daemon("d-a", drain)
    assert seen == [daemon("d-a")]
    assert got is not None and (got.draining, got.running) == (True, 3)
    assert store.get_daemon("d-a") == got
    # and a change of a daemon that is not there sees None; returning None writes nothing
    assert store.change_daemon("d-none", drain) is None
    assert seen[-1] is None
    assert [d.id for d in store.list_daemons()] == ["d-a"]
    # while returning a record there creates it
    assert store.change_daemon("d-new", lambda old: daemon("d-new")) == daemon("d-new")
    assert [d.id for d in store.list_daemons()] == ["d-a", "d-new"]


@pytest.mark.parametrize("there", [True, False], ids=["changed", "created"])
def test_change_daemon_keeps_a_write_made_while_it_changes(
    store: Store, open_another: Opener, there: bool
) -> None:
    # Given a daemon record (or none yet), and another handle (another process) that
    # writes it, drained, while the first is in the middle of its change (a heartbeat, or
    # the daemon registering)
    if there:
        put_daemon(store, daemon("d-a"))
    other = open_another()

    def drain(rec: DaemonRecord | None) -> DaemonRecord:
        if rec is None:
            return daemon("d-a", draining=True)
        rec.draining = True
        return rec

    draining = threading.Thread(target=lambda: other.change_daemon("d-a", drain), daemon=True)

    def beat(rec: DaemonRecord | None) -> DaemonRecord:
        rec = rec or daemon("d-a")
        rec.last_heartbeat += 1
        if not draining.ident:
            draining.start()
            # (a store that holds others off until it writes keeps the drain waiting)
            draining.join(0.5)
        return rec

    # When the first change is written
    store.change_daemon("d-a", beat)
    draining.join(30)
    # Then the record has both: the drain is not written over, nor the change lost
    final = store.get_daemon("d-a")
    assert final is not None and final.draining is True
    assert final.last_heartbeat == 2.0


def test_insert_of_a_new_id_returns_none_and_keeps_every_field(store: Store) -> None:
    # Given a record with every optional field set
    rec = record(
        "full",
        state=State.RUNNING,
        priority=-2.5,
        timeout=30.0,
        retry=RetryPolicy(max=2, backoff=0.5, max_backoff=10.0),
        attempt=2,
        lease_token="tok",
        lease_expires_at=T0 + 60,
        worker="w1",
        started_at=T0 + 1,
        finished_at=T0 + 2,
        expires_at=T0 + 3,
        result=b"\x00\xffresult",
        error={"type": "ValueError", "message": "bad", "traceback": "", "pickled": b"\x80"},
    )
    # When it is inserted
    outcome = store.insert(rec)
    # Then it is new, and reads back equal field for field
    assert outcome is None
    assert store.get("full") == rec


def test_insert_of_an_existing_id_returns_the_existing_record_and_changes_nothing(
    store: Store,
) -> None:
    # Given a stored record
    original = record("dup", payload=b"first")
    insert_all(store, original)
    # When another record with the same id is inserted
    existing = store.insert(record("dup", payload=b"second", request_digest="other"))
    # Then the stored record is returned and kept
    assert existing == original
    assert store.get("dup") == original


def test_get_of_a_missing_id_is_none(store: Store) -> None:
    assert store.get("missing") is None


def test_get_many_returns_the_records_that_exist_and_leaves_out_missing_ones(
    store: Store,
) -> None:
    # Given two stored records
    insert_all(store, record("a"), record("b"))
    # When three ids (one missing, one repeated) are read
    got = store.get_many(["a", "missing", "b", "a"])
    # Then each existing record comes back once
    assert sorted(r.id for r in got) == ["a", "b"]


def test_get_many_reads_more_ids_than_one_chunk(store: Store) -> None:
    # Given 1,200 records (more than two 500-id chunks)
    ids = [f"inv-{i:04d}" for i in range(1200)]
    insert_all(store, *(record(i) for i in ids))
    # When all of them and some missing ones are asked for
    got = store.get_many([*ids, "missing-1", "missing-2"])
    # Then every existing record comes back exactly once
    assert sorted(r.id for r in got) == ids


def test_get_many_of_no_ids_is_empty(store: Store) -> None:
    assert store.get_many([]) == []


# =======================================================================================
# update_if: compare-and-set
# =======================================================================================


def test_a_lone_write_is_committed_by_itself_and_leaves_the_data_free_to_write(
    store: Store, open_another: Opener
) -> None:
    # Given a second handle onto the same data (another process)
    other = open_another()

    def by_the_other(write: Callable[[], object]) -> None:
        # (on a thread: a write left open on the first handle would hold this one)
        done = threading.Event()
        worker = threading.Thread(target=lambda: (write(), done.set()), daemon=True)
        worker.start()
        assert done.wait(timeout=10), "the other handle could not write"

    # When the first handle makes each kind of lone write: an insert, an insert of one,
    # a conditional update, a batch of one update
    store.insert(record("a"))
    store.insert_many([record("b")])
    store.update_if("a", {"state": State.PENDING}, {"state": State.RUNNING, "worker": "w1"})
    store.update_many_if([("b", {"state": State.PENDING}, {"worker": "w2"})])
    # Then the other handle reads each at once, and can write straight after
    a, b = store.get("a"), store.get("b")
    assert a is not None and a.worker == "w1"
    assert b is not None and b.worker == "w2"
    assert (other.get("a"), other.get("b")) == (a, b)
    by_the_other(lambda: other.insert(record("c")))
    by_the_other(lambda: other.update_if("a", {"worker": "w1"}, {"worker": "w3"}))
    assert store.get("c") is not None
    assert store.get("a") == replace(a, worker="w3")


def test_update_if_with_a_matching_expect_applies_and_returns_the_new_record(
    store: Store,
) -> None:
    # Given a pending record
    insert_all(store, record("a"))
    # When it is moved to running on the condition that it is still pending at attempt 0
    updated = store.update_if(
        "a",
        {"state": State.PENDING, "attempt": 0},
        {"state": State.RUNNING, "attempt": 1, "lease_token": "t1", "worker": "w"},
    )
    # Then the returned record carries the changes and keeps every other field
    expected = record("a", state=State.RUNNING, attempt=1, lease_token="t1", worker="w")
    assert updated == expected
    assert store.get("a") == expected


def test_update_if_with_a_mismatched_expect_returns_none_and_changes_nothing(
    store: Store,
) -> None:
    # Given a running record
    original = record("a", state=State.RUNNING, attempt=1, lease_token="t1")
    insert_all(store, original)
    # When an update expects another lease token
    updated = store.update_if(
        "a", {"state": State.RUNNING, "lease_token": "t0"}, {"state": State.SUCCEEDED}
    )
    # Then it is refused and the record is as it was
    assert updated is None
    assert store.get("a") == original


def test_update_if_of_a_missing_record_returns_none_and_creates_nothing(store: Store) -> None:
    assert store.update_if("ghost", {"state": State.PENDING}, {"attempt": 1}) is None
    assert store.get("ghost") is None


def test_update_if_expect_none_means_the_field_is_null(store: Store) -> None:
    # Given a record without a lease token and one with a token
    insert_all(store, record("free"), record("held", lease_token="t1"))
    # When each is updated on the condition that its token is null
    free = store.update_if("free", {"lease_token": None}, {"worker": "w"})
    held = store.update_if("held", {"lease_token": None}, {"worker": "w"})
    # Then only the record whose token is null changes
    assert free is not None and free.worker == "w"
    assert held is None
    assert store.get("held") == record("held", lease_token="t1")


def test_update_if_can_set_fields_back_to_null(store: Store) -> None:
    # Given a running record with a lease
    insert_all(store, record("a", state=State.RUNNING, lease_token="t", lease_expires_at=T0))
    # When its lease fields are cleared
    updated = store.update_if(
        "a",
        {"lease_token": "t"},
        {"state": State.PENDING, "lease_token": None, "lease_expires_at": None},
    )
    # Then they read back as None
    assert updated == record("a")
    assert store.get("a") == record("a")


def test_update_if_stores_structured_values(store: Store) -> None:
    # Given a running record
    insert_all(store, record("a", state=State.RUNNING, lease_token="t"))
    error = {"type": "KeyError", "message": "'k'", "traceback": "tb", "pickled": None}
    # When it fails with an error dict and gets a retry policy
    updated = store.update_if(
        "a",
        {"lease_token": "t"},
        {"state": State.FAILED, "error": error, "retry": RetryPolicy(max=1)},
    )
    # Then both round-trip
    assert updated is not None
    assert (updated.error, updated.retry) == (error, RetryPolicy(max=1))
    assert store.get("a") == updated


@pytest.mark.parametrize(
    ("expect", "changes"),
    [
        ({"no_such_field": 1}, {"attempt": 1}),
        ({"state": State.PENDING}, {"no_such_field": 1}),
    ],
    ids=["in-expect", "in-changes"],
)
def test_update_if_rejects_unknown_field_names(
    store: Store, expect: dict[str, Any], changes: dict[str, Any]
) -> None:
    # Given a record
    insert_all(store, record("a"))
    # When an update names a field no invocation has
    # Then it raises ValueError and the record is unchanged
    with pytest.raises(ValueError):
        store.update_if("a", expect, changes)
    assert store.get("a") == record("a")


def test_update_if_running_below_caps_running_invocations_of_the_records_queue(
    store: Store,
) -> None:
    # Given two running invocations in another queue and three pending in q
    insert_all(
        store,
        record("o1", "other", state=State.RUNNING),
        record("o2", "other", state=State.RUNNING),
        record("a"),
        record("b"),
        record("c"),
    )
    start = {"state": State.RUNNING}
    # When q's first is started with running_below=1: only q's running ones count
    first = store.update_if("a", {"state": State.PENDING}, start, running_below=1)
    # And a second is started with the same cap
    second = store.update_if("b", {"state": State.PENDING}, start, running_below=1)
    # Then the first is applied and the second refused while the cap is reached
    assert first is not None and first.state is State.RUNNING
    assert second is None
    assert store.get("b") == record("b")
    # And a higher cap lets the next one start
    assert store.update_if("b", {"state": State.PENDING}, start, running_below=2) is not None
    assert store.update_if("c", {"state": State.PENDING}, start, running_below=2) is None


def test_update_if_deadline_after_refuses_records_past_their_timeout(store: Store) -> None:
    # Given a running record with a 10 s timeout, started at T0, and one without timeout
    running = {"state": State.RUNNING, "started_at": T0}
    insert_all(store, record("t", timeout=10.0, **running), record("n", **running))
    done = {"state": State.SUCCEEDED}
    # When an answer arrives after the deadline, it is refused; before it, applied
    assert store.update_if("t", {"state": State.RUNNING}, done, deadline_after=T0 + 10) is None
    assert store.get("t").state is State.RUNNING  # type: ignore[union-attr]
    assert store.update_if("t", {"state": State.RUNNING}, done, deadline_after=T0 + 9.5)
    # And a record without a timeout has no deadline
    assert store.update_if("n", {"state": State.RUNNING}, done, deadline_after=T0 + 1e6)


def test_update_if_racing_on_one_handle_has_exactly_one_winner(store: Store) -> None:
    # Given a pending record and 16 threads that each try to take it
    insert_all(store, record("prize"))
    winners = _race_for(["prize"], [store] * 16)
    # Then exactly one took it, and the record holds that one's token
    assert len(winners) == 1
    assert [r.lease_token for r in store.get_many(["prize"])] == winners


def test_update_if_racing_from_two_handles_on_the_same_data_has_exactly_one_winner(
    store: Store, open_another: Opener
) -> None:
    # Given a pending record and a second handle onto the same data (another process)
    insert_all(store, record("prize"))
    other = open_another()
    # When 24 threads, split between the two handles, each try to take it
    winners = _race_for(["prize"], [store, other] * 12)
    # Then exactly one took it, and both handles see that one's token
    assert len(winners) == 1
    assert [r.lease_token for r in store.get_many(["prize"])] == winners
    assert [r.lease_token for r in other.get_many(["prize"])] == winners


def test_update_if_racing_over_many_records_gives_each_record_one_winner(
    store: Store, open_another: Opener
) -> None:
    # Given 20 pending records and a second handle onto the same data
    ids = [f"job-{i}" for i in range(20)]
    insert_all(store, *(record(i) for i in ids))
    other = open_another()
    # When 8 threads on two handles each try to take every record
    winners = _race_for(ids, [store, other] * 4)
    # Then every record was taken exactly once
    assert len(winners) == len(ids)
    assert sorted(str(r.lease_token) for r in store.get_many(ids)) == sorted(winners)


def _race_for(ids: list[str], handles: list[Store]) -> list[str]:
    """Threads (one per handle) each try to lease every id; return the winning tokens."""
    start = threading.Barrier(len(handles))

    def contender(n: int) -> list[str]:
        handle = handles[n]
        start.wait(timeout=30)
        won = []
        for inv_id in ids:
            token = f"t{n}-{inv_id}"
            updated = handle.update_if(
                inv_id,
                {"state": State.PENDING, "attempt": 0},
                {"state": State.RUNNING, "attempt": 1, "lease_token": token},
            )
            if updated is not None:
                assert updated.lease_token == token
                won.append(token)
        return won

    with ThreadPoolExecutor(max_workers=len(handles)) as pool:
        results = list(pool.map(contender, range(len(handles))))
    return [token for won in results for token in won]


# =======================================================================================
# insert_many and update_many_if: many records in one call, each on its own
# =======================================================================================


def full_record(inv_id: str) -> Invocation:
    """A record with every optional field set."""
    return record(
        inv_id,
        state=State.RUNNING,
        priority=-2.5,
        timeout=30.0,
        retry=RetryPolicy(max=2, backoff=0.5, max_backoff=10.0),
        attempt=2,
        lease_token="tok-" + inv_id,
        lease_expires_at=T0 + 60,
        worker="w1",
        started_at=T0 + 1,
        finished_at=T0 + 2,
        expires_at=T0 + 3,
        result=b"\x00\xffresult of " + inv_id.encode(),
        error={"type": "ValueError", "message": "bad", "traceback": "", "pickled": b"\x80"},
    )


def one_group(n: int) -> list[str]:
    """``n`` ids of one fresh group, as a client makes them for a batch of submits."""
    return group_ids(new_id(), n)


def test_insert_many_of_new_ids_returns_none_for_each_and_keeps_every_field(
    store: Store,
) -> None:
    # Given records of one group and plain ids, some with every optional field set
    grouped = one_group(5)
    recs = [full_record(grouped[0]), *(record(i) for i in grouped[1:])]
    recs += [full_record("plain-1"), record("plain-2")]
    # When they are inserted in one call
    answers = store.insert_many(recs)
    # Then each is new, and reads back equal field for field, one by one and together
    assert answers == [None] * len(recs)
    for rec in recs:
        assert store.get(rec.id) == rec
    got = store.get_many([rec.id for rec in recs])
    assert sorted(got, key=lambda r: r.id) == sorted(recs, key=lambda r: r.id)


def test_insert_many_of_existing_ids_returns_the_existing_records_and_changes_nothing(
    store: Store,
) -> None:
    # Given stored records, one grouped and one plain
    (grouped,) = one_group(1)
    originals = [full_record(grouped), record("plain", payload=b"first")]
    assert store.insert_many(originals) == [None, None]
    # When records with the same ids and other contents are inserted
    others = [record(grouped, payload=b"second"), record("plain", request_digest="other")]
    answers = store.insert_many(others)
    # Then the stored records are returned, and kept
    assert answers == originals
    assert [store.get(rec.id) for rec in originals] == originals


def test_insert_many_answers_a_mix_of_new_and_existing_ids_in_order(store: Store) -> None:
    # Given three ids of a group and one plain id stored
    ids = one_group(6)
    stored = [record(ids[0]), record(ids[2]), record(ids[5]), record("plain-old")]
    insert_all(store, *stored)
    # When the whole group and plain ids, old and new, are inserted in one call
    batch = [record(i, payload=b"new") for i in [*ids, "plain-old", "plain-new"]]
    answers = store.insert_many(batch)
    # Then each existing id answers its stored record, each new one None, in order
    by_id = {rec.id: rec for rec in stored}
    assert answers == [by_id.get(rec.id) for rec in batch]
    # And the new ones are stored as given while the old ones are kept
    for rec in batch:
        assert store.get(rec.id) == by_id.get(rec.id, rec)


def test_insert_many_of_one_id_twice_inserts_the_first_and_answers_it_to_the_second(
    store: Store,
) -> None:
    # Given one call holding two records with the same (grouped) id and another id
    (grouped,) = one_group(1)
    first, second = record(grouped, payload=b"first"), record(grouped, payload=b"second")
    # When it is inserted
    answers = store.insert_many([first, record("other"), second])
    # Then the first is inserted and the second answered with it, as two inserts would
    assert answers == [None, None, first]
    assert store.get(grouped) == first


def test_insert_many_of_nothing_is_empty(store: Store) -> None:
    assert store.insert_many([]) == []


def test_update_many_if_answers_each_update_in_order_and_applies_only_those_that_hold(
    store: Store,
) -> None:
    # Given pending and running records, grouped and plain
    ids = one_group(3)
    held = {"state": State.RUNNING, "lease_token": "t1"}
    originals = [record(ids[0]), record(ids[1]), record(ids[2], **held), record("plain", **held)]
    insert_all(store, *originals)
    done = {"state": State.SUCCEEDED, "result": b"r"}
    # When one call updates each, some expecting what holds and some not, and a missing id
    answers = store.update_many_if(
        [
            (ids[0], {"state": State.PENDING, "attempt": 0}, {"attempt": 1}),
            (ids[1], {"state": State.PENDING, "attempt": 1}, {"attempt": 2}),
            ("ghost", {"state": State.PENDING}, {"attempt": 1}),
            (ids[2], {"state": State.RUNNING, "lease_token": "t0"}, done),
            ("plain", held, done),
        ]
    )
    # Then the answers are the updated records where the expect held, None elsewhere
    applied = [record(ids[0], attempt=1), record("plain", **{**held, **done})]
    assert answers == [applied[0], None, None, None, applied[1]]
    # And only those records changed; nothing was created
    assert store.get(ids[0]) == applied[0]
    assert store.get("plain") == applied[1]
    assert [store.get(ids[1]), store.get(ids[2])] == originals[1:3]
    assert store.get("ghost") is None


def test_update_many_if_deadline_after_refuses_only_records_past_their_timeout(
    store: Store,
) -> None:
    # Given running records started at T0: two of a group with 10 s and 60 s timeouts,
    # and one without a timeout
    late, early = one_group(2)
    running = {"state": State.RUNNING, "started_at": T0}
    insert_all(
        store,
        record(late, timeout=10.0, **running),
        record(early, timeout=60.0, **running),
        record("untimed", **running),
    )
    done = {"state": State.SUCCEEDED}
    # When one call answers all three after the first's deadline
    answers = store.update_many_if(
        [(i, {"state": State.RUNNING}, done) for i in (late, early, "untimed")],
        deadline_after=T0 + 10,
    )
    # Then the timed-out one is refused and stays running, the others are applied
    assert [None if a is None else a.state for a in answers] == [
        None,
        State.SUCCEEDED,
        State.SUCCEEDED,
    ]
    assert store.get(late).state is State.RUNNING  # type: ignore[union-attr]


def test_update_many_if_running_below_caps_the_records_queue(store: Store) -> None:
    # Given four pending invocations of q (grouped), one started under a cap, and one
    # pending invocation of another queue
    ids = one_group(4)
    insert_all(store, *(record(i) for i in ids), record("o", "other"))
    start = {"state": State.RUNNING}
    assert store.update_if(ids[0], {"state": State.PENDING}, start, running_below=2)
    # When one call starts the three pending ones of q and the other queue's under a cap
    # of two running per queue
    answers = store.update_many_if(
        [(i, {"state": State.PENDING}, start) for i in [*ids[1:], "o"]], running_below=2
    )
    # Then q gets one more running, never more than the cap; the other queue's starts
    assert sum(a is not None for a in answers[:3]) == 1
    assert answers[3] is not None and answers[3].state is State.RUNNING
    assert store.running("q") == 2
    # And a single update under the full cap is refused
    refused = next(i for i, a in zip(ids[1:], answers, strict=False) if a is None)
    assert store.update_many_if([(refused, {"state": State.PENDING}, start)], running_below=2) == [
        None
    ]
    assert store.get(refused) == record(refused)


def test_update_many_if_of_nothing_is_empty(store: Store) -> None:
    assert store.update_many_if([]) == []


def test_update_many_if_updates_a_groups_ids_in_one_call_and_keeps_the_others(
    store: Store,
) -> None:
    # Given a stored group of eight
    ids = one_group(8)
    insert_all(store, *(record(i) for i in ids))
    # When one call leases every other id of it, and a second call the rest
    first = _lease_all(store, ids[0::2], "first")
    second = _lease_all(store, ids[1::2], "second")
    # Then every lease is applied, and the first call's survive the second's
    assert first == [f"first-{i}" for i in ids[0::2]]
    assert second == [f"second-{i}" for i in ids[1::2]]
    tokens = {r.id: r.lease_token for r in store.get_many(ids)}
    assert tokens == {i: f"{'first' if n % 2 == 0 else 'second'}-{i}" for n, i in enumerate(ids)}
    # And a call racing for ids already taken gets none of them
    assert _lease_all(store, ids, "late") == []


def test_update_many_if_racing_calls_on_one_group_each_lease_their_records(
    store: Store,
) -> None:
    # Given a stored group of sixteen
    ids = one_group(16)
    insert_all(store, *(record(i) for i in ids))
    # When four threads at once each lease their own quarter of it, and four more
    # each try to lease all of it
    quarters = [ids[n::4] for n in range(4)]
    wanted = [*quarters, *([ids] * 4)]
    won = _race_many(wanted, [store] * len(wanted))
    # Then every record is leased exactly once, and holds its winner's token
    tokens = sorted(token for tokens in won for token in tokens)
    assert sorted(str(r.lease_token) for r in store.get_many(ids)) == tokens
    assert len(tokens) == len(ids)


def test_update_many_if_racing_from_two_handles_on_one_group_keeps_every_lease(
    store: Store, open_another: Opener
) -> None:
    # Given a stored group of sixteen and a second handle onto the same data
    ids = one_group(16)
    insert_all(store, *(record(i) for i in ids))
    other = open_another()
    # When threads on the two handles lease the group's even and odd ids at once, and
    # others try to lease all of it
    wanted = [ids[0::2], ids[1::2], ids, ids]
    won = _race_many(wanted, [store, other, store, other])
    # Then every record is leased exactly once, and both handles see its winner's token
    tokens = sorted(token for tokens in won for token in tokens)
    assert len(tokens) == len(ids)
    assert sorted(str(r.lease_token) for r in store.get_many(ids)) == tokens
    assert sorted(str(r.lease_token) for r in other.get_many(ids)) == tokens


def _lease_all(store: Store, ids: list[str], who: str) -> list[str]:
    """Lease ``ids`` (pending at attempt 0) in one call; the tokens of those leased."""
    answers = store.update_many_if(
        [
            (
                i,
                {"state": State.PENDING, "attempt": 0},
                {"state": State.RUNNING, "attempt": 1, "lease_token": f"{who}-{i}"},
            )
            for i in ids
        ]
    )
    for inv_id, answer in zip(ids, answers, strict=True):
        assert answer is None or answer.lease_token == f"{who}-{inv_id}"
    return [str(answer.lease_token) for answer in answers if answer is not None]


def _race_many(wanted: list[list[str]], handles: list[Store]) -> list[list[str]]:
    """Threads (one per handle) each lease their ``wanted`` ids in one call at once;
    the tokens each won."""
    start = threading.Barrier(len(handles))

    def contender(n: int) -> list[str]:
        start.wait(timeout=30)
        return _lease_all(handles[n], wanted[n], f"t{n}")

    with ThreadPoolExecutor(max_workers=len(handles)) as pool:
        return list(pool.map(contender, range(len(handles))))


# =======================================================================================
# pending, next_available_at, expired_leases, counts
# =======================================================================================


def test_pending_returns_invocations_by_order_key(store: Store) -> None:
    # Given pending records inserted out of order
    insert_all(store, record("b"), record("c"), record("a"), record("d", order_key="0"))
    # When the pending ones are read
    got = store.pending("q", T0, 10)
    # Then they come in ascending order_key
    assert [r.id for r in got] == ["d", "a", "b", "c"]


def test_pending_returns_only_invocations_available_by_now(store: Store) -> None:
    # Given records available in the past, exactly now, and later
    insert_all(
        store,
        record("past", available_at=T0 - 1),
        record("now", available_at=T0),
        record("later", available_at=T0 + 0.5),
    )
    # When pending is read at T0
    got = store.pending("q", T0, 10)
    # Then the later one is left out
    assert sorted(r.id for r in got) == ["now", "past"]


def test_pending_returns_at_most_limit_from_the_head(store: Store) -> None:
    insert_all(store, *(record(f"k{i}") for i in range(5)))
    assert [r.id for r in store.pending("q", T0, 2)] == ["k0", "k1"]


def test_pending_returns_only_pending_invocations(store: Store) -> None:
    # Given one record in each state
    insert_all(store, *(record(s.value, state=s) for s in State if s is not State.SCHEDULED))
    # When pending is read
    got = store.pending("q", T0, 10)
    # Then only the pending one is there
    assert [r.id for r in got] == ["pending"]


def test_pending_returns_only_its_queue(store: Store) -> None:
    insert_all(store, record("mine", "q"), record("theirs", "other"))
    assert [r.id for r in store.pending("q", T0, 10)] == ["mine"]


def test_next_available_at_is_the_earliest_pending_available_time(store: Store) -> None:
    # Given pending records due later and a running one due earliest, plus another queue
    insert_all(
        store,
        record("soon", available_at=T0 + 5),
        record("later", available_at=T0 + 9),
        record("running", state=State.RUNNING, available_at=T0 + 1),
        record("theirs", "other", available_at=T0 + 2),
    )
    # Then the earliest among q's pending ones is answered
    assert store.next_available_at("q") == T0 + 5


def test_next_available_at_of_a_queue_without_pending_work_is_none(store: Store) -> None:
    insert_all(store, record("done", state=State.SUCCEEDED))
    assert store.next_available_at("q") is None
    assert store.next_available_at("empty") is None


def test_expired_leases_lists_running_invocations_whose_lease_has_passed(store: Store) -> None:
    # Given running records with leases in the past and in the future, in two queues,
    # and a finished record with a stale lease time
    insert_all(
        store,
        record("lapsed", state=State.RUNNING, lease_expires_at=T0 - 10),
        record("lapsed-other", "other", state=State.RUNNING, lease_expires_at=T0 - 1),
        record("held", state=State.RUNNING, lease_expires_at=T0 + 10),
        record("done", state=State.SUCCEEDED, lease_expires_at=T0 - 10),
    )
    # When expired leases are read at T0
    got = store.expired_leases(T0, 10)
    # Then only the lapsed running ones are listed, from every queue
    assert sorted(r.id for r in got) == ["lapsed", "lapsed-other"]


def test_expired_leases_returns_at_most_limit(store: Store) -> None:
    insert_all(
        store,
        *(record(f"r{i}", state=State.RUNNING, lease_expires_at=T0 - 1 - i) for i in range(5)),
    )
    assert len(store.expired_leases(T0, 3)) == 3


def test_counts_counts_a_queues_invocations_by_state_with_scheduled_split_out(
    store: Store,
) -> None:
    # Given two due pending, one not-yet-due pending, running, finished, and another queue
    insert_all(
        store,
        record("p1"),
        record("p2", available_at=T0 - 3),
        record("s1", available_at=T0 + 3),
        record("r1", state=State.RUNNING),
        record("ok", state=State.SUCCEEDED),
        record("bad", state=State.FAILED),
        record("x", state=State.CANCELLED),
        record("lost", state=State.DEAD),
        record("theirs", "other"),
    )
    # When q is counted at T0
    counts = store.counts("q", T0)
    # Then each state is counted (states with no invocations may be absent)
    assert {k: v for k, v in counts.items() if v} == {
        "pending": 2,
        "scheduled": 1,
        "running": 1,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
        "dead": 1,
    }


def test_counts_of_an_empty_queue_has_no_invocations(store: Store) -> None:
    assert not any(store.counts("empty", T0).values())


# =======================================================================================
# purge
# =======================================================================================


def test_purge_keeps_the_data_of_records_not_yet_expired(store: Store) -> None:
    # Given finished records past expiry and past the tombstone, one not yet expired,
    # and a pending record that never expires
    tombstone_until = T0 - 100
    insert_all(
        store,
        record("expired", state=State.SUCCEEDED, expires_at=T0 - 1, result=b"r"),
        record("buried", state=State.FAILED, expires_at=tombstone_until - 1, result=b"r"),
        record("fresh", state=State.SUCCEEDED, expires_at=T0 + 1, result=b"r"),
        record("waiting"),
    )
    # When the store is purged (what it reclaims of the expired ones is its own affair:
    # the plane hides them, see "Expiry through the plane" below)
    store.purge(T0, tombstone_until)
    # Then the others keep every field
    assert store.get("fresh") == record(
        "fresh", state=State.SUCCEEDED, expires_at=T0 + 1, result=b"r"
    )
    assert store.get("waiting") == record("waiting")


def test_purge_twice_touches_nothing_the_second_time(store: Store) -> None:
    insert_all(store, record("expired", state=State.SUCCEEDED, expires_at=T0 - 1))
    store.purge(T0, T0 - 100)
    assert store.purge(T0, T0 - 100) == 0


def test_running_counts_what_running_below_counts(store: Store) -> None:
    # Given three pending invocations in q and one in another queue
    insert_all(store, record("a"), record("b"), record("c"), record("o", "other"))
    start = {"state": State.RUNNING}
    # When two of q's and the other queue's are started under a cap
    for inv_id in ("a", "b", "o"):
        assert store.update_if(inv_id, {"state": State.PENDING}, start, running_below=5)
    # Then q has two running, and the cap sees the same number
    assert store.running("q") == 2
    assert store.update_if("c", {"state": State.PENDING}, start, running_below=2) is None
    # And once one finishes, one fewer
    assert store.update_if("a", {"state": State.RUNNING}, {"state": State.SUCCEEDED})
    assert store.running("q") == 1
    assert store.running("other") == 1
    assert store.running("empty") == 0


# =======================================================================================
# Blobs
# =======================================================================================


def test_put_blob_then_get_blob_returns_the_bytes(store: Store) -> None:
    store.put_blob("d1", b"\x00body\xff", T0)
    assert store.get_blob("d1") == b"\x00body\xff"


def test_get_blob_of_a_missing_digest_is_none(store: Store) -> None:
    assert store.get_blob("missing") is None


def test_put_blob_twice_is_a_no_op(store: Store) -> None:
    # Given a stored blob
    store.put_blob("d1", b"first", T0)
    # When the same digest is put again
    store.put_blob("d1", b"first", T0 + 1)
    store.put_blob("d1", b"other bytes", T0 + 2)
    # Then the first bytes stay
    assert store.get_blob("d1") == b"first"


def test_has_blobs_answers_which_digests_are_stored(store: Store) -> None:
    # Given 700 stored blobs (more than one 500-digest chunk)
    stored = {f"d{i:03d}" for i in range(700)}
    for digest in stored:
        store.put_blob(digest, digest.encode(), T0)
    # When they and some missing digests are asked about
    found = store.has_blobs([*stored, "missing-1", "missing-2"])
    # Then exactly the stored ones are found
    assert found == stored
    assert store.has_blobs([]) == set()


# =======================================================================================
# Change detection and shared data
# =======================================================================================


def test_another_handle_on_a_shared_store_sees_committed_writes(
    store: Store, open_another: Opener
) -> None:
    # Given a second handle onto the same data
    other = open_another()
    # When one handle writes
    store.put_queue(QueueSpec("jobs"), T0)
    insert_all(store, record("a", "jobs"))
    # Then the other reads it
    assert other.get_queue("jobs") == QueueSpec("jobs")
    assert other.get("a") == record("a", "jobs")


def test_change_marker_changes_when_another_handle_commits(
    store: Store, open_another: Opener
) -> None:
    # Given a second handle onto the same data, and this handle's marker
    other = open_another()
    before = store.change_marker()
    # When the other handle commits a write
    insert_all(other, record("a"))
    # Then this handle's marker has changed
    after = store.change_marker()
    assert after != before
    # And changes again on the next commit
    assert other.update_if("a", {"state": State.PENDING}, {"attempt": 1}) is not None
    assert store.change_marker() != after


# =======================================================================================
# Queue kinds, ordered through the plane core over each store
# =======================================================================================


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def plane(store: Store, clock: FakeClock) -> Plane:
    """The plane core over ``store`` (the store fixture closes the store)."""
    return Plane(store, clock=clock)


def queue(plane: Plane, kind: str) -> str:
    return plane.ensure_queue(QueueSpec(f"{kind}-q", kind=kind)).name


def submit(
    plane: Plane, name: str, inv_id: str, *, priority: float = 0.0, delay: float = 0.0
) -> list[str]:
    return plane.submit([Submission(inv_id, name, b"x", priority=priority, delay=delay)])


def drain(plane: Plane, name: str) -> list[str]:
    """Claim one at a time until nothing is claimable; the ids in claim order."""
    order = []
    while claims := plane.claim([name], "w"):
        order.extend(c.id for c in claims)
    return order


def test_fifo_hands_out_the_oldest_first(plane: Plane, clock: FakeClock) -> None:
    # Given a fifo queue with submissions at successive times
    q = queue(plane, "fifo")
    for inv_id in ["first", "second", "third"]:
        submit(plane, q, inv_id)
        clock.advance(1)
    # When it is drained
    # Then the oldest comes first
    assert drain(plane, q) == ["first", "second", "third"]


def test_fifo_hands_out_same_time_submissions_in_submission_order(plane: Plane) -> None:
    q = queue(plane, "fifo")
    for inv_id in ["a", "b", "c", "d"]:
        submit(plane, q, inv_id)
    assert drain(plane, q) == ["a", "b", "c", "d"]


def test_filo_hands_out_the_newest_first(plane: Plane, clock: FakeClock) -> None:
    # Given a filo queue with submissions at successive times
    q = queue(plane, "filo")
    for inv_id in ["first", "second", "third"]:
        submit(plane, q, inv_id)
        clock.advance(1)
    # When it is drained
    # Then the newest comes first
    assert drain(plane, q) == ["third", "second", "first"]


def test_filo_hands_out_same_time_submissions_newest_first(plane: Plane) -> None:
    q = queue(plane, "filo")
    for inv_id in ["a", "b", "c", "d"]:
        submit(plane, q, inv_id)
    assert drain(plane, q) == ["d", "c", "b", "a"]


def test_priority_hands_out_the_highest_priority_first(plane: Plane, clock: FakeClock) -> None:
    # Given a priority queue with mixed priorities, negative and fractional ones included
    q = queue(plane, "priority")
    for inv_id, priority in [("low", -3), ("mid", 0.5), ("top", 100), ("zero", 0), ("neg", -0.5)]:
        submit(plane, q, inv_id, priority=priority)
        clock.advance(1)
    # When it is drained
    # Then the highest priority comes first
    assert drain(plane, q) == ["top", "mid", "zero", "neg", "low"]


def test_priority_hands_out_equal_priorities_oldest_first(plane: Plane, clock: FakeClock) -> None:
    # Given a priority queue with two priorities, submitted interleaved at the same and
    # successive times
    q = queue(plane, "priority")
    submit(plane, q, "lo-1", priority=1)
    submit(plane, q, "hi-1", priority=5)
    submit(plane, q, "lo-2", priority=1)
    clock.advance(1)
    submit(plane, q, "hi-2", priority=5)
    submit(plane, q, "lo-3", priority=1)
    submit(plane, q, "hi-3", priority=5)
    # When it is drained
    # Then each priority comes out in submission order
    assert drain(plane, q) == ["hi-1", "hi-2", "hi-3", "lo-1", "lo-2", "lo-3"]


def test_priority_treats_zero_and_negative_zero_as_one_priority(plane: Plane) -> None:
    # Given a priority queue where 0.0 and -0.0 (equal numbers) are submitted alternately
    q = queue(plane, "priority")
    submit(plane, q, "a", priority=-0.0)
    submit(plane, q, "b", priority=0.0)
    submit(plane, q, "c", priority=-0.0)
    # When it is drained
    # Then equal priorities stay in submission order
    assert drain(plane, q) == ["a", "b", "c"]


@pytest.mark.parametrize("kind", ["fifo", "filo", "priority"])
def test_a_delayed_submission_is_not_claimable_before_its_time(
    plane: Plane, clock: FakeClock, kind: str
) -> None:
    # Given a submission delayed by 10 s
    q = queue(plane, kind)
    submitted_at = clock.now()
    submit(plane, q, "later", delay=10)
    # When a worker claims just before it is due
    clock.set(submitted_at + 9.999)
    # Then there is nothing to claim
    assert plane.claim([q], "w") == []
    # And once it is due, it is claimed
    clock.set(submitted_at + 10)
    assert [c.id for c in plane.claim([q], "w")] == ["later"]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("fifo", ["due-at-5", "due-at-10", "due-at-15"]),
        ("filo", ["due-at-15", "due-at-10", "due-at-5"]),
        ("priority", ["due-at-5", "due-at-10", "due-at-15"]),
    ],
)
def test_a_delayed_submission_takes_its_place_by_its_available_time(
    plane: Plane, clock: FakeClock, kind: str, expected: list[str]
) -> None:
    # Given one submission at 0 delayed to 10, one at 5, and one at 15 (equal priorities)
    q = queue(plane, kind)
    submit(plane, q, "due-at-10", delay=10)
    clock.advance(5)
    submit(plane, q, "due-at-5")
    clock.advance(10)
    submit(plane, q, "due-at-15")
    # When the queue is drained once all are due
    # Then they come in the kind's order of their available times
    assert drain(plane, q) == expected


def test_a_delayed_high_priority_submission_goes_first_once_due(
    plane: Plane, clock: FakeClock
) -> None:
    # Given a priority queue with a delayed high-priority submission and a due low one
    q = queue(plane, "priority")
    submit(plane, q, "urgent-later", priority=10, delay=5)
    submit(plane, q, "routine", priority=1)
    submit(plane, q, "routine-2", priority=1)
    # When a worker claims before the delay passes, it gets the due one
    assert [c.id for c in plane.claim([q], "w")] == ["routine"]
    # When the delay has passed
    clock.advance(5)
    # Then the high priority one goes ahead of the remaining low one
    assert drain(plane, q) == ["urgent-later", "routine-2"]


# =======================================================================================
# Batches through the plane: a claim, completions and failures of many grouped records
# =======================================================================================


#: the writes of records a plane asks of its store
WRITES = ("insert", "insert_many", "update_if", "update_many_if")


@contextmanager
def store_writes(store: Store) -> Iterator[list[str]]:
    """The names of the record writes the plane asks of ``store`` in the block, in order
    (what a store method calls of its own within one call is not counted)."""
    calls: list[str] = []
    depth = 0

    def spy(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal depth
            if not depth:
                calls.append(name)
            depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                depth -= 1

        return call

    for name in WRITES:
        setattr(store, name, spy(name, getattr(store, name)))
    try:
        yield calls
    finally:
        for name in WRITES:
            delattr(store, name)


def grouped_submissions(plane: Plane, name: str, n: int, **options: Any) -> list[str]:
    """Submit ``n`` invocations in one call, with ids of groups of 16 as a client makes
    them; their ids in submission order."""
    ids = [i for start in range(0, n, 16) for i in group_ids(new_id(), min(16, n - start))]
    subs = [Submission(i, name, b"args of " + i.encode(), **options) for i in ids]
    with store_writes(plane.store) as writes:
        assert plane.submit(subs) == ids
    assert writes == ["insert_many"]
    return ids


def test_a_claim_of_many_completes_in_one_batch_refusing_only_a_stale_lease(
    plane: Plane,
) -> None:
    # Given a queue holding 25 grouped submissions
    q = queue(plane, "fifo")
    ids = grouped_submissions(plane, q, 25)
    # When a worker claims ten
    with store_writes(plane.store) as writes:
        claims = plane.claim([q], "w", limit=10)
    # Then it gets the first ten in one write, each leased to it with its own token and
    # payload
    assert writes == ["update_many_if"]
    assert [c.id for c in claims] == ids[:10]
    assert len({c.lease_token for c in claims}) == 10
    assert all(c.payload == b"args of " + c.id.encode() for c in claims)
    # When it completes them in one batch, one with a stale token
    items = [(c.id, "stale" if n == 3 else c.lease_token, b"ok") for n, c in enumerate(claims)]
    with store_writes(plane.store) as writes:
        answers = plane.complete_many(items)
    # Then they are written in one call; exactly that one is refused with LeaseLost, and
    # the others succeed
    assert writes == ["update_many_if"]
    assert [type(a) for a in answers] == [type(None)] * 3 + [LeaseLost] + [type(None)] * 6
    states = {r.id: (r.state, r.result) for r in plane.get_many(ids[:10])}
    assert states == {
        c.id: (State.RUNNING, None) if n == 3 else (State.SUCCEEDED, b"ok")
        for n, c in enumerate(claims)
    }
    # And the rest of the queue is still there to claim
    assert [c.id for c in plane.claim([q], "w", limit=20)] == ids[10:]


def test_fail_many_reschedules_what_the_retry_policy_allows(plane: Plane, clock: FakeClock) -> None:
    # Given six grouped submissions with one retry after 10 s, all claimed
    q = queue(plane, "fifo")
    ids = grouped_submissions(plane, q, 6, retry=RetryPolicy(max=1, backoff=10.0))
    claims = plane.claim([q], "w", limit=6)
    assert [c.id for c in claims] == ids
    error = {"type": "builtins.ValueError", "message": "boom", "traceback": "", "pickled": None}
    # When a batch fails them, one with a stale token and one as not retryable
    items = [
        (c.id, "stale" if n == 1 else c.lease_token, error, n != 4) for n, c in enumerate(claims)
    ]
    with store_writes(plane.store) as writes:
        answers = plane.fail_many(items)
    # Then they are written in one call; only the stale one is refused, the retryable
    # ones are scheduled again, and the other has failed
    assert writes == ["update_many_if"]
    assert [type(a) for a in answers] == [type(None), LeaseLost] + [type(None)] * 4
    assert [plane.state(i) for i in ids] == [
        State.SCHEDULED,
        State.RUNNING,
        State.SCHEDULED,
        State.SCHEDULED,
        State.FAILED,
        State.SCHEDULED,
    ]
    # And once the backoff has passed, the rescheduled ones are claimed at attempt 2
    clock.advance(10)
    again = plane.claim([q], "w", limit=10)
    assert [(c.id, c.attempt) for c in again] == [(ids[n], 2) for n in (0, 2, 3, 5)]
    # And their retry used, a second failure fails them
    retried = [(c.id, c.lease_token, error, True) for c in again]
    assert plane.fail_many(retried) == [None] * 4
    assert {plane.state(c.id) for c in again} == {State.FAILED}


# =======================================================================================
# Expiry through the plane: the core hides what has expired, whatever the store still
# holds (a store may leave purging to its own expiry, as DynamoDB's TTL does)
# =======================================================================================

RETENTION = 100.0
TOMBSTONE = 1000.0


@pytest.fixture
def expiring(store: Store, clock: FakeClock) -> Plane:
    """The plane core over ``store`` with a short retention and tombstone."""
    return Plane(store, clock=clock, retention=RETENTION, tombstone=TOMBSTONE)


def finish(plane: Plane, inv_id: str, queue: str = "exp") -> None:
    """Submit, claim (writing some output) and complete one invocation."""
    plane.ensure_queue(QueueSpec(queue))
    plane.submit([Submission(inv_id, queue, b"args")])
    (claim,) = plane.claim([queue], "w")
    plane.append_logs(claim.id, claim.lease_token, [(1, "stdout", "hello")])
    plane.complete(claim.id, claim.lease_token, b"result")


@pytest.mark.parametrize("swept", [False, True], ids=["unswept", "swept"])
def test_an_expired_invocation_keeps_its_state_but_not_its_data(
    expiring: Plane, clock: FakeClock, swept: bool
) -> None:
    # Given a finished invocation with output, just before it expires
    finish(expiring, "job")
    clock.advance(RETENTION - 1)
    if swept:
        expiring.sweep()
    # Then everything is there
    rec = expiring.get("job")
    assert (rec.payload, rec.result) == (b"args", b"result")
    assert [e.text for e in expiring.read_logs("job")] == ["hello"]
    # When it expires (whether or not the plane has swept since)
    clock.advance(1)
    if swept:
        expiring.sweep()
    # Then every read shows it known, finished and without payload, result or output
    rec = expiring.get("job")
    assert (rec.payload, rec.result, rec.state) == (None, None, State.SUCCEEDED)
    assert rec.is_expired(clock.now())
    assert expiring.read_logs("job") == []
    assert [(r.id, r.payload, r.result) for r in expiring.get_many(["job"])] == [
        ("job", None, None)
    ]
    assert [(r.id, r.result) for r in expiring.list_invocations("exp")] == [("job", None)]
    seen: list[Invocation] = []
    expiring.watch(["job"], seen.append)()
    assert [(r.id, r.result) for r in seen] == [("job", None)]
    # And it cannot be run again (it succeeded: out of order)
    with pytest.raises(Conflict):
        expiring.retry("job")


@pytest.mark.parametrize("swept", [False, True], ids=["unswept", "swept"])
def test_an_invocation_is_unknown_once_its_tombstone_has_passed(
    expiring: Plane, clock: FakeClock, swept: bool
) -> None:
    # Given five invocations finished at one time and two finished later
    for n in range(5):
        finish(expiring, f"a-old-{n}")
    old_expiry = clock.now() + RETENTION
    clock.advance(50)
    finish(expiring, "b-new-0")
    finish(expiring, "b-new-1")
    # When the old ones' tombstone ends (whether or not the plane has swept)
    clock.set(old_expiry + TOMBSTONE)
    if swept:
        expiring.sweep()
    assert expiring.state("a-old-0") is State.SUCCEEDED  # the last moment it is known
    clock.advance(1)
    if swept:
        expiring.sweep()
    # Then the old ones are unknown to every read, and the later ones are not
    with pytest.raises(UnknownInvocation):
        expiring.get("a-old-0")
    with pytest.raises(UnknownInvocation):
        expiring.cancel("a-old-0")
    with pytest.raises(UnknownInvocation):
        expiring.read_logs("a-old-0")
    with pytest.raises(UnknownInvocation):
        expiring.watch(["a-old-1", "b-new-0"], lambda rec: None)
    with pytest.raises(UnknownInvocation):
        expiring.wait(["a-old-2"], 0.0)
    assert sorted(r.id for r in expiring.get_many(["a-old-0", "b-new-0", "b-new-1"])) == [
        "b-new-0",
        "b-new-1",
    ]
    # And a page of the listing is filled from past the hidden ones
    assert [r.id for r in expiring.list_invocations("exp", limit=2)] == ["b-new-0", "b-new-1"]
    assert [r.id for r in expiring.list_invocations("exp", state="succeeded")] == [
        "b-new-0",
        "b-new-1",
    ]


# --- the finish sequence (stores that offer finished_since) ----------------------------


def _finish(store: Store, inv_id: str) -> None:
    done = {"state": State.SUCCEEDED, "finished_at": T0, "expires_at": T0 + 100}
    assert store.update_if(inv_id, {"state": State.RUNNING}, done) is not None


@pytest.mark.parametrize("extra", [0, 20], ids=["a few ids", "many ids"])
def test_finished_among_answers_alike_for_a_few_ids_and_for_many(
    tmp_path: Path, extra: int
) -> None:
    # (SQLite reads a few ids' records whole, in one statement; many, the finished first)
    s = SqliteStore(tmp_path / "plane.db")
    running = [f"r{n}" for n in range(extra)]
    s.insert_many([record(i, state=State.RUNNING) for i in ["a", "b", *running]])
    s.insert(record("p"))
    _finish(s, "a")
    known, done = s.finished_among(["a", "b", "p", "missing", *running])
    assert known == {"a": T0 + 100, "b": None, "p": None, **dict.fromkeys(running)}
    assert [(r.id, r.state) for r in done] == [("a", State.SUCCEEDED)]
    s.close()


def test_finished_since_a_cursor_is_exactly_what_finished_after_it(tmp_path: Path) -> None:
    # (SQLite's finish sequence; the DynamoDB store has none: its waits read their ids)
    s, other = SqliteStore(tmp_path / "plane.db"), SqliteStore(tmp_path / "plane.db")
    ids = ["a", "b", "c"]
    s.insert_many([record(i, state=State.RUNNING) for i in ids])
    # Given a cursor taken before anything finished, and one after a finished
    before = s.finish_cursor()
    _finish(s, "a")
    after_a = s.finish_cursor()
    # When another handle (another process) finishes b, and c is still running
    _finish(other, "b")
    # Then each cursor answers exactly what finished after it, whatever the times say
    assert sorted(r.id for r in s.finished_since(ids, before)) == ["a", "b"]
    assert [r.id for r in s.finished_since(ids, after_a)] == ["b"]
    assert s.finished_since(ids, other.finish_cursor()) == []
    # and a record finished, retried and finished again is found after its new finish
    cursor = s.finish_cursor()
    assert s.update_if("a", {"state": State.SUCCEEDED}, {"state": State.RUNNING})
    assert s.finished_since(ids, cursor) == []
    _finish(s, "a")
    assert [r.id for r in s.finished_since(ids, cursor)] == ["a"]
    s.close()
    other.close()


def test_a_batch_of_finishes_takes_a_number_each_after_every_earlier_one(
    tmp_path: Path,
) -> None:
    # (SQLite: a batch of updates of one shape is one statement; its finishes still take
    # distinct numbers of the finish sequence, each above every number taken before)
    s = SqliteStore(tmp_path / "plane.db")
    ids = [f"r{n}" for n in range(6)]
    s.insert_many([record(i, state=State.RUNNING, lease_token=f"t-{i}") for i in ids])
    _finish(s, "r0")
    cursor = s.finish_cursor()
    done = {"state": State.SUCCEEDED, "finished_at": T0, "expires_at": T0 + 100}
    # When one call finishes four of them, one with a lease that no longer holds
    answers = s.update_many_if(
        [(i, {"state": State.RUNNING, "lease_token": f"t-{i}"}, done) for i in ids[1:4]]
        + [("r4", {"state": State.RUNNING, "lease_token": "stale"}, done)]
    )
    # Then the three that held finished, each with its own number above the cursor's
    assert [a is not None for a in answers] == [True, True, True, False]
    numbers = [
        n
        for (n,) in s._db.execute(
            "SELECT finish_seq FROM invocations WHERE id IN ('r1', 'r2', 'r3')"
        ).fetchall()
    ]
    assert len(set(numbers)) == 3 and min(numbers) > cursor
    assert sorted(r.id for r in s.finished_since(ids, cursor)) == ["r1", "r2", "r3"]
    # And a finish after the batch is found from a cursor taken after it, alone
    after = s.finish_cursor()
    _finish(s, "r5")
    assert [r.id for r in s.finished_since(ids, after)] == ["r5"]
    s.close()


def test_a_batch_larger_than_one_statement_carries_applies_every_update(
    tmp_path: Path,
) -> None:
    # (SQLite: a batch is cut into statements of at most 500 records, in one transaction)
    s = SqliteStore(tmp_path / "plane.db")
    ids = [f"r{n:04}" for n in range(1_201)]
    s.insert_many([record(i) for i in ids])
    # When one call leases all of them but one whose expected attempt is wrong
    answers = s.update_many_if(
        [
            (
                i,
                {"state": State.PENDING, "attempt": 1 if i == "r0700" else 0},
                {
                    "state": State.RUNNING,
                    "lease_token": f"t-{i}",
                },
            )
            for i in ids
        ]
    )
    # Then each answer is its own record, and every other one is leased
    assert [a.id if a is not None else None for a in answers] == [
        None if i == "r0700" else i for i in ids
    ]
    assert {r.id: r.lease_token for r in s.get_many(ids) if r.lease_token} == {
        i: f"t-{i}" for i in ids if i != "r0700"
    }
    s.close()


def test_an_insert_of_more_than_one_statement_carries_answers_each_record(
    tmp_path: Path,
) -> None:
    # (SQLite: new records go in statements of at most 500, in one transaction)
    s = SqliteStore(tmp_path / "plane.db")
    ids = [f"r{n:04}" for n in range(1_201)]
    kept = [record("r0003", payload=b"first"), record("r0900", payload=b"first")]
    s.insert_many(kept)
    # When one call inserts all of them, two of which are stored already
    answers = s.insert_many([record(i, payload=b"second") for i in ids])
    # Then those two answer their stored records, unchanged, and every other one is new
    assert [a for a in answers if a is not None] == kept
    assert [n for n, a in enumerate(answers) if a is not None] == [3, 900]
    assert {r.id: r.payload for r in s.get_many(ids)} == {
        i: b"first" if i in ("r0003", "r0900") else b"second" for i in ids
    }
    s.close()


def test_a_record_missing_a_required_field_is_refused_not_retried(tmp_path: Path) -> None:
    # (SQLite: INSERT OR IGNORE passes over a row that breaks NOT NULL as over a
    # conflict; neither insert may take that for a record that vanished and loop)
    s = SqliteStore(tmp_path / "plane.db")
    broken = replace(record("x1"), order_key=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="neither inserted nor found"):
        s.insert(broken)
    with pytest.raises(ValueError, match="neither inserted nor found"):
        s.insert_many([record("x2"), broken])
    assert s.get("x1") is None
    s.close()


def test_an_sqlite_too_old_for_the_stores_statements_is_refused_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sqlite3

    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    with pytest.raises(RuntimeError, match=r"needs SQLite 3\.35\.0 or newer .* has 3\.31\.1"):
        SqliteStore(":memory:")


def test_a_group_takes_the_write_lock_at_its_first_write_not_before(tmp_path: Path) -> None:
    # (SQLite: a claim of many that finds nothing must not hold other processes' writes)
    import sqlite3

    s = SqliteStore(tmp_path / "plane.db")
    s.insert(record("a"))
    other = sqlite3.connect(tmp_path / "plane.db", timeout=0, isolation_level=None)
    with s.transaction():
        # Given a group that has only read so far
        assert [r.id for r in s.pending("q", T0 + 1, 5)] == ["a"]
        # Then another process may write meanwhile
        other.execute("BEGIN IMMEDIATE")
        other.execute("COMMIT")
        # and once the group writes, it holds the lock until it ends
        assert s.update_if("a", {"state": State.PENDING}, {"state": State.RUNNING})
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    other.execute("BEGIN IMMEDIATE")  # the group's end committed it
    other.execute("COMMIT")
    assert s.get("a").state is State.RUNNING
    other.close()
    s.close()


def test_a_plane_file_from_before_the_finish_sequence_gains_it(tmp_path: Path) -> None:
    # Given a plane file as an older version left it (no finish_seq column)
    old = SqliteStore(tmp_path / "plane.db")
    old.insert(record("a", state=State.RUNNING))
    old._db.execute("DROP INDEX inv_finish_seq")
    old._db.execute("ALTER TABLE invocations DROP COLUMN finish_seq")
    old.close()
    # When it is opened again, its records are there and finishes are numbered
    s = SqliteStore(tmp_path / "plane.db")
    cursor = s.finish_cursor()
    _finish(s, "a")
    assert [r.id for r in s.finished_since(["a"], cursor)] == ["a"]
    s.close()


def test_a_queues_running_records_are_counted_by_an_index_every_write_keeps_anyway(
    tmp_path: Path,
) -> None:
    # Given a plane file as an older version left it, with an index of running records
    old = SqliteStore(tmp_path / "plane.db")
    old.insert(record("a", state=State.RUNNING))
    old._db.execute("CREATE INDEX inv_running ON invocations (queue) WHERE state = 'running'")
    old.close()
    # When it is opened again, that index is gone (each claim and finish wrote it)
    s = SqliteStore(tmp_path / "plane.db")
    names = {n for (n,) in s._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "inv_running" not in names and "inv_queue_state" in names
    # and counting a queue's running records, alone or under a cap, reads an index
    count = "SELECT count(*) FROM invocations WHERE queue = ? AND state = 'running'"
    for sql in (count, sql_of_a_capped_update()):
        plan = " ".join(
            r[-1] for r in s._db.execute(f"EXPLAIN QUERY PLAN {sql}", ["q"] * sql.count("?"))
        )
        assert "inv_queue_state" in plan and "SCAN" not in plan, plan
    assert s.running(record("a").queue) == 1
    s.close()


def sql_of_a_capped_update() -> str:
    from dreamlake.lakeshore.stores.sqlite import _update_sql

    return _update_sql(("state",), False, (("state", False),), True, False)


# --- blobs of a plane file live beside it ------------------------------------------------


def test_a_plane_files_blobs_are_files_beside_it_and_older_ones_still_read(
    tmp_path: Path,
) -> None:
    import hashlib

    data = b"\x00blob\xff" * 1000
    digest = hashlib.sha256(data).hexdigest()
    s, other = SqliteStore(tmp_path / "plane.db"), SqliteStore(tmp_path / "plane.db")
    # A blob put through one handle is a file beside the plane (not in its database)
    s.put_blob(digest, data, T0)
    assert (tmp_path / "plane.db.blobs" / digest).read_bytes() == data
    assert s._db.execute("SELECT count(*) FROM blobs").fetchone()[0] == 0
    # and another handle (another process) reads it; a second put changes nothing
    assert other.get_blob(digest) == data and other.has_blobs([digest, "0" * 64]) == {digest}
    other.put_blob(digest, data, T0)
    assert sorted(p.name for p in (tmp_path / "plane.db.blobs").iterdir()) == [digest]
    # A blob an older version kept in the database is still found
    old = hashlib.sha256(b"old").hexdigest()
    s._db.execute("INSERT INTO blobs VALUES (?, ?, ?)", (old, b"old", T0))
    assert other.get_blob(old) == b"old" and other.has_blobs([old]) == {old}
    # A digest that is not a sha256 never names a file
    assert s.get_blob("../plane.db") is None and s.has_blobs(["../plane.db"]) == set()
    s.close()
    other.close()


def test_a_plane_files_blob_directory_has_one_id(tmp_path: Path) -> None:
    from dreamlake.lakeshore.plane.store import blob_home

    s, other = SqliteStore(tmp_path / "plane.db"), SqliteStore(tmp_path / "plane.db")
    # Two handles (two processes) ask for the directory: one id, written once
    home = blob_home(s)
    assert home is not None and home == blob_home(other)
    where, ident = home
    assert where == str((tmp_path / "plane.db.blobs").resolve()) and len(ident) == 32
    assert (Path(where) / ".id").read_text() == ident
    assert sorted(p.name for p in Path(where).iterdir()) == [".id"]
    s.close()
    other.close()
    # A plane in memory keeps no blob files
    assert blob_home(SqliteStore(":memory:")) is None


# --- a plane file's WAL is copied into the file by a thread of its own ---------------------


def test_a_plane_files_wal_is_checkpointed_in_the_background_not_by_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dreamlake.lakeshore.stores import sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "_CHECKPOINT_EVERY", 0.05)
    s = SqliteStore(tmp_path / "plane.db")
    db_file = tmp_path / "plane.db"
    # writers leave the copying to the thread (past a high mark only would they do it)
    assert s._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] >= 10_000
    before = db_file.stat().st_size
    # When about 2 MB of records are written (well under the writers' own mark)
    s.insert_many([record(f"r{i}", payload=bytes(2000)) for i in range(1000)])
    # Then the thread copies them into the file (it grows), and every record reads back
    grown = before + 1_000_000
    wait_for(lambda: db_file.stat().st_size >= grown, 10, "the WAL was not checkpointed")
    other = SqliteStore(tmp_path / "plane.db")
    assert len(other.get_many([f"r{i}" for i in range(1000)])) == 1000
    # And closing the store ends its thread
    checkpointer = s._checkpointer
    assert checkpointer is not None and checkpointer.alive
    s.close()
    assert not checkpointer.alive
    other.close()
    assert SqliteStore(":memory:")._checkpointer is None
