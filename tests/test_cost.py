"""benchmarks/cost.py counts what a job costs: its unit arithmetic follows DynamoDB's
billing rules, its hooks count the requests the store really makes, and the script runs
end to end on a tiny workload. (Figures and prices are the script's to print, not this
test's to pin: see docs/cost.md.)"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dreamlake.lakeshore.plane import Invocation, State
from dreamlake.lakeshore.stores import keys as K

pytest.importorskip("moto")

from infra.tables import moto_stack

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cost() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lakeshore_cost", ROOT / "benchmarks" / "cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _s(text: str) -> dict[str, str]:
    return {"S": text}


# =======================================================================================
# DynamoDB's billing rules
# =======================================================================================


def test_item_sizes_count_names_and_values(cost: ModuleType) -> None:
    item = {"id": _s("abc"), "n": {"N": "12345"}, "b": {"B": b"\x00" * 10}, "t": {"BOOL": True}}
    # names 2+1+1+1, values 3 + (5 digits: 3+1) + 10 + 1
    assert cost.item_size(item) == 5 + 3 + 4 + 10 + 1
    assert cost.value_size({"N": "-0.00120"}) == cost.value_size({"N": "12"}) == 2


def test_write_units_bill_the_larger_item_per_kb_and_every_index_entry_touched(
    cost: ModuleType,
) -> None:
    index = cost.Index("by_state", ("state",), frozenset())
    table = cost.Table("t", ("id",), (index,))
    small = {"id": _s("a"), "state": _s("x")}
    big = {**small, "blob": {"B": b"b" * 1500}}
    # a new item in an index: one unit for the item, one for the entry
    assert cost.write_units(table, None, small) == {"t": 1, "t.by_state": 1}
    # a larger item bills its size; the entry is unchanged (nothing it projects changed)
    assert cost.write_units(table, small, big) == {"t": 2}
    # a changed index key is a removal and an addition; a transaction bills the item twice
    moved = {**small, "state": _s("y")}
    assert cost.write_units(table, small, moved, transactional=True) == {"t": 2, "t.by_state": 2}
    # a refused conditional write bills the item and touches no index
    assert cost.write_units(table, big, big, applied=False) == {"t": 2}


def test_read_units_round_per_item_or_per_query(cost: ModuleType) -> None:
    assert cost.read_units([100, 5000], consistent=True, per_item=True) == 3
    assert cost.read_units([100, 5000], consistent=False, per_item=False) == 1
    assert cost.read_units([], consistent=False, per_item=False) == 0.5


# =======================================================================================
# The hooks count what the store does
# =======================================================================================


@pytest.fixture
def metered(cost: ModuleType) -> Iterator[tuple[Any, Any]]:
    import boto3  # type: ignore[import-untyped]

    from dreamlake.lakeshore.stores.dynamo import DynamoStore

    with moto_stack() as (resources, ddb, s3):
        region = ddb.meta.region_name
        meter = cost.Meter(
            boto3.client("dynamodb", region_name=region), boto3.client("s3", region_name=region)
        )
        meter.attach(ddb, s3)
        try:
            yield meter, DynamoStore(resources, dynamodb=ddb, s3=s3)
        finally:
            meter.detach(ddb, s3)


def _pending(inv_id: str, payload: bytes) -> Invocation:
    return Invocation(
        id=inv_id,
        queue="q",
        state=State.PENDING,
        payload=payload,
        request_digest="d",
        order_key=inv_id,
        priority=0.0,
        available_at=1.0,
        created_at=1.0,
        max_attempts=3,
    )


def test_the_hooks_count_requests_and_the_units_of_each_index(
    metered: tuple[Any, Any],
) -> None:
    meter, store = metered
    table = K.Resources().invocations
    # When a small pending invocation is inserted and claimed
    with meter.measure() as inserted:
        store.insert(_pending("a", b"x" * 100))
    with meter.measure() as claimed:
        store.update_if("a", {"state": State.PENDING}, {"state": State.RUNNING})
    # Then the insert is two PutItems: its payload item, and its group with the group's
    # pending and by-queue entries
    assert inserted.requests == {"dynamodb.PutItem": 2}
    assert inserted.wru == {table: 2, f"{table}.pending": 1, f"{table}.by_queue": 1}
    # and the claim a read of the group and its conditional put: the group, out of
    # pending (the leases index needs a lease expiry, which this bare update does not set)
    assert claimed.requests == {"dynamodb.GetItem": 1, "dynamodb.PutItem": 1}
    assert claimed.wru == {table: 1, f"{table}.pending": 1}
    # A strongly consistent read of the ~200-byte group item is one read unit
    with meter.measure() as read:
        store.get("a")
    assert (read.requests, read.rru) == ({"dynamodb.GetItem": 1}, 1.0)


def test_the_hooks_count_s3_requests_by_class(metered: tuple[Any, Any]) -> None:
    meter, store = metered
    # A payload over the inline limit goes to S3: a PUT, then a GET when it is read
    with meter.measure() as got:
        store.insert(_pending("big", b"y" * (K.INLINE_LIMITS["payload"] + 1)))
        rec = store.get("big")
        assert rec is not None and rec.payload is not None
    assert got.requests["s3.PutObject"] == got.requests["s3.GetObject"] == 1
    assert (got.s3("put"), got.s3("get")) == (1, 1)


# =======================================================================================
# The script, end to end
# =======================================================================================


def test_a_tiny_lifecycle_counts_every_layer(cost: ModuleType) -> None:
    # When two 100-byte jobs go through submit, claim, complete and result, two a call
    run = cost.lifecycle(100, 2, 2)
    per_job = run.per_job()
    # Then each call was one API request and one Lambda invocation, shared by two jobs
    assert per_job.api == per_job.api_metered == 2.0
    assert run.routes["POST /v1/invocations"] == run.routes["POST /v1/claims"] == 1
    assert run.routes["POST /v1/completions"] == run.routes["POST /v1/invocations/wait"] == 1
    # and the store's requests and units were counted, phase by phase
    # (a call's jobs share a group: its payload item and the group at submit, the group
    # at claim)
    assert run.phases["submit"].requests["dynamodb.PutItem"] == 2
    assert run.phases["claim"].requests["dynamodb.PutItem"] == 1
    assert all(run.phases[p].write_units > 0 for p in ("submit", "claim", "complete"))
    # and small finished records are left to TTL: their purge writes nothing, and they
    # are stored (whole) past their tombstone
    assert run.phases["purge"].write_units == 0
    assert run.phases["purge"].ddb_byte_days > 0
    assert per_job.lambda_seconds > 0 and per_job.rru > 0


def test_idle_polls_count_one_request_per_poll(cost: ModuleType) -> None:
    # A worker asking every 10 s, through the API and on aws:// (no API)
    day = cost.idle_polls(10.0, polls=3)
    direct = cost.idle_polls(10.0, via_api=False, polls=3)
    assert day.api == pytest.approx(8640)
    assert direct.api == 0 and direct.requests["dynamodb.Query"] > 0


def test_the_script_prints_its_tables(cost: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    cost.main(["--jobs", "1", "--sizes", "1024", "--batches", "1", "--idle-seconds", "0"])
    out = capsys.readouterr().out
    assert "| 1 KB | 1 |" in out
    assert "SQS standard" in out
    assert "by phase" in out
