"""Cost per job on the AWS plane, counted under moto and priced at list prices.

    .venv/bin/python benchmarks/cost.py [--jobs 100] [--sizes 100,1024,10240,1048576]
                                        [--batches 1,10,100] [--idle-seconds 20]
                                        [--idle-waits 2,0] [--wake-pickups 5]
                                        [--no-keep-payload]

Runs submit → claim → complete → result through the real stack in one process: the
SDK's HTTP transport (``HttpTransport``) → the Lambda handler's router (``make_app``)
→ ``Service`` → ``Plane`` → ``DynamoStore`` → moto (tables and bucket built from
template.yaml). Every request is counted where it is made:

- HTTP API requests and Lambda invocations: each call the transport makes to the plane
  (metered per 512 KB of request or answer body, as HTTP APIs bill); Lambda time is
  estimated as the handler's own time plus an assumed in-region latency per AWS request
  (``AWS_LATENCY``), at 256 MB arm64;
- DynamoDB and S3 requests: botocore event hooks on the store's clients
  (``before-parameter-build`` / ``after-call``). DynamoDB write and read units are
  computed from item sizes (moto does not bill): the item before and after each write
  is read back through a second, uncounted client, and every global secondary index the
  write adds, changes or removes an entry of is billed as DynamoDB bills it;
- presigned S3 transfers (blobs, wake objects) go to moto's S3 through the same counted
  client.

Then the figures per job are priced (:data:`PRICES`) and printed as a Markdown table,
beside SQS's price for the same lifecycle (3 requests), with a per-phase breakdown of a
1 KB job. Then a day of an idle worker: the process worker's claim loop
(``worker/pool.py``) on the plane as it is (wake objects: one fallback period of real
time, then ``--wake-pickups`` timed submits), against planes without wake objects that
hold claims for a few ``max_wait`` settings (``--idle-waits``,
``--idle-seconds`` of real time each), client-side polling at a few intervals, a worker
on ``aws://`` and the scheduled sweep. docs/cost.md explains the method and the figures.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote, urlsplit

# --- prices --------------------------------------------------------------------------

#: the day the list prices below were taken as current (us-east-1, on-demand)
PRICES_AS_OF = "2026-11-29"


@dataclass(frozen=True)
class Prices:
    """US East (N. Virginia) list prices, in dollars per unit."""

    #: DynamoDB on-demand, per write request unit (1 KB; transactions 2 per KB)
    wru: float = 0.625e-6
    #: DynamoDB on-demand, per read request unit (4 KB strongly consistent, 8 KB eventual)
    rru: float = 0.125e-6
    #: S3 Standard PUT, COPY, POST, LIST requests
    s3_put: float = 0.005e-3
    #: S3 Standard GET, HEAD and other reads
    s3_get: float = 0.0004e-3
    #: API Gateway HTTP API, per request (first 300 million a month), per 512 KB
    api: float = 1.00e-6
    #: Lambda arm64, per invocation
    lambda_request: float = 0.20e-6
    #: Lambda arm64, per GB-second
    lambda_gb_s: float = 0.0000133334
    #: DynamoDB Standard table class, per GB-month stored (indexes included)
    ddb_gb_month: float = 0.25
    #: DynamoDB continuous backups (point-in-time recovery, on in template.yaml), per GB-month
    ddb_pitr_gb_month: float = 0.20
    #: S3 Standard, per GB-month stored
    s3_gb_month: float = 0.023
    #: CloudWatch Logs, per GB ingested (standard class)
    logs_gb: float = 0.50
    #: SQS standard, per request (64 KB chunk)
    sqs: float = 0.40e-6


PRICES = Prices()
#: Lambda memory the estimate assumes (GB)
LAMBDA_GB = 0.25
#: assumed round trip of one DynamoDB or S3 request from a Lambda in the same region (s)
AWS_LATENCY = 0.006
#: CloudWatch Logs bytes one API invocation writes (an estimate: Lambda's START, END and
#: REPORT lines, and the handler's metrics line in embedded metric format)
LOG_BYTES_PER_INVOCATION = 700
#: HTTP APIs meter requests in increments of this many bytes
API_METER_BYTES = 512 * 1024
#: S3 operations billed at the PUT rate, and those that are free; the rest are GETs
_S3_PUT_CLASS = frozenset({"PutObject", "CopyObject", "ListObjectsV2", "ListObjects", "PostObject"})
_S3_FREE = frozenset({"DeleteObject", "DeleteObjects"})
#: plane defaults the storage estimate assumes: results kept 7 days, then a 30-day tombstone
RETENTION_DAYS = 7.0
TOMBSTONE_DAYS = 30.0
#: DynamoDB TTL deletes "typically within two days" of the TTL time
TTL_LAG_DAYS = 2.0


# --- DynamoDB units ----------------------------------------------------------------------


def _number_size(text: str) -> int:
    """Bytes of a DynamoDB number: about one per two significant digits, plus one."""
    digits = text.lstrip("-").replace(".", "").lstrip("0").rstrip("0")
    return (len(digits) + 1) // 2 + 1


def value_size(av: Mapping[str, Any]) -> int:
    """Bytes of one AttributeValue, as DynamoDB sizes items."""
    ((kind, value),) = av.items()
    if kind == "S":
        return len(str(value).encode())
    if kind == "B":
        return len(value)
    if kind == "N":
        return _number_size(str(value))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in value)
    if kind == "NS":
        return sum(_number_size(n) for n in value)
    if kind == "BS":
        return sum(len(b) for b in value)
    if kind == "L":
        return 3 + sum(1 + value_size(v) for v in value)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + value_size(v) for k, v in value.items())
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: Mapping[str, Any] | None) -> int:
    """Bytes of an item: names and values."""
    if not item:
        return 0
    return sum(len(name.encode()) + value_size(av) for name, av in item.items())


def _kb(size: int) -> int:
    return max(1, math.ceil(size / 1024))


@dataclass(frozen=True)
class Index:
    name: str
    keys: tuple[str, ...]
    #: None: every attribute (ALL); else the projected non-key attributes
    projected: frozenset[str] | None


@dataclass(frozen=True)
class Table:
    name: str
    keys: tuple[str, ...]
    indexes: tuple[Index, ...]

    def key_of(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return {k: item[k] for k in self.keys}

    def entry(self, index: Index, item: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The index entry an item has (None: it is not in the sparse index)."""
        if item is None or any(k not in item for k in index.keys):
            return None
        if index.projected is None:
            return dict(item)
        wanted = set(self.keys) | set(index.keys) | index.projected
        return {k: v for k, v in item.items() if k in wanted}


#: bytes DynamoDB adds to every index entry when it sizes it
INDEX_ENTRY_OVERHEAD = 100


def entry_size(entry: Mapping[str, Any]) -> int:
    return item_size(entry) + INDEX_ENTRY_OVERHEAD


def write_units(
    table: Table,
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    *,
    transactional: bool = False,
    applied: bool = True,
) -> dict[str, int]:
    """Write request units of one item write: the table's (the larger of the item before
    and after, per KB; twice in a transaction) and each index's entry writes (an entry
    added, changed or removed is one write per KB; a changed key is a remove and an
    add). A refused conditional write bills the item's size and touches no index."""
    units = {table.name: _kb(max(item_size(old), item_size(new))) * (2 if transactional else 1)}
    if not applied:
        return units
    for index in table.indexes:
        before, after = table.entry(index, old), table.entry(index, new)
        if before == after:
            continue
        cost = 0
        same_key = (
            before is not None
            and after is not None
            and all(before[k] == after[k] for k in index.keys)
        )
        if same_key and after is not None:
            cost = _kb(entry_size(after))
        else:
            cost = (_kb(entry_size(before)) if before else 0) + (
                _kb(entry_size(after)) if after else 0
            )
        units[f"{table.name}.{index.name}"] = cost
    return units


def read_units(sizes: Sequence[int], *, consistent: bool, per_item: bool) -> float:
    """Read request units: 4 KB a unit strongly consistent, half that eventually; a
    Query or Scan rounds the sum of what it read, a GetItem or BatchGet each item."""
    factor = 1.0 if consistent else 0.5
    if per_item:
        return sum(math.ceil(max(s, 1) / 4096) for s in sizes) * factor or factor
    return max(1, math.ceil(sum(sizes) / 4096)) * factor


# --- the meter ---------------------------------------------------------------------------


@dataclass
class Figures:
    """What a piece of work cost, summed."""

    requests: Counter[str] = field(default_factory=Counter)
    wru: Counter[str] = field(default_factory=Counter)
    rru: float = 0.0
    api: float = 0
    api_metered: float = 0
    lambda_seconds: float = 0.0
    #: byte-days held in DynamoDB and S3 (the storage estimate)
    ddb_byte_days: float = 0.0
    s3_byte_days: float = 0.0

    def add(self, other: Figures) -> None:
        self.requests.update(other.requests)
        self.wru.update(other.wru)
        self.rru += other.rru
        self.api += other.api
        self.api_metered += other.api_metered
        self.lambda_seconds += other.lambda_seconds
        self.ddb_byte_days += other.ddb_byte_days
        self.s3_byte_days += other.s3_byte_days

    def scaled(self, by: float) -> Figures:
        out = Figures(
            Counter({k: v / by for k, v in self.requests.items()}),
            Counter({k: v / by for k, v in self.wru.items()}),
            self.rru / by,
            self.api / by,
            self.api_metered / by,
            self.lambda_seconds / by,
            self.ddb_byte_days / by,
            self.s3_byte_days / by,
        )
        return out

    @property
    def write_units(self) -> float:
        return float(sum(self.wru.values()))

    def s3(self, kind: str) -> float:
        ops = {k.split(".", 1)[1]: v for k, v in self.requests.items() if k.startswith("s3.")}
        if kind == "put":
            return float(sum(v for k, v in ops.items() if k in _S3_PUT_CLASS))
        return float(sum(v for k, v in ops.items() if k not in _S3_PUT_CLASS | _S3_FREE))

    def dollars(self, p: Prices = PRICES) -> dict[str, float]:
        """Dollars by line item."""
        return {
            "dynamodb": self.write_units * p.wru + self.rru * p.rru,
            "s3": self.s3("put") * p.s3_put + self.s3("get") * p.s3_get,
            "api": self.api_metered * p.api,
            "lambda": self.api * p.lambda_request + self.lambda_seconds * LAMBDA_GB * p.lambda_gb_s,
            "logs": self.api * LOG_BYTES_PER_INVOCATION / 1e9 * p.logs_gb,
            "storage": (
                self.ddb_byte_days * (p.ddb_gb_month + p.ddb_pitr_gb_month)
                + self.s3_byte_days * p.s3_gb_month
            )
            / 1e9
            / 30.4,
        }


class Meter:
    """Counts the requests made through some boto3 clients, and their DynamoDB units.

    ``peek`` and ``peek_s3`` are uncounted clients on the same tables and bucket: ``peek``
    reads each written item before and after the write, so write units follow from the
    item sizes; both measure what is stored.
    """

    def __init__(self, peek: Any, peek_s3: Any) -> None:
        self.peek = peek
        self.peek_s3 = peek_s3
        self.figures = Figures()
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()
        #: seconds spent inside AWS requests, per thread (the handler subtracts it)
        self._aws_time = threading.local()
        self.enabled = True

    def attach(self, *clients: Any) -> None:
        for client in clients:
            client.meta.events.register("before-parameter-build", self._before)
            client.meta.events.register("after-call", self._after)

    def detach(self, *clients: Any) -> None:
        for client in clients:
            client.meta.events.unregister("before-parameter-build", self._before)
            client.meta.events.unregister("after-call", self._after)

    @contextmanager
    def measure(self) -> Iterator[Figures]:
        """The figures of the work inside the block (the meter keeps counting after)."""
        start = Figures()
        start.add(self.figures)
        got = Figures()
        yield got
        got.add(self.figures)
        got.requests.subtract(start.requests)
        got.wru.subtract(start.wru)
        got.requests, got.wru = +got.requests, +got.wru
        got.rru -= start.rru
        got.api -= start.api
        got.api_metered -= start.api_metered
        got.lambda_seconds -= start.lambda_seconds

    def aws_seconds(self) -> float:
        """Seconds this thread has spent inside counted AWS requests."""
        return float(getattr(self._aws_time, "total", 0.0))

    def aws_requests(self) -> int:
        """Counted AWS requests this thread has made."""
        return int(getattr(self._aws_time, "calls", 0))

    # --- tables --------------------------------------------------------------------
    def table(self, name: str) -> Table:
        if name not in self._tables:
            desc = self.peek.describe_table(TableName=name)["Table"]
            indexes = tuple(
                Index(
                    gsi["IndexName"],
                    tuple(k["AttributeName"] for k in gsi["KeySchema"]),
                    None
                    if gsi["Projection"]["ProjectionType"] == "ALL"
                    else frozenset(gsi["Projection"].get("NonKeyAttributes", ())),
                )
                for gsi in desc.get("GlobalSecondaryIndexes", ())
            )
            keys = tuple(k["AttributeName"] for k in desc["KeySchema"])
            self._tables[name] = Table(name, keys, indexes)
        return self._tables[name]

    def _get(self, table: str, key: Mapping[str, Any]) -> dict[str, Any] | None:
        out = self.peek.get_item(TableName=table, Key=dict(key), ConsistentRead=True)
        item: dict[str, Any] | None = out.get("Item")
        return item

    # --- hooks -----------------------------------------------------------------------
    def _writes(self, op: str, params: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
        """(table, key, transactional) of every item a write request touches."""
        if op in ("PutItem", "UpdateItem", "DeleteItem"):
            table = self.table(params["TableName"])
            key = params["Key"] if "Key" in params else table.key_of(params["Item"])
            return [(table.name, dict(key), False)]
        out: list[tuple[str, dict[str, Any], bool]] = []
        if op == "TransactWriteItems":
            for action in params["TransactItems"]:
                ((_, body),) = action.items()
                table = self.table(body["TableName"])
                key = body["Key"] if "Key" in body else table.key_of(body["Item"])
                out.append((table.name, dict(key), True))
        elif op == "BatchWriteItem":
            for name, requests in params["RequestItems"].items():
                table = self.table(name)
                for r in requests:
                    body = r.get("PutRequest") or r["DeleteRequest"]
                    key = body["Key"] if "Key" in body else table.key_of(body["Item"])
                    out.append((name, dict(key), False))
        return out

    def _before(
        self, params: Mapping[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        if not self.enabled:
            return
        context["meter.t0"] = time.perf_counter()
        context["meter.params"] = dict(params)
        if model.service_model.service_name == "dynamodb":
            writes = self._writes(model.name, params)
            context["meter.old"] = [(t, k, tx, self._get(t, k)) for t, k, tx in writes]

    def _after(
        self, parsed: Mapping[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        if "meter.t0" not in context:
            return
        spent = time.perf_counter() - context["meter.t0"]
        self._aws_time.total = self.aws_seconds() + spent
        self._aws_time.calls = self.aws_requests() + 1
        service = model.service_model.service_name
        params: dict[str, Any] = context["meter.params"]
        failed = "Error" in parsed
        wru: Counter[str] = Counter()
        rru = 0.0
        if service == "dynamodb":
            for table, key, tx, old in context.get("meter.old", ()):
                new = old if failed else self._get(table, key)
                wru.update(
                    write_units(self.table(table), old, new, transactional=tx, applied=not failed)
                )
            rru = self._reads(model.name, params, parsed)
        with self._lock:
            self.figures.requests[f"{service}.{model.name}"] += 1
            self.figures.wru.update(wru)
            self.figures.rru += rru

    def _reads(self, op: str, params: Mapping[str, Any], parsed: Mapping[str, Any]) -> float:
        consistent = bool(params.get("ConsistentRead"))
        if op == "GetItem":
            return read_units([item_size(parsed.get("Item"))], consistent=consistent, per_item=True)
        if op == "BatchGetItem":
            units = 0.0
            for name, request in params["RequestItems"].items():
                found = parsed.get("Responses", {}).get(name, [])
                sizes = [item_size(i) for i in found]
                sizes += [0] * (len(request["Keys"]) - len(found))  # a miss bills the minimum
                units += read_units(
                    sizes, consistent=bool(request.get("ConsistentRead")), per_item=True
                )
            return units
        if op in ("Query", "Scan"):
            return read_units(
                self._scanned_sizes(params, parsed), consistent=consistent, per_item=False
            )
        return 0.0

    def _scanned_sizes(self, params: Mapping[str, Any], parsed: Mapping[str, Any]) -> list[int]:
        """Sizes of the entries a Query or Scan read: whole index entries (or items),
        whatever it projected or filtered away."""
        table = self.table(params["TableName"])
        index = next((i for i in table.indexes if i.name == params.get("IndexName")), None)
        sizes = []
        for got in parsed.get("Items", []):
            full = (
                self._get(table.name, table.key_of(got))
                if all(k in got for k in table.keys)
                else got
            )
            if index is None:
                sizes.append(item_size(full))
            else:
                entry = table.entry(index, full) or got
                sizes.append(entry_size(entry))
        hidden = int(parsed.get("ScannedCount", 0)) - int(parsed.get("Count", 0))
        if hidden > 0:
            mean = sum(sizes) / len(sizes) if sizes else 200
            sizes += [int(mean)] * hidden
        return sizes

    # --- storage ---------------------------------------------------------------------
    def s3_bytes(self, inv_ids: Sequence[str], resources: Any) -> int:
        """Bytes the invocations hold as objects under ``inv/`` (S3)."""
        total = 0
        for inv_id in inv_ids:
            out = self.peek_s3.list_objects_v2(Bucket=resources.bucket, Prefix=f"inv/{inv_id}/")
            total += sum(int(o["Size"]) for o in out.get("Contents", []))
        return total

    def stored_items(self, inv_ids: Sequence[str], resources: Any) -> list[tuple[int, float]]:
        """(bytes with index entries, TTL time or inf) of every item holding the
        invocations: their group items and the payload and result items beside them."""
        from dreamlake.lakeshore.stores.dynamo_groups import group_key, is_part, parse_group

        table = self.table(resources.invocations)
        found: list[tuple[int, float]] = []
        parts: set[str] = set()
        for key in dict.fromkeys(group_key(i) for i in inv_ids):
            item = self._get(table.name, {"id": {"S": key}})
            if item is None:
                continue
            size = item_size(item)
            for index in table.indexes:
                entry = table.entry(index, item)
                if entry is not None:
                    size += entry_size(entry)
            found.append((size, _ttl(item)))
            g = parse_group(item)
            for slot in g.slots.values():
                parts |= {k for k in (slot.payload_at, slot.result_at) if k and is_part(k)}
        for key in sorted(parts):
            item = self._get(table.name, {"id": {"S": key}})
            if item is not None:
                found.append((item_size(item), _ttl(item)))
        return found

    def blob_bytes(self, resources: Any) -> int:
        """Bytes under ``blob/`` (content-addressed blobs, kept by a lifecycle rule)."""
        out = self.peek_s3.list_objects_v2(Bucket=resources.bucket, Prefix="blob/")
        return sum(int(o["Size"]) for o in out.get("Contents", []))


def _ttl(item: Mapping[str, Any]) -> float:
    return float(item["purge_at"]["N"]) if "purge_at" in item else math.inf


# --- the stack in one process -----------------------------------------------------------


class LocalApi:
    """API Gateway + Lambda in this process: each request becomes a v2 event for the
    handler's router (``make_app``), as API Gateway hands it to the function; presigned
    S3 URLs go to the bucket through the store's (counted) S3 client."""

    def __init__(self, service: Any, meter: Meter, s3: Any, *, step: Callable[[], None]) -> None:
        from dreamlake.lakeshore.handlers.api import make_app
        from dreamlake.lakeshore.server import thread_safe

        self.app = thread_safe(make_app(service))
        self.meter = meter
        self.s3 = s3
        self._step = step
        self._lock = threading.Lock()
        #: requests by route (method and path without ids)
        self.routes: Counter[str] = Counter()

    def call(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Any:
        from dreamlake.lakeshore.handlers import apigw
        from dreamlake.lakeshore.http.connections import Answer

        self._step()
        path, _, query = path.partition("?")
        event = apigw.http_event(method, path, query_string=query, headers=headers, body=body)
        aws_t, aws_n = self.meter.aws_seconds(), self.meter.aws_requests()
        started = time.perf_counter()
        result = self.app.resolve(event, cast(Any, None))
        spent = time.perf_counter() - started
        status, pairs, answer = apigw.http_response(result)
        aws_t = self.meter.aws_seconds() - aws_t
        aws_n = self.meter.aws_requests() - aws_n
        billed = math.ceil(((spent - aws_t) + aws_n * AWS_LATENCY) * 1000) / 1000
        metered = max(1, math.ceil(max(len(body), len(answer)) / API_METER_BYTES))
        route = " ".join((method, "/".join(p if len(p) < 20 else "{x}" for p in path.split("/"))))
        with self._lock:
            self.meter.figures.api += 1
            self.meter.figures.api_metered += metered
            self.meter.figures.lambda_seconds += billed
            self.routes[route] += 1
        return Answer(status, {k.lower(): v for k, v in pairs}, answer)

    def s3_call(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str] | None = None
    ) -> Any:
        """A presigned URL, served by (moto's) S3 through the counted client (a GET with
        ``If-None-Match`` answers 304 when the ETag still matches)."""
        from botocore.exceptions import ClientError  # type: ignore[import-untyped]

        from dreamlake.lakeshore.http.connections import Answer

        parts = urlsplit(url)
        bucket = parts.hostname.split(".s3.", 1)[0] if parts.hostname else ""
        key = unquote(parts.path.lstrip("/"))
        if method == "PUT":
            self.s3.put_object(Bucket=bucket, Key=key, Body=body or b"")
            return Answer(200, {}, b"")
        extra = {}
        etag = (headers or {}).get("If-None-Match")
        if etag:
            extra["IfNoneMatch"] = etag
        try:
            data = self.s3.get_object(Bucket=bucket, Key=key, **extra)["Body"].read()
        except ClientError as exc:
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if status in (304, 403, 404):
                return Answer(status, {}, b"")
            raise
        return Answer(200, {}, data)


def local_transport(api: LocalApi, token: str) -> Any:
    """The SDK's HTTP transport, its network replaced by :class:`LocalApi`."""
    from dreamlake.lakeshore.http.transport import HttpTransport

    class LocalTransport(HttpTransport):
        def _exchange(
            self, method: str, target: Any, body: bytes | None, headers: Any, timeout: float
        ) -> Any:
            if target.own:
                return api.call(method, target.path, headers, body or b"")
            return api.s3_call(method, self._url_of(target), body, headers)

    return LocalTransport("https://api.local", token, retries=0)


@dataclass
class Stack:
    resources: Any
    meter: Meter
    plane: Any
    api: LocalApi
    clock: Any
    token: str

    def transport(self) -> Any:
        return local_transport(self.api, self.token)


#: plane time the runs start at, and how far it moves on each API request
T0 = 1_900_000_000.0
STEP = 0.01


#: the plane keeps a succeeded invocation's payload (the default); False measures a
#: plane built with keep_payload=False (complete drops it: docs/cost.md)
KEEP_PAYLOAD = True


@contextmanager
def aws_stack(
    *, max_wait: float = 20.0, real_time: bool = False, wake: bool = True, limits: Any = None
) -> Iterator[Stack]:
    """A fresh moto account with the template's tables and bucket, the plane on the
    DynamoDB store and the API over it (``max_wait``: how long the plane may hold a
    claim or wait). The plane's clock starts at :data:`T0` and moves :data:`STEP` per
    API request, unless ``real_time`` (then it is the system clock). ``wake=False``
    takes the wake-object capability from the store (the idle rows of the designs it
    replaced: claims held inside the function, or polled). ``limits``: the API's
    (``max_wait`` is then ignored)."""
    import boto3  # type: ignore[import-untyped]

    from dreamlake.lakeshore.api import Service, bootstrap_admin
    from dreamlake.lakeshore.api.service import Limits
    from dreamlake.lakeshore.clock import FakeClock
    from dreamlake.lakeshore.infra.tables import moto_stack
    from dreamlake.lakeshore.plane import Plane
    from dreamlake.lakeshore.stores.dynamo import DynamoStore

    with moto_stack() as (resources, ddb, s3):
        region = ddb.meta.region_name
        meter = Meter(
            boto3.client("dynamodb", region_name=region), boto3.client("s3", region_name=region)
        )
        clock = FakeClock(time.time() if real_time else T0)
        store = (
            DynamoStore(resources, dynamodb=ddb, s3=s3) if wake else _no_wake(resources, ddb, s3)
        )
        plane = Plane(store, clock=clock, keep_payload=KEEP_PAYLOAD)
        token = bootstrap_admin(plane)
        assert token is not None
        limits = limits or Limits(max_wait=max_wait)
        service = Service(plane, limits=limits, server="lakeshore cost")

        def step() -> None:
            if real_time:
                clock.set(time.time())
            else:
                clock.advance(STEP)

        api = LocalApi(service, meter, s3, step=step)
        meter.attach(ddb, s3)
        try:
            yield Stack(resources, meter, plane, api, clock, token)
        finally:
            meter.detach(ddb, s3)
            plane.close()


def _no_wake(resources: Any, ddb: Any, s3: Any) -> Any:
    """The DynamoDB store without the wake-object capability (claims held or polled,
    as before it)."""
    from dreamlake.lakeshore.stores.dynamo import DynamoStore

    class NoWake(DynamoStore):
        queue_and_idle = mark_idle = wake = wake_url = None  # type: ignore[assignment]

    return NoWake(resources, dynamodb=ddb, s3=s3)


# --- the lifecycle -------------------------------------------------------------------------

PHASES = ("submit", "claim", "complete", "result", "purge")


@dataclass
class Run:
    size: int
    batch: int
    jobs: int
    phases: dict[str, Figures]
    routes: Counter[str]

    def per_job(self) -> Figures:
        total = Figures()
        for f in self.phases.values():
            total.add(f)
        return total.scaled(self.jobs)


def lifecycle(size: int, batch: int, jobs: int) -> Run:
    """Submit, claim, complete and read ``jobs`` invocations of ``size``-byte arguments
    (and results), ``batch`` to a call, through the SDK's HTTP transport."""
    from dreamlake.lakeshore.plane.model import QueueSpec, Submission
    from dreamlake.lakeshore.submit import IdGroups
    from dreamlake.lakeshore.wire import encode_pickle_call, result_blob
    from dreamlake.lakeshore.worker.execute import Executor

    with aws_stack() as stack:
        producer, worker, reader = stack.transport(), stack.transport(), stack.transport()
        queue = "bench"
        producer.ensure_queue(QueueSpec(queue))
        executor = Executor(worker)
        uploaded: set[str] = set()

        def upload(t: Any, blobs: Mapping[str, bytes]) -> None:  # Dispatch.upload
            new = [d for d in blobs if d not in uploaded]
            if new:
                for d in t.missing_blobs(new):
                    t.put_blob(d, blobs[d])
                uploaded.update(new)

        def one_round(n: int, figures: dict[str, Figures] | None) -> list[str]:
            def phase(name: str) -> Any:
                if figures is None:
                    return contextlib_null()
                return _into(stack.meter, figures[name])

            limit = producer.inline_limit()
            calls = [
                encode_pickle_call(bytes, (os.urandom(size),), {}, inline_limit=limit)
                for _ in range(n)
            ]
            with phase("submit"):
                upload(producer, {d: b for c in calls for d, b in c.blobs.items()})
                groups = IdGroups()  # ids as the SDK's batch and the API make them
                subs = [Submission(groups.next_id(queue), queue, c.payload) for c in calls]
                ids: list[str] = producer.submit(subs)
            with phase("claim"):
                claims: list[Any] = []
                while len(claims) < n:
                    claims += worker.claim([queue], "w", limit=n - len(claims))
            with phase("complete"):
                outcomes = [executor.run(c) for c in claims]
                assert all(o.ok for o in outcomes), outcomes
                upload(worker, {d: b for o in outcomes for d, b in o.blobs.items()})
                worker.complete_many(
                    [
                        (c.id, c.lease_token, o.result or b"")
                        for c, o in zip(claims, outcomes, strict=True)
                    ]
                )
            with phase("result"):
                done: list[Any] = []
                reader.watch(ids, done.append)
                assert len(done) == n
                for rec in done:
                    ref = result_blob(rec.result)
                    if ref is not None:
                        reader.get_blob(ref)
            return ids

        warm = one_round(1, None)  # warm-up: hellos, the function body's blob, first touches
        stack.api.routes.clear()
        phases = {p: Figures() for p in PHASES}
        ids: list[str] = []
        blobs_before = stack.meter.blob_bytes(stack.resources)
        done_jobs = 0
        while done_jobs < jobs:
            n = min(batch, jobs - done_jobs)
            ids += one_round(n, phases)
            done_jobs += n
        # storage: each item holding the records (group, payload and result items) from
        # now until its TTL time plus TTL's lag (one with no TTL: to the tombstone's end);
        # objects in S3 until purge deletes them at expiry
        now = stack.clock.now()
        horizon = now + (RETENTION_DAYS + TOMBSTONE_DAYS) * 86400
        ddb_byte_days = sum(
            size * ((min(ttl, horizon) - now) / 86400 + TTL_LAG_DAYS)
            for size, ttl in stack.meter.stored_items(ids, stack.resources)
        )
        s3_full = stack.meter.s3_bytes(ids, stack.resources)
        blob_bytes = stack.meter.blob_bytes(stack.resources) - blobs_before
        purged = Figures()
        with _into(stack.meter, purged):
            stack.clock.advance(RETENTION_DAYS * 86400 + 1)
            stack.plane.sweep()
            stack.clock.advance(TOMBSTONE_DAYS * 86400)
            stack.plane.sweep()
        # the warm-up job was purged too: its share is not the runs'
        phases["purge"].add(purged.scaled((len(ids) + len(warm)) / len(ids)))
        store = phases["purge"]
        store.ddb_byte_days += ddb_byte_days
        store.s3_byte_days += s3_full * RETENTION_DAYS + blob_bytes * 30.0
        return Run(size, batch, jobs, phases, Counter(stack.api.routes))


@contextmanager
def _into(meter: Meter, into: Figures) -> Iterator[None]:
    with meter.measure() as got:
        yield
    into.add(got)


@contextmanager
def contextlib_null() -> Iterator[None]:
    yield


# --- an idle worker ----------------------------------------------------------------------


def idle_worker(max_wait: float, seconds: float, *, max_idle_wait: float = 2.0) -> Figures:
    """A day of an idle process worker, from ``seconds`` of one: the claim loop of
    ``worker/pool.py`` with nothing running (each empty claim doubles the wait, from
    0.05 s up to ``max_idle_wait``), against a plane that holds a claim at most
    ``max_wait`` seconds."""
    from dreamlake.lakeshore.plane.model import QueueSpec

    with aws_stack(max_wait=max_wait, real_time=True, wake=False) as stack:
        worker = stack.transport()
        worker.ensure_queue(QueueSpec("idle"))
        stop = threading.Event()
        backoff = 0.0

        def idle_for(duration: float) -> None:
            nonlocal backoff
            deadline = time.monotonic() + duration
            while time.monotonic() < deadline:
                wait = min(backoff, max_idle_wait)
                claims = worker.claim(
                    ["idle"], "w", limit=1, wait=wait, lease_seconds=60, should_stop=stop.is_set
                )
                assert not claims
                backoff = min(max(0.05, backoff * 2), max_idle_wait)

        idle_for(2 * max_idle_wait)  # the backoff's ramp, and the plane's first sweeps
        with stack.meter.measure() as got:
            started = time.monotonic()
            idle_for(seconds)
            elapsed = time.monotonic() - started
        return got.scaled(elapsed / 86400)


def idle_polls(interval: float, *, via_api: bool = True, polls: int = 30) -> Figures:
    """A day of a worker that asks for work every ``interval`` seconds with a claim
    that does not wait (the plane's ``max_wait`` 0, the backoff on the client):
    ``polls`` claims on the plane's clock, scaled to a day. ``via_api=False`` is a
    worker in AWS on ``aws://`` (the plane core in the worker, no API, no Lambda)."""
    from dreamlake.lakeshore.plane.model import QueueSpec

    with aws_stack(max_wait=0.0, wake=False) as stack:
        worker = stack.transport() if via_api else stack.plane
        worker.ensure_queue(QueueSpec("idle"))

        def poll() -> None:
            stack.clock.advance(interval - (STEP if via_api else 0.0))
            assert not worker.claim(["idle"], "w", limit=1, wait=0.0)

        for _ in range(3):
            poll()
        with stack.meter.measure() as got:
            for _ in range(polls):
                poll()
        return got.scaled(polls * interval / 86400)


def idle_wake(*, pickups: int = 5) -> tuple[Figures, list[float]]:
    """A day of an idle process worker on a plane with wake objects (the template's
    settings: ``Limits.wake_interval`` and ``wake_fallback``), and its pickup latency.

    The worker runs ``worker/pool.py``'s claim loop (claims of ``max_idle_wait`` 2 s
    with a stop flag) on real time. Counted: one fallback period, from the loop's first
    (empty) claim on, which starts the watch, through its S3 looks, scaled to a day. Then
    ``pickups`` times: a submit at a random moment of an idle period, and the seconds
    until the worker's claim returns it."""
    import random

    from dreamlake.lakeshore.api.service import Limits
    from dreamlake.lakeshore.plane.model import QueueSpec, Submission
    from dreamlake.lakeshore.submit import new_id
    from dreamlake.lakeshore.wire import encode_ref_call, encode_result

    limits = Limits()
    with aws_stack(real_time=True, limits=limits) as stack:
        worker, producer = stack.transport(), stack.transport()
        worker.ensure_queue(QueueSpec("idle"))
        stop = threading.Event()
        claimed: list[float] = []

        def loop() -> None:
            while not stop.is_set():
                got = worker.claim(
                    ["idle"], "w", limit=1, wait=2.0, lease_seconds=60, should_stop=stop.is_set
                )
                if got:
                    claimed.append(time.monotonic())
                    worker.complete(got[0].id, got[0].lease_token, encode_result(None)[0])

        # another client marks the queue idle first: the worker's first claim is then
        # the steady state's claim (the mark set already, the object's ETag read)
        assert not producer.claim(["idle"], "p", limit=1, wait=0.0)
        worker.hello()  # once per process, not per period
        with stack.meter.measure() as got:  # one period: its claim, then its S3 looks
            fetcher = threading.Thread(target=loop)
            fetcher.start()
            time.sleep(limits.wake_fallback - 0.5)
            assert worker._wakes, "the worker watches"
        day = got.scaled((limits.wake_fallback - 0.5) / 86400)
        latencies = []
        payload = encode_ref_call("math:sqrt", (4.0,), {}).payload
        for _ in range(pickups):
            time.sleep(random.uniform(0.0, limits.wake_interval))
            before = len(claimed)
            submitted = time.monotonic()
            producer.submit([Submission(new_id(), "idle", payload)])
            while len(claimed) == before:
                time.sleep(0.01)
            latencies.append(claimed[-1] - submitted)
        stop.set()
        fetcher.join()
        return day, latencies


def idle_sweep() -> Figures:
    """One sweep of an idle plane (what a scheduled sweeper does each time it runs)."""
    from dreamlake.lakeshore.plane.model import QueueSpec

    with aws_stack() as stack:
        stack.plane.ensure_queue(QueueSpec("idle"))
        stack.plane.sweep()
        with stack.meter.measure() as got:
            stack.clock.advance(60)
            stack.plane.sweep()
        return got


# --- the tables ----------------------------------------------------------------------------


def _size(n: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def _usd(x: float) -> str:
    return f"{x:.2f}" if x >= 0.095 else f"{x:.3f}"


def cost_table(runs: Sequence[Run]) -> str:
    """Per job: requests and units, then dollars per million jobs by line item."""
    head = (
        "| payload | batch | DynamoDB WRU | RRU | S3 req | API req | Lambda GB-s "
        "| DynamoDB $ | S3 $ | API $ | Lambda $ | logs $ | storage $ | **total $/M** |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for run in runs:
        f = run.per_job()
        d = {k: v * 1e6 for k, v in f.dollars().items()}
        s3 = f.s3("put") + f.s3("get")
        gbs = f.lambda_seconds * LAMBDA_GB
        rows.append(
            f"| {_size(run.size)} | {run.batch} | {f.write_units:.1f} | {f.rru:.1f} | {s3:.2f} "
            f"| {f.api_metered:.2f} | {gbs:.4f} | {_usd(d['dynamodb'])} | {_usd(d['s3'])} "
            f"| {_usd(d['api'])} | {_usd(d['lambda'])} | {_usd(d['logs'])} | {_usd(d['storage'])} "
            f"| **{_usd(sum(d.values()))}** |"
        )
    sqs = 3 * PRICES.sqs * 1e6
    rows.append(
        f"| SQS standard (3 requests: send, receive, delete) | | | | | | | | | | | | | {sqs:.2f} |"
    )
    return head + "\n".join(rows) + "\n"


def phase_table(run: Run) -> str:
    """Write and read units per job by phase, and where the write units go."""
    lines = [
        "| phase | requests | write units (table / index) | read units |",
        "|---|---|---|---:|",
    ]
    for name in PHASES:
        f = run.phases[name].scaled(run.jobs)
        reqs = ", ".join(f"{k.split('.', 1)[1]} {v:.2g}" for k, v in sorted(f.requests.items()))
        wru = ", ".join(f"{k} {v:.2g}" for k, v in sorted(f.wru.items()))
        lines.append(f"| {name} | {reqs} | {wru} | {f.rru:.2f} |")
    return "\n".join(lines) + "\n"


def idle_table(days: Mapping[str, Figures]) -> str:
    head = (
        "| idle, per day | API requests | S3 requests | Lambda GB-s | DynamoDB RRU "
        "| API $ | Lambda + logs $ | DynamoDB $ | S3 $ | **total $/day** |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for name, f in days.items():
        d = f.dollars()
        s3 = f.s3("put") + f.s3("get")
        rows.append(
            f"| {name} | {f.api_metered:,.0f} | {s3:,.0f} | {f.lambda_seconds * LAMBDA_GB:,.0f} "
            f"| {f.rru:,.0f} | {d['api']:.4f} | {d['lambda'] + d['logs']:.4f} "
            f"| {d['dynamodb']:.4f} | {d['s3']:.4f} | **{sum(d.values()):.4f}** |"
        )
    return head + "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--sizes", default="100,1024,10240,1048576")
    parser.add_argument("--batches", default="1,10,100")
    parser.add_argument(
        "--idle-seconds", type=float, default=20.0, help="per held-claim row; 0 skips idle"
    )
    parser.add_argument(
        "--idle-waits", default="2,0", help="plane max_wait settings for the held-claim rows"
    )
    parser.add_argument(
        "--wake-pickups",
        type=int,
        default=5,
        help="submits to an idle queue timed on the wake-object row (0 skips the row, "
        "which runs one fallback period of real time: 120 s)",
    )
    parser.add_argument(
        "--no-keep-payload",
        action="store_true",
        help="a plane built with keep_payload=False: complete drops the payload",
    )
    args = parser.parse_args(argv)
    global KEEP_PAYLOAD
    KEEP_PAYLOAD = not args.no_keep_payload
    os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "lakeshore-cost")
    runs = [
        lifecycle(int(size), int(batch), args.jobs)
        for size in args.sizes.split(",")
        for batch in args.batches.split(",")
    ]
    print(f"## Cost per job ({args.jobs} jobs a row; list prices of {PRICES_AS_OF})\n")
    print(cost_table(runs))
    for run in runs:
        if run.batch == 1 and run.size == 1024:
            print("### 1 KB, unbatched: per job, by phase\n")
            print(phase_table(run))
    if args.idle_seconds > 0:
        print("## Idle\n")
        rows, pickups = idle_rows(args.idle_seconds, args.idle_waits.split(","), args.wake_pickups)
        print(idle_table(rows))
        if pickups:
            print(
                f"Pickup on the wake-object row (submit to an idle queue → claimed by the "
                f"worker), {len(pickups)} submits: mean {statistics.mean(pickups):.2f} s, "
                f"max {max(pickups):.2f} s.\n"
            )


def idle_rows(
    seconds: float, waits: Sequence[str], pickups: int = 5
) -> tuple[dict[str, Figures], list[float]]:
    """A day of idling for the wake-object design and the designs before it, and the
    wake row's pickup latencies."""
    from dreamlake.lakeshore.api.service import Limits

    rows: dict[str, Figures] = {}
    latencies: list[float] = []
    if pickups > 0:
        limits = Limits()
        (
            rows[
                f"HTTP API, wake objects: S3 GET every {limits.wake_interval:g} s, claim every "
                f"{limits.wake_fallback:g} s (pool.py)"
            ],
            latencies,
        ) = idle_wake(pickups=pickups)
    rows |= {
        f"HTTP API, plane max_wait {float(w):g} s, worker backoff to 2 s (pool.py)": idle_worker(
            float(w), seconds
        )
        for w in waits
    }
    for interval in (2.0, 5.0, 15.0):
        rows[f"HTTP API, max_wait 0, client-side poll every {interval:g} s"] = idle_polls(interval)
    url = idle_polls(5.0)
    url.api_metered = 0  # a Lambda function URL: no API Gateway request charge
    rows["Lambda function URL, max_wait 0, poll every 5 s"] = url
    for interval in (2.0, 5.0):
        rows[f"aws:// worker (no API, no Lambda), poll every {interval:g} s"] = idle_polls(
            interval, via_api=False
        )
    rows["the plane: scheduled sweep once a minute"] = idle_sweep().scaled(1 / 1440)
    return rows, latencies


if __name__ == "__main__":
    main()
