"""DynamoDB + S3 store: the AWS plane's :class:`~dreamlake.lakeshore.plane.store.Store`.

Tables, indexes, attributes and prefixes are named in :mod:`.keys`; the item encoding
is :mod:`.dynamo_items`. How each primitive maps onto DynamoDB:

- ``update_if`` is one conditional ``UpdateItem`` (``ReturnValues=ALL_OLD``; the new
  record is the old one with ``changes`` applied, exactly what was written). A failed
  condition returns the old item, so "refused" costs no extra read.
- ``running_below`` is a counter item per capped queue (records table, kind
  ``running``). A claim with a cap is one ``TransactWriteItems``: the invocation's
  update (conditioned on its revision, read just before) and ``ADD running 1`` on the
  counter if ``running < cap``. The claimed item is marked ``counted``; any update that
  takes a counted item out of running is refused by its plain condition
  (``attribute_not_exists(counted)``), and is then redone as a transaction with
  ``ADD running -1``. Queues without a cap never touch a counter (no hot item).
- ``pending`` reads a sparse index (``queue#shard`` → ``order_key``), filtering on
  ``available_at``; ``expired_leases`` and ``purge`` read sparse indexes keyed by lease
  expiry and ``expires_at``; ``counts``/``list_invocations`` read a by-queue index (and
  ``counts`` the pending and due indexes). No primitive scans the invocations table.
  Index reads are eventually consistent (under moto they are immediate): a candidate
  that is gone or taken fails its condition.
- expiry is DynamoDB's TTL: the finish write sets it past any tombstone and the plane
  core hides what has expired (past expiry no payload or result, past the tombstone
  nothing), so a finished record costs no further write. ``purge`` strips only
  records holding objects in S3 or job output (the expiry index has just those):
  their objects and output go, and TTL deletes the record at its tombstone's end. A
  record whose error is in S3 is deleted here then, object and all.
- payload, result and error above ``keys.INLINE_LIMITS`` go to S3 before the item is
  written; a read fetches them when first used.
- ``change_marker`` has no cheap global counterpart: it changes on every call, so
  waiters re-check every ``poll_interval`` (0.5 s).

What each request and write costs is in docs/cost.md (``benchmarks/cost.py`` counts it).

Concurrency: every decision is a condition evaluated by DynamoDB, so any number of
processes may share the tables. moto is the exception (its conditional writes are not
atomic under threads): tests serialise moto requests themselves.
"""

from __future__ import annotations

import heapq
import itertools
import math
import secrets
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from ..errors import Unavailable
from ..plane.model import FINISHED, Invocation, LogEntry, QueueSpec, State
from . import keys as K
from .dynamo_extras import DynamoExtras, backoff, error_code
from .dynamo_items import (
    FIELDS,
    Expr,
    Item,
    condition,
    holds,
    invocation,
    leaves_running,
    new_item,
    normal,
    num,
    pack,
    plan_changes,
    unpack,
)

__all__ = [
    "LAMBDA_ATTEMPTS",
    "LAMBDA_CONNECT_TIMEOUT",
    "LAMBDA_READ_TIMEOUT",
    "DynamoStore",
    "lambda_client_config",
    "make_clients",
    "worst_case_seconds",
]

_FIELD_SET = frozenset(FIELDS)
#: what a pending index entry carries (None: whole items, a projection of ALL)
_PENDING_CARRIED = (
    None
    if K.PENDING_INDEX_ATTRS is None
    else frozenset({"id", K.PENDING_PK, "order_key", *K.PENDING_INDEX_ATTRS})
)
#: attempts at one update under contention (a transaction conflict, a moving revision)
_TRIES = 25
#: the longest a presigned URL may live (S3's limit)
_MAX_WAKE_TTL = 7 * 86400
#: ids a handle remembers having marked as having output (then forgets them all)
_LOGGED_MEMORY = 10_000


#: inside a Lambda function behind API Gateway (29 s to answer): attempts per request
#: (the first included), and seconds to connect and to wait for an answer. A request
#: that keeps failing gives up after worst_case_seconds() (under 20 s), leaving the
#: function time to answer 503 instead of being cut off. DynamoDB answers in
#: milliseconds; S3 PUTs through the API are at most a few MB.
LAMBDA_ATTEMPTS = 3
LAMBDA_CONNECT_TIMEOUT = 1.0
LAMBDA_READ_TIMEOUT = 4.0
#: botocore's standard mode sleeps rand(0, 1) * min(2 ** (n - 1), 20) s before retry n
_MAX_BACKOFF = 20.0


def lambda_client_config() -> Any:
    """The botocore ``Config`` for the store's clients inside a Lambda function (pass
    it to :func:`make_clients`): few attempts and short timeouts, so a request that
    keeps failing ends well inside the function's timeout."""
    from botocore.config import Config  # type: ignore[import-untyped]

    return Config(
        retries={"mode": "standard", "total_max_attempts": LAMBDA_ATTEMPTS},
        connect_timeout=LAMBDA_CONNECT_TIMEOUT,
        read_timeout=LAMBDA_READ_TIMEOUT,
    )


def worst_case_seconds(config: Any) -> float:
    """The longest one request can take under ``config`` before botocore gives up:
    every attempt times out connecting and reading, with the longest backoff between."""
    retries = config.retries or {}
    if "total_max_attempts" in retries:
        attempts = int(retries["total_max_attempts"])
    else:
        attempts = int(retries.get("max_attempts", 4)) + 1
    per_attempt = float(config.connect_timeout) + float(config.read_timeout)
    backoff = sum(min(2.0 ** (n - 1), _MAX_BACKOFF) for n in range(1, attempts))
    return attempts * per_attempt + backoff


def make_clients(
    region_name: str | None = None,
    endpoint_url: str | None = None,
    session: Any = None,
    *,
    config: Any = None,
) -> tuple[Any, Any]:
    """A DynamoDB and an S3 client as the store wants them (S3 signs with SigV4).

    ``config``: a botocore ``Config`` for both (timeouts, retries), e.g.
    :func:`lambda_client_config` inside a Lambda function; by default standard
    retries (6 attempts) and botocore's timeouts, for long-running processes."""
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config

    base = config or Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5)
    # path-style addressing when the endpoint is a local one (moto server)
    style = "path" if endpoint_url else "virtual"
    s3_config = base.merge(Config(signature_version="s3v4", s3={"addressing_style": style}))
    maker = session or boto3
    ddb = maker.client("dynamodb", region_name=region_name, endpoint_url=endpoint_url, config=base)
    s3 = maker.client("s3", region_name=region_name, endpoint_url=endpoint_url, config=s3_config)
    return ddb, s3


def _own_write(exc: Exception, item: Item, inv_id: str, changes: Mapping[str, Any]) -> bool:
    """Whether a refused update was refused because of itself: botocore retried it
    after a first attempt whose answer was lost, and every change is in place.

    (A transaction is safe without this: botocore gives it a ClientRequestToken, so
    its retry is recognised by DynamoDB.)
    """
    metadata = getattr(exc, "response", {}).get("ResponseMetadata", {})
    return (
        bool(changes)
        and metadata.get("RetryAttempts", 0) > 0
        and holds(item, inv_id, changes, None)
    )


def _spec(item: Item) -> QueueSpec:
    return QueueSpec(name=item[K.Q_NAME]["S"], **unpack(item[K.Q_SPEC]["B"]))


class DynamoStore(DynamoExtras):
    """A :class:`~dreamlake.lakeshore.plane.store.Store` on DynamoDB and S3.

    ``resources`` names the tables and bucket (:meth:`keys.Resources.from_env` in a
    deployed stack). Clients are made with :func:`make_clients` unless given; a given S3
    client must sign with ``s3v4`` for :meth:`blob_url`.
    """

    #: every handle on the same tables sees every write
    shared = True
    #: no change feed: waiters re-check this often
    poll_interval = 0.5

    def __init__(
        self,
        resources: K.Resources | None = None,
        *,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        dynamodb: Any = None,
        s3: Any = None,
        blob_refresh_after: float | None = K.BLOB_REFRESH_AFTER,
    ) -> None:
        self.resources = resources or K.Resources()
        self._owns_clients = dynamodb is None or s3 is None
        if dynamodb is None or s3 is None:
            made_ddb, made_s3 = make_clients(region_name, endpoint_url)
            dynamodb, s3 = dynamodb or made_ddb, s3 or made_s3
        self._ddb = dynamodb
        self._s3 = s3
        self._blob_refresh_after = blob_refresh_after
        self._marker = itertools.count(1)
        self._logged: set[str] = set()
        r = self.resources
        self._queues, self._invocations, self._records = r.queues, r.invocations, r.records
        self._logs, self._bucket = r.logs, r.bucket

    # --- queues -------------------------------------------------------------------------
    def put_queue(self, spec: QueueSpec, now: float) -> QueueSpec:
        item = {
            K.Q_NAME: {"S": spec.name},
            K.Q_SPEC: {"B": pack(spec.settings())},
            K.Q_CREATED: num(now),
            K.Q_ACTIVITY: num(now),
            K.Q_CLAIMS: {"N": "0"},
        }
        try:
            self._ddb.put_item(
                TableName=self._queues,
                Item=item,
                ConditionExpression="attribute_not_exists(#n)",
                ExpressionAttributeNames={"#n": K.Q_NAME},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException" or "Item" not in exc.response:
                raise
            return _spec(exc.response["Item"])
        return spec

    def get_queue(self, name: str) -> QueueSpec | None:
        """Read eventually consistently (half a read unit: every claim and submit reads
        the spec), strongly only when that finds nothing, so a queue created a moment
        ago is found. A changed spec may be read as it was for about a second."""
        return self._queue_read(name)[0]

    # --- wake objects (plane.store.WakeObjects) -------------------------------------------
    def queue_and_idle(self, name: str) -> tuple[QueueSpec | None, bool]:
        """The spec and the idle mark, read as :meth:`get_queue` reads (the same read).

        An eventually consistent read may miss a mark set a moment ago: that submit
        wakes no one, and the idle workers find its work at their next fallback claim
        (the claim that set the mark looks for work once more after setting it, which
        narrows the window to a submit read and written within that claim)."""
        return self._queue_read(name)

    def _queue_read(self, name: str) -> tuple[QueueSpec | None, bool]:
        key = {K.Q_NAME: {"S": name}}
        for consistent in (False, True):
            out = self._ddb.get_item(TableName=self._queues, Key=key, ConsistentRead=consistent)
            if "Item" in out:
                return _spec(out["Item"]), K.Q_IDLE in out["Item"]
        return None, False

    def mark_idle(self, name: str, now: float) -> str | None:
        """Set the mark unless it is set (a refused condition when it is: one write
        unit); then the object's ETag: written now if the mark is new, else read (HEAD),
        written if missing."""
        newly = self._update_queue(
            name,
            "SET #i = :t",
            "attribute_exists(#k) AND attribute_not_exists(#i)",
            {"#i": K.Q_IDLE},
            {":t": num(now)},
        )
        if not newly:
            if self._queue_read(name)[0] is None:
                return None
            try:
                head = self._s3.head_object(Bucket=self._bucket, Key=K.wake_key(name))
                return str(head["ETag"])
            except ClientError as exc:
                if error_code(exc) not in ("404", "NoSuchKey", "NotFound"):
                    raise
        return self._put_wake(name)

    def wake(self, name: str, *, created: bool = False) -> bool:
        woke = created or self._update_queue(
            name, "REMOVE #i", "attribute_exists(#i)", {"#i": K.Q_IDLE}, {}
        )
        if woke:
            self._put_wake(name)
        return woke

    def wake_url(self, name: str, ttl: int) -> str:
        """A presigned GET (SigV4) of ``wake/<name>``; it stops working early if the
        signing credentials (a Lambda role's) expire first: a worker then claims."""
        if not 0 < ttl <= _MAX_WAKE_TTL:
            raise ValueError(f"a presigned URL lives 1 s to 7 days, not {ttl!r} s")
        url: str = self._s3.generate_presigned_url(
            "get_object",
            Params={"Bucket": self._bucket, "Key": K.wake_key(name)},
            ExpiresIn=int(ttl),
            HttpMethod="GET",
        )
        return url

    def _put_wake(self, name: str) -> str:
        """Write the wake object with new content (so a new ETag); return the ETag."""
        body = f"{time.time_ns()} {secrets.token_hex(8)}\n".encode()
        out = self._s3.put_object(
            Bucket=self._bucket, Key=K.wake_key(name), Body=body, ContentType="text/plain"
        )
        return str(out["ETag"])

    def list_queues(self) -> list[tuple[QueueSpec, float]]:
        # The queues table holds one small item per queue: a scan is the listing.
        items = self._pages(self._ddb.scan, TableName=self._queues, ConsistentRead=True)
        found = [(_spec(i), float(i[K.Q_ACTIVITY]["N"])) for i in items]
        return sorted(found, key=lambda pair: pair[0].name)

    def replace_queue(self, spec: QueueSpec, now: float) -> bool:
        return self._update_queue(
            spec.name,
            "SET #s = :s, #a = :a",
            "attribute_exists(#k)",
            {"#s": K.Q_SPEC, "#a": K.Q_ACTIVITY},
            {":s": {"B": pack(spec.settings())}, ":a": num(now)},
        )

    def delete_queue(self, name: str, *, invocations: bool = True) -> int:
        gone = 0
        if invocations:
            for page in self._queue_index_pages(name, ["id", *K.OFFLOAD_REFS.values()]):
                self._delete_items(self._invocations, [{"id": i["id"]} for i in page])
                self._delete_objects(
                    i[r]["S"] for i in page for r in K.OFFLOAD_REFS.values() if r in i
                )
                self._delete_logs(i["id"]["S"] for i in page)
                gone += len(page)
            self._ddb.delete_item(TableName=self._records, Key=K.running_key(name))
        self._ddb.delete_item(TableName=self._queues, Key={K.Q_NAME: {"S": name}})
        self._delete_objects([K.wake_key(name)])
        return gone

    def touch_queue(self, name: str, now: float) -> None:
        self._update_queue(
            name,
            "SET #a = :a",
            "attribute_exists(#k) AND #a < :a",
            {"#a": K.Q_ACTIVITY},
            {":a": num(now)},
        )

    def queue_counter(self, name: str, add: int) -> int:
        key = {K.Q_NAME: {"S": name}}
        if add == 0:  # a read: no write units for Boltzmann's temperature look-ups
            out = self._ddb.get_item(TableName=self._queues, Key=key, ConsistentRead=True)
            return int(out["Item"][K.Q_CLAIMS]["N"]) if "Item" in out else 0
        try:
            out = self._ddb.update_item(
                TableName=self._queues,
                Key=key,
                UpdateExpression="ADD #c :add",
                ConditionExpression="attribute_exists(#k)",
                ExpressionAttributeNames={"#c": K.Q_CLAIMS, "#k": K.Q_NAME},
                ExpressionAttributeValues={":add": num(int(add))},
                ReturnValues="UPDATED_NEW",
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return 0
            raise
        return int(out["Attributes"][K.Q_CLAIMS]["N"])

    def _update_queue(
        self, name: str, update: str, cond: str, names: dict[str, str], values: dict[str, Any]
    ) -> bool:
        params: dict[str, Any] = {"ExpressionAttributeValues": values} if values else {}
        names = {**names, "#k": K.Q_NAME} if "#k" in cond or "#k" in update else names
        try:
            self._ddb.update_item(
                TableName=self._queues,
                Key={K.Q_NAME: {"S": name}},
                UpdateExpression=update,
                ConditionExpression=cond,
                ExpressionAttributeNames=names,
                **params,
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    # --- invocations: insert and read ------------------------------------------------
    def insert(self, inv: Invocation) -> Invocation | None:
        item, uploads = new_item(inv)
        self._upload(uploads)
        try:
            self._ddb.put_item(
                TableName=self._invocations,
                Item=item,
                ConditionExpression="attribute_not_exists(#id)",
                ExpressionAttributeNames={"#id": "id"},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            existing = exc.response.get("Item")
            self._discard(uploads, existing)
            return self._record(existing) if existing else self.get(inv.id)
        return None

    def get(self, inv_id: str) -> Invocation | None:
        item = self._item(inv_id)
        return None if item is None else self._record(item)

    def _item(self, inv_id: str) -> Item | None:
        out = self._ddb.get_item(
            TableName=self._invocations, Key={"id": {"S": inv_id}}, ConsistentRead=True
        )
        item: Item | None = out.get("Item")
        return item

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        keys = [{"id": {"S": i}} for i in dict.fromkeys(ids)]
        return [self._record(i) for i in self._batch_get(self._invocations, keys)]

    def _record(self, item: Item, carried: frozenset[str] | None = None) -> Invocation:
        """The record of an item, or of an index entry carrying only ``carried``."""
        if carried is None:
            return invocation(item, self._fetch)
        inv_id = item["id"]["S"]
        return invocation(item, self._fetch, carried=carried, load=lambda: self._item(inv_id))

    # --- invocations: compare-and-set ---------------------------------------------------
    def update_if(
        self,
        inv_id: str,
        expect: Mapping[str, Any],
        changes: Mapping[str, Any],
        *,
        running_below: int | None = None,
        deadline_after: float | None = None,
    ) -> Invocation | None:
        unknown = (set(expect) | set(changes)) - _FIELD_SET
        if unknown:
            raise ValueError(f"unknown invocation fields: {sorted(unknown)}")
        if "id" in changes or "queue" in changes:
            raise ValueError("an invocation's id and queue never change")
        if running_below is not None:
            return self._update_counted(inv_id, expect, changes, running_below, deadline_after)
        leaving = leaves_running(changes)
        uploads = plan_changes(Expr(), inv_id, changes).uploads
        self._upload(uploads)
        for attempt in range(_TRIES):
            x = Expr()
            plan = plan_changes(x, inv_id, changes)
            clauses = condition(x, inv_id, expect, deadline_after)
            if leaving:  # a counted item must give its slot back: see _update_counted
                clauses.append(f"attribute_not_exists({x.n(K.COUNTED)})")
            try:
                out = self._ddb.update_item(
                    TableName=self._invocations,
                    Key={"id": {"S": inv_id}},
                    UpdateExpression=plan.expression(x),
                    ConditionExpression=" AND ".join(clauses),
                    ReturnValues="ALL_OLD",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    **x.kwargs(),
                )
            except ClientError as exc:
                code = error_code(exc)
                if code == "TransactionConflictException":  # a capped claim holds the item
                    backoff(attempt)
                    continue
                if code != "ConditionalCheckFailedException":
                    raise
                old = exc.response.get("Item")
                if old and _own_write(exc, old, inv_id, changes):
                    return self._record(old)
                if (
                    old
                    and leaving
                    and K.COUNTED in old
                    and holds(old, inv_id, expect, deadline_after)
                ):
                    return self._update_counted(
                        inv_id, expect, changes, None, deadline_after, old, uploaded=True
                    )
                self._discard(uploads, old)
                return None
            self._purge_later(inv_id, out["Attributes"], changes, plan.refs)
            return self._applied(out["Attributes"], changes, plan.refs)
        raise Unavailable(f"update of {inv_id!r} kept conflicting; try again")

    def _update_counted(
        self,
        inv_id: str,
        expect: Mapping[str, Any],
        changes: Mapping[str, Any],
        running_below: int | None,
        deadline_after: float | None,
        old: Item | None = None,
        *,
        uploaded: bool = False,
    ) -> Invocation | None:
        """An update that moves the queue's running counter, as one transaction.

        Reads the item (unless given), checks ``expect`` here, then writes the update
        conditioned on the revision it read, together with the counter's ``ADD``
        (conditioned on ``running < running_below``). A moved revision re-reads and
        re-checks; a full counter is a refusal.
        """
        if running_below is not None and running_below <= 0:
            return None  # nothing is ever below zero running
        entering = running_below is not None and changes.get("state") == State.RUNNING
        leaving = leaves_running(changes)
        uploads = plan_changes(Expr(), inv_id, changes).uploads
        if not uploaded:
            self._upload(uploads)
        for attempt in range(_TRIES):
            if old is None:
                out = self._ddb.get_item(
                    TableName=self._invocations, Key={"id": {"S": inv_id}}, ConsistentRead=True
                )
                old = out.get("Item")
            if old is None or not holds(old, inv_id, expect, deadline_after):
                self._discard(uploads, old)
                return None
            counted = K.COUNTED in old
            delta = -1 if leaving and counted else 1 if entering and not counted else 0
            x = Expr()
            plan = plan_changes(x, inv_id, changes)
            if delta == 1:
                plan.sets.append(f"{x.n(K.COUNTED)} = {x.v({'BOOL': True})}")
            elif delta == -1:
                plan.removes.append(x.n(K.COUNTED))
            clauses = condition(x, inv_id, expect, deadline_after)
            clauses.append(f"{x.n(K.REV)} = {x.v(old[K.REV])}")
            update = {
                "TableName": self._invocations,
                "Key": {"id": {"S": inv_id}},
                "UpdateExpression": plan.expression(x),
                "ConditionExpression": " AND ".join(clauses),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                **x.kwargs(),
            }
            counter = self._counter_action(old["queue"]["S"], delta, running_below)
            try:
                if counter is None:
                    self._ddb.update_item(**update)
                else:
                    self._ddb.transact_write_items(TransactItems=[{"Update": update}, counter])
            except ClientError as exc:
                code = error_code(exc)
                if code == "ConditionalCheckFailedException":
                    old = exc.response.get("Item")
                    if old and _own_write(exc, old, inv_id, changes):
                        return self._record(old)
                    continue
                reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
                if code == "TransactionCanceledException" and reasons[:1] == [
                    "ConditionalCheckFailed"
                ]:
                    old = exc.response["CancellationReasons"][0].get("Item")
                    continue
                if code == "TransactionCanceledException" and reasons[1:2] == [
                    "ConditionalCheckFailed"
                ]:
                    self._discard(uploads, old)
                    return None  # the queue is at its cap
                if code in ("TransactionCanceledException", "TransactionConflictException"):
                    old = None
                    backoff(attempt)
                    continue
                raise
            self._purge_later(inv_id, old, changes, plan.refs)
            return self._applied(old, changes, plan.refs)
        raise Unavailable(f"update of {inv_id!r} kept conflicting; try again")

    def _counter_action(
        self, queue: str, delta: int, running_below: int | None
    ) -> dict[str, Any] | None:
        """The transaction's second action on the queue's running counter, if any."""
        if delta == 0 and running_below is None:
            return None
        action: dict[str, Any] = {"TableName": self._records, "Key": K.running_key(queue)}
        names = {"#r": K.REC_RUNNING}
        if running_below is not None:
            action["ConditionExpression"] = "attribute_not_exists(#r) OR #r < :cap"
            action["ExpressionAttributeValues"] = {":cap": num(running_below)}
        if delta == 0:
            return {"ConditionCheck": {**action, "ExpressionAttributeNames": names}}
        action["UpdateExpression"] = "ADD #r :d"
        action.setdefault("ExpressionAttributeValues", {})[":d"] = num(delta)
        return {"Update": {**action, "ExpressionAttributeNames": names}}

    def _purge_later(
        self, inv_id: str, old: Item, changes: Mapping[str, Any], refs: Mapping[str, str | None]
    ) -> None:
        """After an update that set ``expires_at``: a record that keeps S3 objects it
        already had (a payload offloaded at submit) or has job output joins the expiry
        index, so purge deletes them in time. The update itself put it there when it
        uploaded an object; a record with neither is left to TTL (no index entry)."""
        if changes.get("expires_at") is None or any(refs.values()) or K.PURGE_PK in old:
            return
        kept = [ref for f, ref in K.OFFLOAD_REFS.items() if f not in changes and ref in old]
        if kept or K.LOGGED in old:
            self._join_expiry(inv_id, float(changes["expires_at"]))

    def _join_expiry(self, inv_id: str, expires_at: float) -> None:
        """Put a finished record in the expiry index (a second, small write)."""
        try:
            self._ddb.update_item(
                TableName=self._invocations,
                Key={"id": {"S": inv_id}},
                UpdateExpression="SET #pk = :strip",
                ConditionExpression="#e = :e",
                ExpressionAttributeNames={"#pk": K.PURGE_PK, "#e": "expires_at"},
                ExpressionAttributeValues={
                    ":strip": {"S": K.strip_pk(K.expiry_shard(inv_id))},
                    ":e": num(expires_at),
                },
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise  # (failed: retried, or finished again since; that write decides)

    def append_logs(self, inv_id: str, entries: Sequence[LogEntry]) -> None:
        """Marks the record as having output first (once per handle), so purge deletes
        the output with its payload and result; then stores the entries."""
        if entries and inv_id not in self._logged:
            self._mark_logged(inv_id)
        super().append_logs(inv_id, entries)

    def _mark_logged(self, inv_id: str) -> None:
        try:
            out = self._ddb.update_item(
                TableName=self._invocations,
                Key={"id": {"S": inv_id}},
                UpdateExpression="SET #l = :t",
                ConditionExpression="attribute_exists(#id) AND attribute_not_exists(#l)",
                ExpressionAttributeNames={"#l": K.LOGGED, "#id": "id"},
                ExpressionAttributeValues={":t": {"BOOL": True}},
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
        else:
            # finished meanwhile, without seeing the mark: join the expiry index here
            new = out.get("Attributes", {})
            if "expires_at" in new and K.PURGE_PK not in new:
                self._join_expiry(inv_id, float(new["expires_at"]["N"]))
        if len(self._logged) >= _LOGGED_MEMORY:
            self._logged.clear()
        self._logged.add(inv_id)

    def _applied(
        self, old: Item, changes: Mapping[str, Any], refs: Mapping[str, str | None]
    ) -> Invocation:
        """The record after an update: the old item with ``changes`` applied. Offloaded
        objects the update replaced are deleted."""
        self._delete_objects(
            old[ref]["S"]
            for name, ref in K.OFFLOAD_REFS.items()
            if name in changes and ref in old and old[ref]["S"] != refs.get(name)
        )
        rec = self._record(old)
        for name, value in changes.items():
            setattr(rec, name, normal(name, value))
        return rec

    # --- invocations: index reads ----------------------------------------------------
    def pending(self, queue: str, now: float, limit: int) -> list[Invocation]:
        if limit <= 0:
            return []
        runs = [self._pending_shard(pk, now, limit) for pk in K.pending_pks(queue)]
        merged = heapq.merge(*runs, key=lambda item: str(item["order_key"]["S"]))
        return [self._record(i, _PENDING_CARRIED) for i in itertools.islice(merged, limit)]

    def _pending_shard(self, pk: str, now: float, limit: int) -> list[Item]:
        """The first ``limit`` due items of one pending partition, in order.

        ``Limit`` counts items read before the ``available_at`` filter, so read pages
        (doubling) until enough are due or the partition ends.
        """
        got: list[Item] = []
        kwargs: dict[str, Any] = {
            "TableName": self._invocations,
            "IndexName": K.PENDING_INDEX,
            "KeyConditionExpression": "#pk = :pk",
            # an item due on arrival keeps available_at as READY_AT (keys.py)
            "FilterExpression": "attribute_not_exists(#av) OR #av <= :now",
            "ExpressionAttributeNames": {"#pk": K.PENDING_PK, "#av": "available_at"},
            "ExpressionAttributeValues": {":pk": {"S": pk}, ":now": num(now)},
        }
        page = limit
        while len(got) < limit:
            out = self._ddb.query(**kwargs, Limit=page)
            got += out["Items"]
            if "LastEvaluatedKey" not in out:
                break
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]
            page = min(page * 2, 1000)
        return got[:limit]

    def next_available_at(self, queue: str) -> float | None:
        """The earliest available_at among the queue's pending invocations that were
        scheduled for later (the due index holds only those). One due on arrival has an
        available_at that had passed when it was written, so the answer is exact for
        every time after those: all the claim loop asks about (the future)."""
        earliest: list[float] = []
        for pk in K.pending_pks(queue):
            out = self._ddb.query(
                TableName=self._invocations,
                IndexName=K.DUE_INDEX,
                KeyConditionExpression="#pk = :pk",
                ExpressionAttributeNames={"#pk": K.PENDING_PK},
                ExpressionAttributeValues={":pk": {"S": pk}},
                Limit=1,
            )
            earliest += [float(i["available_at"]["N"]) for i in out["Items"]]
        return min(earliest, default=None)

    def expired_leases(self, now: float, limit: int) -> list[Invocation]:
        if limit <= 0:
            return []
        runs = []
        for pk in K.lease_pks():
            items = self._pages(
                self._ddb.query,
                limit=limit,
                TableName=self._invocations,
                IndexName=K.LEASES_INDEX,
                KeyConditionExpression="#pk = :pk AND #exp < :now",
                ExpressionAttributeNames={"#pk": K.LEASE_PK, "#exp": "lease_expires_at"},
                ExpressionAttributeValues={":pk": {"S": pk}, ":now": num(now)},
                Limit=limit,
            )
            runs.append(list(items))
        merged = heapq.merge(*runs, key=lambda i: float(i["lease_expires_at"]["N"]))
        ids = [i["id"]["S"] for i in itertools.islice(merged, limit)]
        # the index is eventually consistent: keep what the table says is still lapsed
        recs = [r for r in self.get_many(ids) if r.state is State.RUNNING]
        lapsed = [r for r in recs if r.lease_expires_at is not None and r.lease_expires_at < now]
        return sorted(lapsed, key=lambda r: r.lease_expires_at or 0.0)

    def running(self, queue: str) -> int:
        """The queue's running counter (one small read), which is what ``running_below``
        compares: invocations claimed under a cap that are still running."""
        out = self._ddb.get_item(
            TableName=self._records, Key=K.running_key(queue), ConsistentRead=True
        )
        item = out.get("Item") or {}
        return int(item[K.REC_RUNNING]["N"]) if K.REC_RUNNING in item else 0

    def counts(self, queue: str, now: float) -> dict[str, int]:
        # The queue's by-queue entries (~100 bytes each; the cost grows with the queue's
        # history) tell finished states apart and count the rest; pending ones are
        # counted in the pending index, scheduled ones in the due index, and running is
        # what is left. (Eventually consistent indexes: a count may lag a moment.)
        tally: Counter[str] = Counter()
        active = 0
        for page in self._queue_index_pages(queue, [K.FINAL]):
            for item in page:
                if K.FINAL in item:
                    tally[item[K.FINAL]["S"]] += 1
                else:
                    active += 1
        if active:
            waiting = sum(self._count(K.PENDING_INDEX, pk) for pk in K.pending_pks(queue))
            later = sum(self._count(K.DUE_INDEX, pk, after=now) for pk in K.pending_pks(queue))
            tally[State.SCHEDULED.value] = later
            tally[State.PENDING.value] = max(0, waiting - later)
            tally[State.RUNNING.value] = max(0, active - waiting)
        return {state: n for state, n in tally.items() if n}

    def _count(self, index: str, pk: str, *, after: float | None = None) -> int:
        """Entries of one index partition (with ``after``: due index entries due later)."""
        kwargs: dict[str, Any] = {
            "TableName": self._invocations,
            "IndexName": index,
            "Select": "COUNT",
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": K.PENDING_PK},
            "ExpressionAttributeValues": {":pk": {"S": pk}},
        }
        if after is not None:
            kwargs["KeyConditionExpression"] += " AND #av > :after"
            kwargs["ExpressionAttributeNames"]["#av"] = "available_at"
            kwargs["ExpressionAttributeValues"][":after"] = num(after)
        total = 0
        while True:
            out = self._ddb.query(**kwargs)
            total += int(out.get("Count", 0))
            if "LastEvaluatedKey" not in out:
                return total
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]

    def list_invocations(
        self, queue: str, state: str | None, now: float, after: str | None, limit: int
    ) -> list[Invocation]:
        if limit <= 0:
            return []
        x = Expr()
        key = f"{x.n('queue')} = {x.v({'S': queue})}"
        if after is not None:
            key += f" AND {x.n('id')} > {x.v({'S': after})}"
        kwargs: dict[str, Any] = {"KeyConditionExpression": key}
        if state is not None and State(state) in FINISHED:
            kwargs["FilterExpression"] = f"{x.n(K.FINAL)} = {x.v({'S': state})}"
        elif state is not None:  # the index knows only "not finished": the records tell
            kwargs["FilterExpression"] = f"attribute_not_exists({x.n(K.FINAL)})"
        found: list[Invocation] = []
        for page in self._pages(
            self._ddb.query,
            by_page=True,
            TableName=self._invocations,
            IndexName=K.QUEUE_INDEX,
            ProjectionExpression=x.n("id"),
            Limit=limit,
            **kwargs,
            **x.kwargs(),
        ):
            recs = sorted(self.get_many([i["id"]["S"] for i in page]), key=lambda r: r.id)
            found += [r for r in recs if state is None or r.public_state(now).value == state]
            if len(found) >= limit:
                break
        return found[:limit]

    def purge(self, now: float, tombstone_until: float) -> int:
        touched = 0
        tombstone = max(0.0, now - tombstone_until)
        for shard in range(K.EXPIRY_SHARDS):
            strip, bury = K.strip_pk(shard), K.bury_pk(shard)
            # past its tombstone: unstripped (purge did not run for that long), or waiting
            # with an error in S3 that goes with it
            for pk in (strip, bury):
                for entry in self._expiring(pk, "<", tombstone_until):
                    touched += self._purge_delete(entry, tombstone_until)
            for entry in self._expiring(strip, "<=", now):
                touched += self._purge_strip(entry, strip, bury, now, tombstone)
        return touched

    def _expiring(self, pk: str, op: str, when: float) -> list[Item]:
        return list(
            self._pages(
                self._ddb.query,
                TableName=self._invocations,
                IndexName=K.EXPIRY_INDEX,
                KeyConditionExpression=f"#pk = :pk AND #e {op} :t",
                ExpressionAttributeNames={"#pk": K.PURGE_PK, "#e": "expires_at"},
                ExpressionAttributeValues={":pk": {"S": pk}, ":t": num(when)},
                ProjectionExpression="id, #e",
            )
        )

    def _purge_delete(self, key: Item, tombstone_until: float) -> int:
        try:
            out = self._ddb.delete_item(
                TableName=self._invocations,
                Key={"id": key["id"]},
                ConditionExpression="#e < :t",
                ExpressionAttributeNames={"#e": "expires_at"},
                ExpressionAttributeValues={":t": num(tombstone_until)},
                ReturnValues="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return 0
            raise
        old = out.get("Attributes", {})
        self._delete_objects(old[r]["S"] for r in K.OFFLOAD_REFS.values() if r in old)
        self._delete_logs_of(key["id"]["S"])
        return 1

    def _purge_strip(self, entry: Item, strip: str, bury: str, now: float, tombstone: float) -> int:
        """Drop payload and result (and the job's output), leave the expiry index, and
        let TTL delete the record once its tombstone has passed. A record whose error is
        in S3 moves to the bury partition instead, so the object goes with it."""
        data = ("payload", "result")
        refs = [K.OFFLOAD_REFS[f] for f in data]
        removes = ", ".join(f"#d{n}" for n in range(4))
        ttl = num(math.ceil(float(entry["expires_at"]["N"]) + tombstone))
        try:
            out = self._ddb.update_item(
                TableName=self._invocations,
                Key={"id": entry["id"]},
                UpdateExpression=f"SET #ttl = :ttl REMOVE #pk, {removes} ADD #rev :one",
                ConditionExpression="#pk = :strip AND #e <= :now",
                ExpressionAttributeNames={
                    "#pk": K.PURGE_PK,
                    "#e": "expires_at",
                    "#rev": K.REV,
                    "#ttl": K.PURGE_AT,
                    **{f"#d{n}": a for n, a in enumerate([*data, *refs])},
                },
                ExpressionAttributeValues={
                    ":ttl": ttl,
                    ":strip": {"S": strip},
                    ":now": num(now),
                    ":one": {"N": "1"},
                },
                ReturnValues="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return 0
            raise
        old = out.get("Attributes", {})
        self._delete_objects(old[r]["S"] for r in refs if r in old)
        self._delete_logs_of(entry["id"]["S"])  # output goes with payload and result
        if K.OFFLOAD_REFS["error"] in old:  # rare: a second write, so others need none
            self._ddb.update_item(
                TableName=self._invocations,
                Key={"id": entry["id"]},
                UpdateExpression="SET #pk = :bury",
                ConditionExpression="attribute_exists(#ref)",
                ExpressionAttributeNames={"#pk": K.PURGE_PK, "#ref": K.OFFLOAD_REFS["error"]},
                ExpressionAttributeValues={":bury": {"S": bury}},
            )
        return 1 if any(a in old for a in (*data, *refs)) else 0

    def _queue_index_pages(self, queue: str, attrs: list[str]) -> Iterator[list[Item]]:
        names = {f"#a{n}": a for n, a in enumerate(attrs)}
        return self._pages(
            self._ddb.query,
            by_page=True,
            TableName=self._invocations,
            IndexName=K.QUEUE_INDEX,
            KeyConditionExpression="#q = :q",
            ProjectionExpression=", ".join(names),
            ExpressionAttributeNames={"#q": "queue", **names},
            ExpressionAttributeValues={":q": {"S": queue}},
        )

    # --- change detection ---------------------------------------------------------------
    def change_marker(self) -> int:
        """Changes on every call: DynamoDB has no cheap global change counter, so a
        waiter re-checks its records on each poll."""
        return next(self._marker)

    def close(self) -> None:
        if self._owns_clients:
            self._ddb.close()
            self._s3.close()
