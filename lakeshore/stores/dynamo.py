"""DynamoDB + S3 store: the AWS plane's :class:`~dreamlake.lakeshore.plane.store.Store`.

Tables, indexes, attributes and prefixes are named in :mod:`.keys`. Queues, wake
objects and the client set-up are here; invocations are kept as group items
(:mod:`.dynamo_groups`, primitives in :mod:`.dynamo_invocations`); tokens, daemons,
data keys, job output and blobs in :mod:`.dynamo_extras`. How the primitives map onto
DynamoDB:

- an update is a read-modify-write of the invocation's group item: read it strongly
  consistent, check ``expect`` and apply ``changes`` in Python, put it back conditioned
  on the revision read (a moved revision re-checks against the item as it is now). The
  updates of one group in one call (a claim of many, completions of a batch) are one
  write.
- ``running_below`` is a counter item per capped queue (records table, kind
  ``running``). A capped claim writes the group and ``ADD running 1`` (if
  ``running < cap``) in one ``TransactWriteItems``; a claimed record is marked counted,
  and the write that takes it out of running gives the slot back in the same way.
  Queues without a cap never touch a counter (no hot item).
- ``pending`` reads a sparse index of groups (``queue#shard`` → lowest order key),
  filtering on the earliest ``available_at``; ``expired_leases`` and ``purge`` read
  sparse indexes keyed by lease expiry and ``expires_at``; ``counts`` and
  ``list_invocations`` read a by-queue index of groups. No primitive scans the table.
  Index reads are eventually consistent: the group read after them is not.
- expiry is DynamoDB's TTL: a finished group, a payload item and a result item carry
  their TTL, and the plane core hides what has expired (past expiry no payload or
  result, past the tombstone nothing). ``purge`` strips only groups holding objects in
  S3 or job output (the expiry index has just those).
- payload, result and error above ``keys.INLINE_LIMITS`` go to S3 before the item is
  written; a read fetches them (and payloads and results from their items) when first
  used.
- ``change_marker`` has no cheap global counterpart: it changes on every call, so
  waiters re-check every ``poll_interval`` (0.5 s).

What each request and write costs is in docs/cost.md (``benchmarks/cost.py`` counts it).

Concurrency: every decision is a condition evaluated by DynamoDB, so any number of
processes may share the tables. moto is the exception (its conditional writes are not
atomic under threads): tests serialise moto requests themselves.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import time
from typing import Any

from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from ..plane.model import QueueSpec
from . import keys as K
from .dynamo_extras import error_code
from .dynamo_indexes import DynamoIndexes
from .dynamo_items import (
    Item,
    num,
    pack,
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

#: the longest a presigned URL may live (S3's limit)
_MAX_WAKE_TTL = 7 * 86400


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


def _spec(item: Item) -> QueueSpec:
    return QueueSpec(name=item[K.Q_NAME]["S"], **unpack(item[K.Q_SPEC]["B"]))


class DynamoStore(DynamoIndexes):
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
        self._init_invocations()
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
    def queue_and_idle(
        self, name: str, *, consistent: bool = False
    ) -> tuple[QueueSpec | None, bool]:
        """The spec and the idle mark, read as :meth:`get_queue` reads (the same read),
        or strongly (``consistent``): the read a submit makes again after its write, so
        that a mark a claim set after the first read is seen (see ``ProducerOps.submit``)."""
        return self._queue_read(name, consistent)

    def _queue_read(self, name: str, strong: bool = False) -> tuple[QueueSpec | None, bool]:
        key = {K.Q_NAME: {"S": name}}
        for consistent in (True,) if strong else (False, True):
            out = self._ddb.get_item(TableName=self._queues, Key=key, ConsistentRead=consistent)
            if "Item" in out:
                return _spec(out["Item"]), K.Q_IDLE in out["Item"]
        return None, False

    def mark_idle(self, name: str, now: float) -> tuple[str, bool]:
        """Set the mark unless it is set (a refused condition when it is, or when there
        is no such queue: one write unit); then the object's ETag: written now if the
        mark is new, else read (HEAD), written if missing."""
        newly = self._update_queue(
            name,
            "SET #i = :t",
            "attribute_exists(#k) AND attribute_not_exists(#i)",
            {"#i": K.Q_IDLE},
            {":t": num(now)},
        )
        if newly:
            return self._put_wake(name), True
        exists = self._queue_read(name)[0] is not None
        try:
            head = self._s3.head_object(Bucket=self._bucket, Key=K.wake_key(name))
            return str(head["ETag"]), exists
        except ClientError as exc:
            if error_code(exc) not in ("404", "NoSuchKey", "NotFound"):
                raise
        return self._put_wake(name), exists

    def wake(self, name: str, *, created: bool = False) -> bool:
        woke = created or self._update_queue(
            name, "REMOVE #i", "attribute_exists(#i)", {"#i": K.Q_IDLE}, {}
        )
        if woke:
            try:
                self._put_wake(name)
            except Exception:
                # the object still says nothing: mark the queue idle again (best effort),
                # so the next new work tries the wake again
                with contextlib.suppress(Exception):
                    self._update_queue(
                        name,
                        "SET #i = :t",
                        "attribute_exists(#k)",
                        {"#i": K.Q_IDLE},
                        {":t": num(time.time())},
                    )
                raise
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
            gone = self._delete_invocations(name)
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

    # --- invocations (the rest is dynamo_invocations.py) -----------------------------
    def running(self, queue: str) -> int:
        """The queue's running counter (one small read), which is what ``running_below``
        compares: invocations claimed under a cap that are still running."""
        out = self._ddb.get_item(
            TableName=self._records, Key=K.running_key(queue), ConsistentRead=True
        )
        item = out.get("Item") or {}
        return int(item[K.REC_RUNNING]["N"]) if K.REC_RUNNING in item else 0

    # --- change detection ---------------------------------------------------------------
    def change_marker(self) -> int:
        """Changes on every call: DynamoDB has no cheap global change counter, so a
        waiter re-checks its records on each poll."""
        return next(self._marker)

    def close(self) -> None:
        if self._owns_clients:
            self._ddb.close()
            self._s3.close()
