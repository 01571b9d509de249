"""What the DynamoDB + S3 store does beyond the conformance suite: its key schema and
sparse indexes, the TTL attribute, the 400 KB item guard (S3 offload), blobs and
presigned URLs, the running counter of capped queues, job output and data keys (checked
against the SQLite store), and how many requests a job costs.

Everything runs against moto in-process (tables built from template.yaml).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.errors import InvalidRequest
from dreamlake.lakeshore.plane import Invocation, Plane, QueueSpec, State, Submission
from dreamlake.lakeshore.plane.ids import group_ids
from dreamlake.lakeshore.plane.model import LogEntry
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.stores import keys as K
from dreamlake.lakeshore.submit import new_id

pytest.importorskip("moto")

from dreamlake.lakeshore.stores import dynamo, dynamo_extras
from dreamlake.lakeshore.stores.dynamo import DynamoStore
from infra.tables import moto_stack

T0 = 1_700_000_000.0
BIG = 300 * 1024  # well over the inline limit: together three of these exceed 400 KB


@pytest.fixture
def aws() -> Iterator[tuple[K.Resources, Any, Any]]:
    with moto_stack() as built:
        yield built


@pytest.fixture
def open_store(aws: tuple[K.Resources, Any, Any]) -> Iterator[Callable[[], DynamoStore]]:
    """Opens handles onto one set of tables (each as another process would)."""
    resources, ddb, s3 = aws
    handles: list[DynamoStore] = []

    def opener() -> DynamoStore:
        handles.append(DynamoStore(resources, dynamodb=ddb, s3=s3))
        return handles[-1]

    yield opener
    for handle in handles:
        handle.close()


@pytest.fixture
def store(open_store: Callable[[], DynamoStore]) -> DynamoStore:
    return open_store()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


def record(inv_id: str, queue: str = "q", **fields: Any) -> Invocation:
    values: dict[str, Any] = {
        "state": State.PENDING,
        "payload": b"payload of " + inv_id.encode(),
        "request_digest": "d-" + inv_id,
        "order_key": inv_id,
        "priority": 0.0,
        "available_at": T0,
        "created_at": T0,
        "max_attempts": 3,
    }
    values.update(fields)
    return Invocation(id=inv_id, queue=queue, **values)


def raw(aws: tuple[K.Resources, Any, Any], inv_id: str) -> dict[str, Any]:
    resources, ddb, _ = aws
    item: dict[str, Any] = ddb.get_item(
        TableName=resources.invocations, Key={"id": {"S": inv_id}}, ConsistentRead=True
    )["Item"]
    return item


def index_ids(aws: tuple[K.Resources, Any, Any], index: str, pk_attr: str, pk: str) -> list[str]:
    resources, ddb, _ = aws
    out = ddb.query(
        TableName=resources.invocations,
        IndexName=index,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": pk_attr},
        ExpressionAttributeValues={":pk": {"S": pk}},
    )
    return [i["id"]["S"] for i in out["Items"]]


def objects(aws: tuple[K.Resources, Any, Any], prefix: str) -> list[str]:
    resources, _, s3 = aws
    out = s3.list_objects_v2(Bucket=resources.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in out.get("Contents", []))


@contextmanager
def requests(*clients: Any) -> Iterator[Counter[str]]:
    """Counts the AWS requests made through ``clients`` (botocore's event hooks)."""
    seen: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        seen[model.name] += 1

    for client in clients:
        client.meta.events.register("before-call", count)
    try:
        yield seen
    finally:
        for client in clients:
            client.meta.events.unregister("before-call", count)


# =======================================================================================
# Key schema and sparse indexes
# =======================================================================================


def test_a_pending_invocation_has_only_the_pending_index_keys(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # When a pending invocation due on arrival is inserted
    store.insert(record("a"))
    item = raw(aws, "g#a")
    # Then its group sits in its queue's pending partition (and the by-queue index), and
    # in no other sparse index: due on arrival, it has no due time
    home = K.shard_home("q", "a")
    assert item[K.PENDING_PK] == {"S": home}
    assert item["order_key"] == {"S": "a"} and float(item["available_at"]["N"]) == T0
    assert not {K.LEASE_PK, K.PURGE_PK, K.PURGE_AT, K.DUE_AT} & set(item)
    assert index_ids(aws, K.PENDING_INDEX, K.PENDING_PK, home) == ["g#a"]
    assert index_ids(aws, K.DUE_INDEX, K.PENDING_PK, home) == []
    assert store.get("a") == record("a")


def test_a_group_keeps_its_records_in_one_item_and_their_payloads_beside_it(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # When five invocations of one id group are inserted in one call
    base = new_id()
    ids = group_ids(base, 5)
    assert store.insert_many([record(i, order_key=i) for i in ids]) == [None] * 5
    # Then one group item holds them, its order key the lowest, and one payload item
    # holds their payloads
    item = raw(aws, "g#" + base)
    assert item["order_key"] == {"S": ids[0]}
    resources, ddb, _ = aws
    keys = [i["id"]["S"] for i in ddb.scan(TableName=resources.invocations)["Items"]]
    assert sorted(k[:2] for k in keys) == ["g#", "p#"]
    assert index_ids(aws, K.PENDING_INDEX, K.PENDING_PK, K.shard_home("q", base)) == ["g#" + base]
    # And each record reads back whole
    assert store.get_many(ids) == [record(i, order_key=i) for i in ids]
    # When three are claimed in one call, the group is written once, still pending
    with requests(ddb) as seen:
        claimed = store.update_many_if(
            [(i, {"state": State.PENDING}, {"state": State.RUNNING}) for i in ids[:3]]
        )
    assert [c.id if c else None for c in claimed] == ids[:3]
    assert seen == Counter({"GetItem": 1, "PutItem": 1})
    item = raw(aws, "g#" + base)
    assert item["order_key"] == {"S": ids[3]} and item[K.REV] == {"N": "1"}


def test_a_claim_leases_from_the_groups_its_read_found_without_reading_them_again(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a group of two pending invocations, read as claim candidates
    base = new_id()
    a, b = group_ids(base, 2)
    store.insert_many([record(a, order_key=a), record(b, order_key=b)])
    assert [r.id for r in store.pending("q", T0, 1)] == [a]
    # When the first is leased, the group is not read again: one conditional put
    _, ddb, _ = aws
    with requests(ddb) as seen:
        leased = store.update_many_if([(a, {"state": State.PENDING}, {"state": State.RUNNING})])
    assert [r.id if r else None for r in leased] == [a]
    assert seen == Counter({"PutItem": 1})
    # And a later update reads the group as always (what the claim read was used once)
    with requests(ddb) as seen:
        assert store.update_if(b, {"state": State.PENDING}, {"state": State.RUNNING})
    assert seen == Counter({"GetItem": 1, "PutItem": 1})


def test_a_claim_read_that_is_out_of_date_never_decides_an_update(store: DynamoStore) -> None:
    def lease_elsewhere(inv_id: str, token: str) -> None:  # another thread, meanwhile
        def lease() -> None:
            change = {"state": State.RUNNING, "lease_token": token}
            assert store.update_if(inv_id, {"state": State.PENDING}, change)

        thread = threading.Thread(target=lease)
        thread.start()
        thread.join()

    # Given an invocation read as a claim candidate (pending), then leased elsewhere
    a, b = new_id(), new_id()
    store.insert_many([record(a, order_key="1"), record(b, order_key="2")])
    assert [r.id for r in store.pending("q", T0, 1)] == [a]
    lease_elsewhere(a, "x")
    # When this thread leases it as the read found it: the put is refused (the group
    # moved on), and the group as it is now says it is taken
    assert store.update_many_if([(a, {"state": State.PENDING}, {"state": State.RUNNING})]) == [None]
    current = store.get(a)
    assert current is not None and current.lease_token == "x"
    # Given another read as a candidate, then leased elsewhere
    assert [r.id for r in store.pending("q", T0, 1)] == [b]
    lease_elsewhere(b, "y")
    # When the holder's update comes on this thread (the old read would refuse it: it
    # says pending), it is judged on a fresh read and goes through
    got = store.update_many_if(
        [(b, {"state": State.RUNNING, "lease_token": "y"}, {"progress": 0.5})]
    )
    assert got[0] is not None and got[0].progress == 0.5 and got[0].lease_token == "y"


def test_updates_of_one_id_in_one_call_are_judged_in_order_after_a_claim_read(
    store: DynamoStore,
) -> None:
    # Given a pending invocation read as a claim candidate
    a = new_id()
    store.insert(record(a, order_key=a))
    store.pending("q", T0, 1)
    # When one call updates it as running, then leases it
    got = store.update_many_if(
        [
            (a, {"state": State.RUNNING}, {"progress": 0.5}),
            (a, {"state": State.PENDING}, {"state": State.RUNNING}),
        ]
    )
    # Then the first is refused (it was pending then), as on every store
    assert got[0] is None and got[1] is not None
    current = store.get(a)
    assert current is not None and current.progress is None


@pytest.mark.parametrize("read_first", [False, True], ids=["fresh", "after-claim-read"])
def test_a_repeated_completion_refused_keeps_the_stored_result(
    store: DynamoStore, read_first: bool
) -> None:
    # Given a running invocation (and another of its group pending)
    d, other = group_ids(new_id(), 2)
    store.insert_many([record(d, order_key=d), record(other, order_key=other)])
    held = {"state": State.RUNNING, "lease_token": "t"}
    assert store.update_if(d, {"state": State.PENDING}, held)
    done = {"state": State.SUCCEEDED, "result": b"r" * BIG, "expires_at": T0 + 99}
    # When its completion (a result big enough for S3) is sent twice: in one call, then
    # again on its own (a retry whose first answer was lost)
    if read_first:
        store.pending("q", T0, 1)
    assert [r is not None for r in store.update_many_if([(d, held, done), (d, held, done)])] == [
        True,
        False,
    ]
    assert store.update_if(d, held, done) is None
    # Then the result stored by the first stays readable (the refused ones uploaded the
    # same bytes under the same key: what was uploaded for them is not deleted)
    current = store.get(d)
    assert current is not None and current.result == b"r" * BIG


def test_ids_of_one_group_go_to_one_queue(store: DynamoStore) -> None:
    a, b, c = group_ids(new_id(), 3)
    store.insert(record(a, "q"))
    # a later insert into the group, and one call mixing queues, are refused (a 400)
    with pytest.raises(InvalidRequest, match="one queue"):
        store.insert(record(b, "other"))
    with pytest.raises(InvalidRequest, match="one queue"):
        store.insert_many([record(b, "q"), record(c, "other")])
    assert store.get(b) is None and store.get(c) is None


def test_only_invocations_scheduled_for_later_are_in_the_due_index(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given one invocation submitted with a delay and one due on arrival
    store.insert(record("later", available_at=T0 + 30))
    store.insert(record("now"))
    home = K.shard_home("q", "later")
    # Then only the delayed one is in the due index, and next_available_at is its time
    assert index_ids(aws, K.DUE_INDEX, K.PENDING_PK, home) == ["g#later"]
    assert store.next_available_at("q") == T0 + 30
    # When the other is claimed, then failed with a retry backoff (its time rewritten)
    assert store.update_if("now", {"state": State.PENDING}, {"state": State.RUNNING})
    retried = store.update_if(
        "now", {"state": State.RUNNING}, {"state": State.PENDING, "available_at": T0 + 5}
    )
    # Then it joins the due index, and comes due first
    assert retried is not None and retried.available_at == T0 + 5
    assert sorted(index_ids(aws, K.DUE_INDEX, K.PENDING_PK, home)) == ["g#later", "g#now"]
    assert store.next_available_at("q") == T0 + 5
    assert [r.id for r in store.pending("q", T0 + 10, 10)] == ["now"]


def test_no_write_after_a_groups_creation_changes_its_by_queue_entry(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    resources, ddb, _ = aws

    def by_queue() -> list[dict[str, Any]]:
        out = ddb.query(
            TableName=resources.invocations,
            IndexName=K.QUEUE_INDEX,
            KeyConditionExpression="#q = :q",
            ExpressionAttributeNames={"#q": "queue"},
            ExpressionAttributeValues={":q": {"S": "q"}},
        )
        items: list[dict[str, Any]] = out["Items"]
        return items

    # Given a pending invocation
    store.insert(record("a"))
    submitted = by_queue()
    assert [i["id"]["S"] for i in submitted] == ["g#a"]
    # When it is claimed, finishes and is retried, its entry stays as it was (keys only)
    assert store.update_if("a", {"state": State.PENDING}, {"state": State.RUNNING})
    assert store.update_if("a", {"state": State.RUNNING}, {"state": State.FAILED})
    assert store.counts("q", T0) == {"failed": 1}
    assert store.update_if("a", {"state": State.FAILED}, {"state": State.PENDING})
    assert by_queue() == submitted
    assert store.counts("q", T0) == {"pending": 1}


def test_a_claim_moves_an_invocation_from_the_pending_index_to_the_leases_index(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a pending invocation with a 30 s timeout
    store.insert(record("a", timeout=30.0))
    # When it is claimed
    claimed = store.update_if(
        "a",
        {"state": State.PENDING, "attempt": 0},
        {
            "state": State.RUNNING,
            "attempt": 1,
            "lease_token": "t",
            "lease_expires_at": T0 + 60,
            "started_at": T0 + 0.25,
        },
    )
    assert claimed is not None
    item = raw(aws, "g#a")
    # Then its group left the pending partition and holds a lease entry
    assert K.PENDING_PK not in item
    assert item[K.LEASE_PK] == {"S": K.lease_pk("a")}
    assert float(item["lease_expires_at"]["N"]) == T0 + 60
    assert index_ids(aws, K.PENDING_INDEX, K.PENDING_PK, K.shard_home("q", "a")) == []
    assert index_ids(aws, K.LEASES_INDEX, K.LEASE_PK, K.lease_pk("a")) == ["g#a"]
    assert item[K.REV] == {"N": "1"}
    # And the deadline holds: an answer after started_at + timeout is refused
    expect = {"state": State.RUNNING, "lease_token": "t"}
    assert store.update_if("a", expect, {"progress": 0.5}, deadline_after=T0 + 30.25) is None
    assert store.update_if("a", expect, {"progress": 0.5}, deadline_after=T0 + 30.2)


def _complete(store: DynamoStore, inv_id: str, result: bytes = b"r") -> None:
    expect = {"state": State.RUNNING, "lease_token": "t"}
    changes = {
        "state": State.SUCCEEDED,
        "result": result,
        "expires_at": T0 + 100,
        "lease_expires_at": None,
    }
    assert store.update_if(inv_id, expect, changes) is not None


def test_a_finished_invocation_without_objects_is_left_to_ttl(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a running invocation with its payload inline
    store.insert(record("a", state=State.RUNNING, lease_token="t", lease_expires_at=T0 + 60))
    # When it completes with a small result, expiring at T0 + 100
    _complete(store, "a")
    item = raw(aws, "g#a")
    # Then its group has left the leases index, is in no expiry partition, has its TTL
    assert not {K.LEASE_PK, K.PENDING_PK, "lease_expires_at", K.PURGE_PK} & set(item)
    assert int(item[K.PURGE_AT]["N"]) == int(T0 + 100 + K.TTL_AFTER_EXPIRY)
    assert K.TTL_AFTER_EXPIRY > 30 * 86400  # past the default tombstone
    # and the result item beside it expires with the result
    resources, ddb, s3 = aws
    parts = [
        i for i in ddb.scan(TableName=resources.invocations)["Items"] if i["id"]["S"][:2] == "r#"
    ]
    assert [int(i[K.PURGE_AT]["N"]) for i in parts] == [int(T0 + 100 + 3600)]
    # And purges, past its expiry and past its tombstone, write nothing: TTL deletes it
    with requests(ddb, s3) as seen:
        assert store.purge(T0 + 100, T0 - 1000) == 0
        assert store.purge(T0 + 5000, T0 + 3000) == 0
    assert not {"UpdateItem", "DeleteItem", "BatchWriteItem", "PutItem"} & set(seen)
    assert raw(aws, "g#a") == item


def test_a_finished_invocation_with_an_offloaded_payload_is_stripped_once(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a running invocation whose payload is in S3
    store.insert(
        record(
            "a", state=State.RUNNING, lease_token="t", lease_expires_at=T0 + 60, payload=b"p" * BIG
        )
    )
    assert objects(aws, "inv/a/") != []
    # When it completes with a small result
    _complete(store, "a")
    # Then its group waits in a strip partition of the expiry index
    shard = K.expiry_shard("a")
    assert index_ids(aws, K.EXPIRY_INDEX, K.PURGE_PK, K.strip_pk(shard)) == ["g#a"]
    # When purge passes its expiry, it is stripped: its object goes, it leaves the index
    # and TTL deletes it at its time
    assert store.purge(T0 + 100, T0 - 1000) == 1
    item = raw(aws, "g#a")
    assert K.PURGE_PK not in item
    assert int(item[K.PURGE_AT]["N"]) == int(T0 + 100 + K.TTL_AFTER_EXPIRY)
    assert index_ids(aws, K.EXPIRY_INDEX, K.PURGE_PK, K.strip_pk(shard)) == []
    assert objects(aws, "inv/") == []
    # And later purges leave it to TTL: nothing more is written
    _, ddb, s3 = aws
    with requests(ddb, s3) as seen:
        assert store.purge(T0 + 5000, T0 + 3000) == 0
    assert not {"UpdateItem", "DeleteItem", "PutItem"} & set(seen)
    got = store.get("a")
    assert got is not None and got.payload is None and got.state is State.SUCCEEDED


@pytest.mark.parametrize("order", ["output-first", "finished-first"])
def test_a_finished_invocation_with_output_is_found_by_purge(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any], order: str
) -> None:
    # Given a running invocation that writes output, before or (late) after it finishes
    store.insert(record("a", state=State.RUNNING, lease_token="t", lease_expires_at=T0 + 60))
    entries = [LogEntry(1, "stdout", "out", T0, 1)]
    if order == "output-first":
        store.append_logs("a", entries)
        _complete(store, "a")
    else:
        _complete(store, "a")
        store.append_logs("a", entries)
    # Then it waits in the expiry index, and purge deletes its output past its expiry
    strip = K.strip_pk(K.expiry_shard("a"))
    assert index_ids(aws, K.EXPIRY_INDEX, K.PURGE_PK, strip) == ["g#a"]
    store.purge(T0 + 100, T0 - 1000)
    assert store.read_logs("a", 0, 10) == []
    assert store.get("a") is not None


def test_no_attribute_is_a_null_and_none_fields_read_back_none(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a record with a lease token and worker
    store.insert(record("a", lease_token="t", worker="w"))
    # When they are set to None
    store.update_if("a", {"lease_token": "t"}, {"lease_token": None, "worker": None})
    # Then they read back None, and no attribute anywhere is a NULL
    got = store.get("a")
    assert got is not None and (got.lease_token, got.worker) == (None, None)
    item = raw(aws, "g#a")
    assert not [name for name, value in item.items() if "NULL" in value]


def test_numbers_round_trip_exactly(store: DynamoStore) -> None:
    rec = record(
        "a",
        priority=0.1 + 0.2,
        available_at=T0 + 1e-6,
        created_at=1e16,
        timeout=2.5e-5,
        progress=1 / 3,
        progress_message="a third",
    )
    store.insert(rec)
    assert store.get("a") == rec


# =======================================================================================
# The 400 KB item limit: large fields live in S3
# =======================================================================================


def test_large_payload_result_and_error_go_to_s3_and_read_back(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a record whose payload, result and error are 300 KB each (900 KB in all)
    error = {"type": "E", "message": "m", "traceback": "x" * BIG, "pickled": None}
    rec = record("big", state=State.FAILED, payload=b"p" * BIG, result=b"r" * BIG, error=error)
    # When it is inserted
    assert store.insert(rec) is None
    # Then the group item is small, its three fields are S3 objects, a read restores all
    item = raw(aws, "g#big")
    assert sum(len(str(v)) for v in item.values()) < 4096
    assert len(objects(aws, "inv/big/")) == 3
    assert store.get("big") == rec
    assert store.get_many(["big"]) == [rec]


def test_a_field_at_the_inline_limit_stays_in_dynamodb(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    limit = K.INLINE_LIMITS["payload"]
    store.insert(record("edge", payload=b"e" * limit))
    assert objects(aws, "inv/edge/") == []
    store.insert(record("over", payload=b"o" * (limit + 1)))
    assert len(objects(aws, "inv/over/")) == 1
    result = b"r" * K.INLINE_LIMITS["result"]
    store.insert(record("done", state=State.SUCCEEDED, result=result))
    assert objects(aws, "inv/done/") == []
    assert [store.get(i).payload for i in ("edge", "over")] == [b"e" * limit, b"o" * (limit + 1)]  # type: ignore[union-attr]
    got = store.get("done")
    assert got is not None and got.result == result


def test_a_string_field_too_large_for_an_item_is_refused_before_any_request(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    _, ddb, s3 = aws
    with requests(ddb, s3) as seen, pytest.raises(ValueError, match="worker"):
        store.insert(record("a", worker="w" * (K.INLINE_MAX + 1)))
    store.insert(record("b"))
    with requests(ddb, s3) as later, pytest.raises(ValueError, match="worker"):
        store.update_if("b", {}, {"worker": "w" * (K.INLINE_MAX + 1)})
    assert not seen and not later


def test_reading_candidates_fetches_no_offloaded_field(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given three pending invocations with large payloads
    for n in range(3):
        store.insert(record(f"p{n}", payload=bytes([n]) * BIG))
    s3 = aws[2]
    # When pending() reads them, nothing comes from S3
    with requests(s3) as seen:
        got = store.pending("q", T0, 10)
    assert [r.id for r in got] == ["p0", "p1", "p2"]
    assert not seen
    # Until a payload is read: then exactly that one
    with requests(s3) as seen:
        assert got[1].payload == b"\x01" * BIG
        assert got[1].payload == b"\x01" * BIG
    assert seen == Counter({"GetObject": 1})


def test_a_claim_through_the_plane_hands_out_an_offloaded_payload(
    store: DynamoStore, clock: FakeClock
) -> None:
    plane = Plane(store, clock=clock)
    plane.ensure_queue(QueueSpec("q"))
    plane.submit([Submission("big", "q", b"b" * BIG)])
    [claim] = plane.claim(["q"], "w")
    assert claim.payload == b"b" * BIG
    plane.complete(claim.id, claim.lease_token, b"r" * BIG)
    assert plane.get("big").result == b"r" * BIG


def test_an_update_that_replaces_an_offloaded_field_deletes_the_old_object(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a record with a large result
    store.insert(record("a", state=State.RUNNING, lease_token="t", result=b"1" * BIG))
    [old] = objects(aws, "inv/a/")
    # When the result is replaced by another large one, then by a small one
    store.update_if("a", {"lease_token": "t"}, {"result": b"2" * BIG})
    [new] = objects(aws, "inv/a/")
    assert new != old
    updated = store.update_if("a", {"lease_token": "t"}, {"result": b"small"})
    # Then no object is left behind, and the record reads back right
    assert objects(aws, "inv/a/") == []
    assert updated is not None and updated.result == b"small"
    assert store.get("a") == updated


def test_a_refused_write_leaves_no_object_behind(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a record with a large payload
    original = record("a", payload=b"1" * BIG)
    store.insert(original)
    before = objects(aws, "inv/a/")
    # When another record with that id and another large payload is inserted,
    # and an update with a large result is refused
    assert store.insert(record("a", payload=b"2" * BIG)) == original
    assert store.update_if("a", {"lease_token": "no"}, {"result": b"3" * BIG}) is None
    # Then only the original's object remains, and the record is unchanged
    assert objects(aws, "inv/a/") == before
    assert store.get("a") == original


def test_purge_and_queue_deletion_delete_offloaded_objects(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a finished record past expiry and a pending one, each with large fields
    store.insert(record("done", state=State.SUCCEEDED, result=b"r" * BIG, expires_at=T0 - 1))
    store.insert(record("waiting", "other", payload=b"p" * BIG))
    # When the store is purged, the stripped record's objects go
    assert store.purge(T0, T0 - 1000) == 1
    assert objects(aws, "inv/done/") == []
    # And when the other queue is deleted with its invocations, so do theirs
    assert store.delete_queue("other") == 1
    assert objects(aws, "inv/") == []


def test_a_record_with_its_error_in_s3_is_deleted_with_it_at_the_tombstones_end(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a failed record past expiry whose error is too large for the item
    error = {"type": "E", "message": "m", "traceback": "x" * BIG, "pickled": None}
    store.insert(record("bad", state=State.FAILED, error=error, expires_at=T0 - 1))
    [obj] = objects(aws, "inv/bad/")
    # When it is stripped, the error stays readable (TTL would orphan its object, so the
    # group waits in the bury partition instead)
    assert store.purge(T0, T0 - 1000) == 1
    stripped = store.get("bad")
    assert stripped is not None and stripped.error == error
    bury = K.bury_pk(K.expiry_shard("bad"))
    assert index_ids(aws, K.EXPIRY_INDEX, K.PURGE_PK, bury) == ["g#bad"]
    # Then past its tombstone purge deletes it, object and all
    assert store.purge(T0 + 2000, T0 + 1000) == 1
    assert store.get("bad") is None
    assert objects(aws, "inv/") == [] != [obj]


# =======================================================================================
# A claim reads entries of the pending index, then their groups
# =======================================================================================


def test_candidates_are_read_from_the_index_and_their_groups_payloads_when_used(
    open_store: Callable[[], DynamoStore], aws: tuple[K.Resources, Any, Any]
) -> None:
    _, ddb, s3 = aws
    # Given two pending records, one with an offloaded payload, submitted elsewhere
    small = record("a", timeout=30.0, worker="w0", priority=2.0)
    big = record("b", payload=b"p" * BIG, available_at=T0 - 5)
    open_store().insert_many([small, big])
    store = open_store()
    # When the candidates are read: one Query, one read of their groups, nothing else
    with requests(ddb, s3) as seen:
        got = store.pending("q", T0, 10)
        assert [(c.id, c.attempt, c.timeout, c.worker, c.available_at) for c in got] == [
            ("a", 0, 30.0, "w0", T0),
            ("b", 0, None, None, T0 - 5),
        ]
    assert seen == Counter({"Query": 1, "BatchGetItem": 1})
    # Then a payload is read when used: from its payload item (once) or from S3
    with requests(ddb, s3) as seen:
        assert got[0] == small and got[0].payload == small.payload
    assert seen == Counter({"GetItem": 1})
    with requests(ddb, s3) as seen:
        assert got[1] == big
    assert seen == Counter({"GetObject": 1})


def test_a_claim_of_many_reads_and_writes_each_group_once(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any], clock: FakeClock
) -> None:
    _, ddb, _ = aws
    plane = Plane(store, clock=clock)
    plane.ensure_queue(QueueSpec("q", kind="priority"))
    ids = group_ids(new_id(), 10)
    plane.submit([Submission(i, "q", b"%d" % n, priority=n) for n, i in enumerate(ids)])
    plane.claim(["q"], "w", limit=1)  # the first claim sweeps; the next one is measured
    with requests(ddb) as seen:
        claims = plane.claim(["q"], "w", limit=5)
    # Then the five next by priority, their payloads from the one payload item
    assert [c.payload for c in claims] == [b"8", b"7", b"6", b"5", b"4"]
    assert seen["Query"] == 1 and seen["PutItem"] == 1
    # (the queue's spec, the group before its write, the payload item)
    assert seen["GetItem"] + seen["BatchGetItem"] <= 4
    plane.complete_many([(c.id, c.lease_token, b"r") for c in claims])
    assert [plane.get(c.id).result for c in claims] == [b"r"] * 5


# =======================================================================================
# Blobs and presigned URLs
# =======================================================================================


def test_blobs_round_trip_under_their_prefix(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    store.put_blob("d1", b"\x00bytes\xff", T0)
    store.put_blob("d1", b"other", T0)  # a second put is a no-op
    assert store.get_blob("d1") == b"\x00bytes\xff"
    assert objects(aws, K.BLOB_PREFIX) == [K.blob_key("d1")]
    assert store.has_blobs(["d1", "d2"]) == {"d1"}
    assert store.get_blob("d2") is None


def test_a_blob_found_in_use_is_restamped_once_old(
    open_store: Callable[[], DynamoStore], aws: tuple[K.Resources, Any, Any]
) -> None:
    resources, ddb, s3 = aws
    fresh = open_store()
    fresh.put_blob("d1", b"x", T0)
    # A recent blob is only looked at
    with requests(s3) as seen:
        assert fresh.has_blobs(["d1"]) == {"d1"}
    assert seen == Counter({"HeadObject": 1})
    # One older than the refresh age is copied onto itself, which resets its expiry
    old = DynamoStore(resources, dynamodb=ddb, s3=s3, blob_refresh_after=-1.0)
    with requests(s3) as seen:
        assert old.has_blobs(["d1"]) == {"d1"}
    assert seen == Counter({"HeadObject": 1, "CopyObject": 1})
    assert old.get_blob("d1") == b"x"


@pytest.mark.parametrize(("method", "ttl"), [("GET", 900), ("PUT", 60)])
def test_blob_url_is_a_sigv4_presigned_s3_url(store: DynamoStore, method: str, ttl: int) -> None:
    url = store.blob_url(method, "ab" * 32, ttl)
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert parts.scheme == "https"
    assert parts.netloc == f"{K.Resources().bucket}.s3.amazonaws.com"
    assert parts.path == "/" + K.blob_key("ab" * 32)
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert query["X-Amz-Expires"] == str(ttl)
    assert query["X-Amz-Credential"].endswith("/us-east-1/s3/aws4_request")
    assert query["X-Amz-SignedHeaders"] == "host"
    assert len(query["X-Amz-Signature"]) == 64


def test_blob_url_refuses_other_methods_and_lifetimes(store: DynamoStore) -> None:
    with pytest.raises(ValueError, match="GET or PUT"):
        store.blob_url("DELETE", "d", 60)
    with pytest.raises(ValueError, match="7 days"):
        store.blob_url("GET", "d", 8 * 86400)


# =======================================================================================
# The running counter of capped queues
# =======================================================================================


def running_counter(aws: tuple[K.Resources, Any, Any], queue: str) -> int:
    resources, ddb, _ = aws
    out = ddb.get_item(TableName=resources.records, Key=K.running_key(queue), ConsistentRead=True)
    return int(out["Item"][K.REC_RUNNING]["N"]) if "Item" in out else 0


def test_every_way_out_of_running_gives_a_capped_queues_slot_back(
    open_store: Callable[[], DynamoStore], aws: tuple[K.Resources, Any, Any], clock: FakeClock
) -> None:
    # Given a queue capped at 2 running, six submissions, and two planes on separate
    # handles (one claims, the other answers, as two Lambda instances would)
    claimer = Plane(open_store(), clock=clock, lease_seconds=10)
    answerer = Plane(open_store(), clock=clock, lease_seconds=10)
    claimer.ensure_queue(QueueSpec("capped", elasticity={"kind": "fixed", "max": 2}))
    claimer.submit([Submission(f"j{n}", "capped", b"x") for n in range(6)])

    def claim_all() -> list[Any]:
        return claimer.claim(["capped"], "w", limit=6)

    # When workers ask for everything, only two run
    first = claim_all()
    assert len(first) == 2 and running_counter(aws, "capped") == 2
    assert claim_all() == []
    # Then each way out of running frees a slot: complete, fail, cancel, release ...
    answerer.complete(first[0].id, first[0].lease_token, b"r")
    assert running_counter(aws, "capped") == 1
    [second] = claim_all()
    error = {"type": "E", "message": "m", "traceback": "", "pickled": None}
    assert answerer.fail(first[1].id, first[1].lease_token, error) is State.FAILED
    [third] = claim_all()
    assert answerer.cancel(second.id) is State.CANCELLED
    [fourth] = claim_all()
    answerer.release(third.id, third.lease_token)
    assert running_counter(aws, "capped") == 1
    # ... and a lease that runs out
    clock.advance(11)
    answerer.sweep()
    assert running_counter(aws, "capped") == 0
    assert answerer.get(fourth.id).state is State.PENDING
    # And the counter always equals the running invocations
    assert len(claim_all()) == 2
    assert running_counter(aws, "capped") == answerer.counts("capped")["running"] == 2


def test_capped_claims_from_many_threads_never_exceed_the_cap(
    open_store: Callable[[], DynamoStore], aws: tuple[K.Resources, Any, Any], clock: FakeClock
) -> None:
    # Given 30 jobs on a queue capped at 3, and 6 workers on 3 handles that complete
    # what they claim
    planes = [Plane(open_store(), clock=clock) for _ in range(3)]
    planes[0].ensure_queue(QueueSpec("capped", elasticity={"kind": "fixed", "max": 3}))
    planes[0].submit([Submission(f"j{n:02d}", "capped", b"x") for n in range(30)])
    peak = held = 0
    lock = threading.Lock()

    def worker(n: int) -> None:
        # ``held`` counts a claim from its return to just before its completion: never
        # more than really run at once (counts() is several reads, not one snapshot).
        nonlocal peak, held
        plane = planes[n % 3]
        while claims := plane.claim(["capped"], f"w{n}"):
            with lock:
                held += len(claims)
                peak = max(peak, held)
            for c in claims:
                with lock:
                    held -= 1
                plane.complete(c.id, c.lease_token, b"r")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # Then every job finished, never more than 3 ran at once, and the counter is back to 0
    assert planes[0].counts("capped")["succeeded"] == 30
    assert peak <= 3
    assert running_counter(aws, "capped") == 0


def test_queues_without_a_cap_never_touch_a_counter(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any], clock: FakeClock
) -> None:
    plane = Plane(store, clock=clock)
    plane.ensure_queue(QueueSpec("free"))
    plane.submit([Submission("a", "free", b"x")])
    _, ddb, _ = aws
    with requests(ddb) as seen:
        [c] = plane.claim(["free"], "w")
        plane.complete(c.id, c.lease_token, b"r")
    assert "TransactWriteItems" not in seen
    assert running_counter(aws, "free") == 0


# =======================================================================================
# Job output and data keys: as the SQLite store keeps them
# =======================================================================================


def _log_story(store: Any) -> list[Any]:
    """One sequence of log operations; returns everything it read."""
    big = "x" * (K.LOG_INLINE_MAX + 10)
    store.append_logs(
        "a", [LogEntry(1, "stdout", "one\n", T0, 1), LogEntry(2, "stderr", "two", T0, 1)]
    )
    store.append_logs(
        "a", [LogEntry(2, "stdout", "resent", T0 + 1, 1), LogEntry(3, "stdout", big, T0 + 1, 1)]
    )
    store.append_logs("b", [LogEntry(1, "stdout", "other", T0, 1)])
    store.append_logs("a", [])
    return [
        store.read_logs("a", 0, 10),
        store.read_logs("a", 1, 1),
        store.read_logs("a", 3, 10),
        store.read_logs("b", 0, 10),
        store.read_logs("missing", 0, 10),
    ]


def test_logs_behave_as_in_the_sqlite_store(store: DynamoStore) -> None:
    sqlite = SqliteStore(":memory:")
    try:
        expected = _log_story(sqlite)
    finally:
        sqlite.close()
    assert _log_story(store) == expected
    # the resent entry kept its first text
    assert [e.text for e in expected[0][:2]] == ["one\n", "two"]


def test_purge_and_queue_deletion_delete_a_jobs_output(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    big = "y" * (K.LOG_INLINE_MAX + 1)
    store.insert(record("done", state=State.SUCCEEDED, result=b"r", expires_at=T0 - 1))
    store.insert(record("running", "other", state=State.RUNNING))
    for inv_id in ("done", "running"):
        store.append_logs(
            inv_id, [LogEntry(1, "stdout", "out", T0, 1), LogEntry(2, "stdout", big, T0, 1)]
        )
    assert len(objects(aws, "inv/")) == 2
    # When the finished record is stripped, its output goes with its result
    store.purge(T0, T0 - 1000)
    assert store.read_logs("done", 0, 10) == []
    assert len(store.read_logs("running", 0, 10)) == 2
    # And when a queue is deleted with its invocations, theirs goes too
    store.delete_queue("other")
    assert store.read_logs("running", 0, 10) == []
    assert objects(aws, "inv/") == []


def _data_key_story(store: Any) -> list[dict[str, str]]:
    store.put_data_key("models/a", "d1", T0)
    store.put_data_key("models/b", "d2", T0)
    first = store.get_data_keys(["models/a", "models/b", "missing"])
    store.put_data_key("models/a", "d3", T0 + 1)
    return [first, store.get_data_keys(["models/a", "models/a"]), store.get_data_keys([])]


def test_data_keys_behave_as_in_the_sqlite_store(store: DynamoStore) -> None:
    sqlite = SqliteStore(":memory:")
    try:
        expected = _data_key_story(sqlite)
    finally:
        sqlite.close()
    assert _data_key_story(store) == expected


# =======================================================================================
# Cost: requests per job
# =======================================================================================


def test_requests_per_submit_claim_and_complete(
    store: DynamoStore,
    aws: tuple[K.Resources, Any, Any],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a plane whose first claim has swept and purged (and that reads whether a
    # queue has a running cap once in this test, whatever its pace)
    monkeypatch.setattr("dreamlake.lakeshore.plane.base.CAP_TTL", 3600.0)
    _, ddb, s3 = aws
    plane = Plane(store, clock=clock)
    plane.ensure_queue(QueueSpec("jobs"))
    plane.claim(["jobs"], "w")
    jobs = 10

    def one_by_one(step: Callable[[int], None]) -> Counter[str]:
        # a second apart: each claim sweeps expired leases, each call touches the queue
        with requests(ddb, s3) as counted:
            for n in range(jobs):
                clock.advance(1)
                step(n)
        return counted

    # When 1 KB jobs are submitted, claimed and completed one at a time
    claims: list[Any] = []
    submit = one_by_one(lambda n: plane.submit([Submission(f"j{n}", "jobs", b"x" * 1000)]))
    claim = one_by_one(lambda n: claims.extend(plane.claim(["jobs"], "w")))
    complete = one_by_one(lambda n: plane.complete(claims[n].id, claims[n].lease_token, b"r"))
    print(
        f"\nrequests per job: submit {dict(submit)}, claim {dict(claim)}, complete {dict(complete)}"
    )
    # Then a submit is a queue read, its payload item, the conditional put of its group,
    # an activity touch and the queue's idle mark read again after the write
    assert submit == Counter({"GetItem": 2 * jobs, "PutItem": 2 * jobs, "UpdateItem": jobs})
    # a claim is the sweep's lease queries, a queue read, one pending Query and the read
    # of the groups it names, the conditional put of the group as that read found it, an
    # activity touch (the payload item was written by this handle, which keeps it)
    queries = jobs * (K.LEASE_SHARDS + K.PENDING_SHARDS)
    assert (claim["Query"], claim["PutItem"], claim["UpdateItem"]) == (queries, jobs, jobs)
    assert claim["GetItem"] + claim["BatchGetItem"] == 2 * jobs
    # and a complete is the group's read, the result item and the group's conditional put
    # (and once a plane process every few seconds, the queue's read: has it a running cap,
    # whose finishes wake it?)
    assert complete == Counter({"GetItem": jobs + 1, "PutItem": 2 * jobs})


# =======================================================================================
# A claim that fails after it leased
# =======================================================================================


def _failing(store: DynamoStore, method: str, when: Callable[..., bool]) -> None:
    """``store.<method>`` raises DynamoDB's refusal (what botocore gives up with) when
    ``when(*args)``."""
    from dreamlake.lakeshore.handlers.aws import StoreUnavailable

    real = getattr(store, method)

    def failing(*args: Any, **kw: Any) -> Any:
        if when(*args):
            raise StoreUnavailable("DynamoDB refused: ThrottlingException")
        return real(*args, **kw)

    setattr(store, method, failing)


@pytest.mark.parametrize(
    "fails", ["the next queue's read", "the activity touch", "a later lease under a cap"]
)
def test_a_claim_that_fails_after_it_leased_answers_what_it_leased(
    store: DynamoStore, clock: FakeClock, fails: str
) -> None:
    """A store without transactions keeps the leases a claim wrote before a later step
    failed: raising would leave them leased to a request that failed (its retry leases
    others) until they run out. The claim answers what it leased instead."""
    # Given calls on one queue, and a store that fails after the claim leased some
    plane = Plane(store, clock=clock)
    capped = {"kind": "fixed", "max": 5} if fails.endswith("cap") else None
    plane.ensure_queue(QueueSpec("first", elasticity=capped))
    plane.ensure_queue(QueueSpec("second"))
    plane.submit([Submission(f"j{n}", "first", b"x") for n in range(3 if capped else 2)])
    if fails == "the next queue's read":
        _failing(store, "get_queue", lambda name: name == "second")
    elif fails == "the activity touch":
        _failing(store, "touch_queue", lambda *_: True)
        clock.advance(2)  # (a plane touches a queue at most once a second)
    else:  # (under a cap a claim leases one call at a time: the third write fails)
        writes: list[object] = []
        _failing(store, "update_many_if", lambda *a: bool(writes.append(a)) or len(writes) > 2)
    # When a worker claims on both queues
    claims = plane.claim(["first", "second"], "w", limit=5)
    # Then it has the calls it leased, leased to it and to nobody else
    assert sorted(c.id for c in claims) == ["j0", "j1"]
    for c in claims:
        rec = plane.get(c.id)
        assert (rec.state, rec.lease_token) == (State.RUNNING, c.lease_token)


def test_a_claim_that_fails_before_it_leased_anything_says_so(
    store: DynamoStore, clock: FakeClock
) -> None:
    from dreamlake.lakeshore.handlers.aws import StoreUnavailable

    plane = Plane(store, clock=clock)
    plane.ensure_queue(QueueSpec("first"))
    plane.submit([Submission("j0", "first", b"x")])
    _failing(store, "get_queue", lambda name: True)
    with pytest.raises(StoreUnavailable):
        plane.claim(["first"], "w")
    assert plane.get("j0").state is State.PENDING


# =======================================================================================
# A retried request
# =======================================================================================


@contextmanager
def first_answer_lost(client: Any, operation: str) -> Iterator[None]:
    """botocore retries the first ``operation`` as if its (successful) answer was lost."""

    def retry_first(attempts: int, **_: Any) -> float | None:
        return 0.0 if attempts == 1 else None

    event = f"needs-retry.{client.meta.service_model.endpoint_prefix}.{operation}"
    client.meta.events.register_first(event, retry_first)
    try:
        yield
    finally:
        client.meta.events.unregister(event, retry_first)


def test_an_update_whose_answer_was_lost_is_not_refused_by_its_own_retry(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any]
) -> None:
    # Given a pending record
    store.insert(record("a"))
    _, ddb, _ = aws
    # When a claim's first attempt succeeds but its answer is lost, and botocore retries
    with requests(ddb) as seen, first_answer_lost(ddb, "PutItem"):
        claimed = store.update_if(
            "a", {"state": State.PENDING}, {"state": State.RUNNING, "lease_token": "mine"}
        )
    # Then the retry's failed condition is recognised as the claim's own write
    assert seen == Counter({"GetItem": 1, "PutItem": 1})
    assert claimed is not None and claimed.lease_token == "mine"
    assert store.get("a") == claimed
    # While a refusal after a retry that someone else's write caused stays a refusal
    with first_answer_lost(ddb, "PutItem"):
        assert store.update_if("a", {"state": State.RUNNING}, {"lease_token": "theirs"})
        assert store.update_if("a", {"state": State.PENDING}, {"lease_token": "late"}) is None


# =======================================================================================
# Inside Lambda: a request that keeps failing ends before the function's 29 s
# =======================================================================================


def test_the_lambda_client_config_gives_up_well_inside_the_api_timeout() -> None:
    from botocore.config import Config

    lam = dynamo.lambda_client_config()
    # every attempt timing out, with the longest backoffs between: under 20 s
    assert dynamo.worst_case_seconds(lam) < 20.0
    # where the long-running default could take minutes (botocore reads for 60 s)
    default = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5)
    assert dynamo.worst_case_seconds(default) > 29.0


def test_make_clients_takes_a_config(aws: tuple[K.Resources, Any, Any]) -> None:
    resources, ddb, _ = aws
    made = dynamo.make_clients(ddb.meta.region_name, config=dynamo.lambda_client_config())
    for client in made:
        assert client.meta.config.read_timeout == dynamo.LAMBDA_READ_TIMEOUT
        assert client.meta.config.connect_timeout == dynamo.LAMBDA_CONNECT_TIMEOUT
        assert client.meta.config.retries["total_max_attempts"] == dynamo.LAMBDA_ATTEMPTS
    s3 = made[1]
    assert s3.meta.config.signature_version == "s3v4"  # still signs as the store needs
    # and they work
    assert made[0].describe_table(TableName=resources.invocations)["Table"]
    for client in made:
        client.close()


def test_a_batch_left_unprocessed_round_after_round_is_unavailable(
    aws: tuple[K.Resources, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dreamlake.lakeshore.errors import Unavailable
    from dreamlake.lakeshore.stores import dynamo_extras

    resources, _, s3 = aws
    rounds: list[int] = []

    class Throttled:
        """A DynamoDB client that leaves every key of a batch unprocessed."""

        def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
            rounds.append(1)
            return {"Responses": {}, "UnprocessedKeys": RequestItems}

        def close(self) -> None:
            pass

    monkeypatch.setattr(dynamo_extras, "backoff", lambda attempt: None)
    store = DynamoStore(resources, dynamodb=Throttled(), s3=s3)
    with pytest.raises(Unavailable):
        store.get_many(["a", "b"])
    assert len(rounds) == dynamo_extras._UNPROCESSED_ROUNDS


def test_a_plane_that_does_not_keep_payloads_deletes_an_offloaded_one_on_success(
    store: DynamoStore, aws: tuple[K.Resources, Any, Any], clock: FakeClock
) -> None:
    # Given a plane that does not keep payloads, and a running job whose payload is in S3
    plane = Plane(store, clock=clock, keep_payload=False)
    plane.ensure_queue(QueueSpec("q"))
    plane.submit([Submission("big", "q", b"p" * BIG)])
    (claim,) = plane.claim(["q"], "w")
    assert objects(aws, "inv/big/") != []
    # When it succeeds with a small result
    plane.complete("big", claim.lease_token, b"r")
    # Then its payload object is gone at once, and nothing is left for purge to do
    assert objects(aws, "inv/") == []
    assert K.PURGE_PK not in raw(aws, "g#big")
    assert plane.get("big").result == b"r" and plane.get("big").payload is None


def test_a_daemon_record_changed_by_others_at_every_try_gives_up_as_unavailable(
    open_store: Callable[[], DynamoStore],
) -> None:
    from dreamlake.lakeshore.errors import Unavailable
    from dreamlake.lakeshore.plane.model import DaemonRecord

    def daemon(concurrency: int) -> DaemonRecord:
        return DaemonRecord("d-a", "a", "host", ["q"], concurrency, "3.11", [5], 1.0, 1.0)

    # Given a daemon record that another process writes between each read and write
    store, other = open_store(), open_store()
    store.change_daemon("d-a", lambda _old: daemon(1))
    tries = 0

    def beat(rec: DaemonRecord | None) -> DaemonRecord | None:
        nonlocal tries
        tries += 1
        assert rec is not None
        rec.last_heartbeat = 100.0
        other.change_daemon("d-a", lambda _old: daemon(1 + tries))
        return rec

    # When a change is made, then it gives up after a bounded number of tries, with a
    # reason to retry, and none of its writes landed over the other's
    with pytest.raises(Unavailable, match="kept changing"):
        store.change_daemon("d-a", beat)
    assert tries == dynamo_extras._CHANGE_TRIES
    final = store.get_daemon("d-a")
    assert final is not None and (final.concurrency, final.last_heartbeat) == (1 + tries, 1.0)
