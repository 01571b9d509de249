"""The key schema of the DynamoDB + S3 store: every table, index, attribute and prefix.

This is the one module that names them; ``template.yaml`` declares the same tables and
indexes, and ``tests/test_template.py`` checks that the tables built from the template
have exactly the indexes named here. Changing a name is a change here and in the
template, and nowhere else.

Four tables and a bucket::

    queues       name                  one item per queue: spec, activity, claim counter
    invocations  id                    g#<group>: the records of an id group (+ five
                                       indexes); p#…, r#…: payloads and results, each
                                       written once (stores/dynamo_groups.py)
    logs         inv, seq              a job's output chunks, one item each
    records      kind, id              tokens, daemons, data keys, running counters
    bucket       blob/<digest>         content-addressed blobs
                 inv/<id>/<field>-<sha256>   payload/result/error/log text too large
                                             for an item

Cost shapes the layout: DynamoDB bills every write of an item per KB, and every index
entry a write adds, changes or removes (docs/cost.md has the measured figures). So the
invocations of a batch share one small group item, their payloads and results are
written once beside it, the sparse index attributes exist only while the group has an
invocation the index must find, and no index projects an attribute that changes when
its entry would not.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

__all__ = [
    "BLOB_PREFIX",
    "BLOB_REFRESH_AFTER",
    "BUCKET_RESOURCE",
    "DUE_AT",
    "DUE_INDEX",
    "ENV_VARS",
    "EXPIRY_INDEX",
    "EXPIRY_SHARDS",
    "INLINE_LIMITS",
    "INLINE_MAX",
    "INVOCATION_INDEXES",
    "INV_PREFIX",
    "LEASES_INDEX",
    "LEASES_INCLUDE",
    "LEASE_PK",
    "LEASE_SHARDS",
    "LOG_INLINE_MAX",
    "LOG_INV",
    "LOG_SEQ",
    "LOG_TEXT_REF",
    "LOG_TTL",
    "Q_IDLE",
    "WAKE_PREFIX",
    "P_RENEW",
    "PENDING_INCLUDE",
    "PENDING_INDEX",
    "PENDING_INDEX_ATTRS",
    "PENDING_PK",
    "PENDING_SHARDS",
    "PURGE_AT",
    "PURGE_PK",
    "QUEUE_INDEX",
    "Q_ACTIVITY",
    "Q_CLAIMS",
    "Q_CREATED",
    "Q_NAME",
    "Q_SPEC",
    "REC_DAEMON",
    "REC_DATA",
    "REC_DIGEST",
    "REC_DOC",
    "REC_ID",
    "REC_KIND",
    "REC_RUNNING",
    "REC_RUNNING_KIND",
    "REC_TOKEN",
    "REC_UPDATED",
    "REV",
    "TABLE_RESOURCES",
    "TTL_AFTER_EXPIRY",
    "Resources",
    "blob_key",
    "bury_pk",
    "expiry_shard",
    "lease_pk",
    "lease_pks",
    "log_text_key",
    "offload_key",
    "wake_key",
    "pending_pks",
    "running_key",
    "shard_home",
    "strip_pk",
]

# --- resources -----------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """Physical names of the store's tables and bucket.

    A deployed stack names them (CloudFormation generates the names and hands them to
    the functions as environment variables, see :meth:`from_env`); the defaults are for
    moto and ``lakeshore dev``.
    """

    queues: str = "lakeshore-queues"
    invocations: str = "lakeshore-invocations"
    records: str = "lakeshore-records"
    logs: str = "lakeshore-logs"
    bucket: str = "lakeshore-blobs"

    @classmethod
    def from_env(cls) -> Resources:
        """The names from the environment (a variable that is unset keeps the default)."""
        given = {field: os.environ[var] for var, field in ENV_VARS.items() if var in os.environ}
        return cls(**given)


#: environment variable → Resources field, as the stack's functions receive them
ENV_VARS = {
    "LAKESHORE_QUEUES_TABLE": "queues",
    "LAKESHORE_INVOCATIONS_TABLE": "invocations",
    "LAKESHORE_RECORDS_TABLE": "records",
    "LAKESHORE_LOGS_TABLE": "logs",
    "LAKESHORE_BLOB_BUCKET": "bucket",
}


#: template.yaml logical id → Resources field (infra/tables.py builds these)
TABLE_RESOURCES = {
    "QueuesTable": "queues",
    "InvocationGroupsTable": "invocations",
    "RecordsTable": "records",
    "LogsTable": "logs",
}
#: template.yaml logical id of the blob bucket
BUCKET_RESOURCE = "BlobBucket"

# --- queues table --------------------------------------------------------------------
#: hash key: the queue name
Q_NAME = "name"
#: msgpack of QueueSpec.settings()
Q_SPEC = "spec"
Q_CREATED = "created_at"
#: last submit or claim (touch_queue), for listing and pruning
Q_ACTIVITY = "last_activity"
#: queue_counter(): claims made on the queue (Boltzmann annealing reads it)
Q_CLAIMS = "claims"
#: present (the plane time it was set) while a claim found the queue empty and idle
#: workers watch its wake object; a submit that reads it removes it (conditionally)
#: and rewrites the object (``WAKE_PREFIX``)
Q_IDLE = "idle_since"

# --- records table -------------------------------------------------------------------
#: hash key: what the record is (one of the REC_* kinds); lists are one Query per kind
REC_KIND = "kind"
#: range key: the record's id (a token id, a daemon id, a data key, a queue name)
REC_ID = "id"
#: msgpack of a token or daemon record
REC_DOC = "doc"
REC_TOKEN = "token"
REC_DAEMON = "daemon"
#: a data key (id = the key) pointing at a blob: attributes REC_DIGEST, REC_UPDATED
REC_DATA = "data"
REC_DIGEST = "digest"
REC_UPDATED = "updated_at"
#: the running counter of a capped queue (id = queue name); attribute REC_RUNNING
REC_RUNNING_KIND = "running"
#: how many invocations of the queue hold a COUNTED slot
REC_RUNNING = "running"


def running_key(queue: str) -> dict[str, dict[str, str]]:
    """The records-table key of a queue's running counter."""
    return {REC_KIND: {"S": REC_RUNNING_KIND}, REC_ID: {"S": queue}}


# --- logs table ----------------------------------------------------------------------
#: hash key: the invocation id (each invocation's output is its own partition)
LOG_INV = "inv"
#: range key (N): the entry's seq, as the plane numbers it
LOG_SEQ = "seq"
#: the other LogEntry fields are attributes of their own names: stream, text, at,
#: attempt; text above LOG_INLINE_MAX bytes goes to S3 and LOG_TEXT_REF holds its key
LOG_TEXT_REF = "text_ref"
#: log entries are written once and deleted once (never rewritten): inline up to here
LOG_INLINE_MAX = 64 * 1024
#: TTL backstop (attribute PURGE_AT) after an entry's time: purge deletes a job's
#: output with its payload and result; this catches output of records it never saw
LOG_TTL = 400 * 86400

# --- invocations table: indexes (entries are group items, g#<group>) ----------------
#: groups with pending invocations in claim order. Hash PENDING_PK, range order_key (the
#: lowest among the group's pending invocations); projection PENDING_INDEX_ATTRS.
#: Sparse: only groups with a pending invocation have PENDING_PK.
PENDING_INDEX = "pending"
#: groups with pending invocations scheduled for later (a delay, a retry's backoff) by
#: the earliest such time (hash PENDING_PK, range DUE_AT, keys only):
#: next_available_at() is one Query with Limit 1 per shard. A group due on arrival has
#: no DUE_AT, so the common submit and claim write no entry here.
DUE_INDEX = "due"
#: groups with running invocations by their earliest lease expiry (hash LEASE_PK, range
#: lease_expires_at; projects P_RENEW). Sparse: only groups with a running invocation.
LEASES_INDEX = "leases"
#: finished groups that hold objects in S3 or job output, which purge() must delete,
#: by their latest expires_at (hash PURGE_PK, range expires_at, keys only). Every other
#: group is left to TTL whole: the plane core hides what has expired.
EXPIRY_INDEX = "expiry"
#: every group of a queue by id (hash queue, range id), keys only: written when a group
#: is created, never again (counts(), list_invocations() and delete_queue() read the
#: groups it names)
QUEUE_INDEX = "by_queue"
#: every index of the invocations table
INVOCATION_INDEXES = frozenset({PENDING_INDEX, DUE_INDEX, LEASES_INDEX, EXPIRY_INDEX, QUEUE_INDEX})

# --- invocations table: derived attributes of a group item -----------------------------
#: "<queue>#<shard>" while the group has a pending invocation (PENDING_INDEX, DUE_INDEX);
#: the group's order_key and available_at are then the lowest among those
PENDING_PK = "pending_pk"
#: the earliest available_at among pending invocations scheduled for later (DUE_INDEX)
DUE_AT = "due_at"
#: when the earliest payload item an unfinished invocation of the group needs must be
#: extended (dynamo_groups.RENEW_MARGIN before its TTL); the pending and leases indexes
#: project it, so the hourly look for such groups reads index entries only
P_RENEW = "p_renew"
#: what the pending index projects besides its keys
PENDING_INCLUDE = ("available_at", P_RENEW)
#: = PENDING_INCLUDE (template.yaml projects the same)
PENDING_INDEX_ATTRS: tuple[str, ...] = PENDING_INCLUDE
#: what the leases index projects besides its keys
LEASES_INCLUDE = (P_RENEW,)
#: "lease#<shard>" while the group has a running invocation (LEASES_INDEX)
LEASE_PK = "lease_pk"
#: "strip#<shard>" once every invocation of a group holding S3 objects or job output has
#: finished, until purge() strips them (EXPIRY_INDEX, range expires_at: the latest
#: expiry); a stripped group whose errors are in S3 gets "bury#<shard>", so purge()
#: deletes it (objects and all) at its tombstone's end
PURGE_PK = "purge_pk"
#: the table's TTL attribute, whole epoch seconds: a group's latest expires_at +
#: TTL_AFTER_EXPIRY once all its invocations have finished; a payload item's write time
#: + dynamo_groups.PAYLOAD_TTL (extended while needed); a result item's latest expiry
#: (TTL deletes, free, within a day or two after; the plane core hides what has expired)
PURGE_AT = "purge_at"
#: a group item's revision: +1 on every write, each write conditioned on the one read
REV = "rev"

# --- sizes and shards ----------------------------------------------------------------
#: string fields (worker, lease token, ...) longer than this are refused: an item stays
#: small whatever a client sends
INLINE_MAX = 4 * 1024
#: payload, result and (packed) error larger than this go to S3 (INV_PREFIX) and the
#: record keeps their key. Inline, a payload or result is written once (a payload or
#: result item), an error with its group: 4 KB costs 4 write units ($2.50 per million)
#: and a few days of storage, against an S3 PUT and GET ($5.40 per million). Every item
#: stays far below 400 KB (a group holds at most 16 records).
INLINE_LIMITS = {"payload": 4 * 1024, "result": 4 * 1024, "error": 4 * 1024}
#: pending partitions per queue: one partition takes ~1,000 writes/s. Grow it, never
#: shrink it: readers query shards 0..N-1, so items on a dropped shard would vanish.
PENDING_SHARDS = 1
#: partitions of the leases index (written on claim, heartbeat and finish of every
#: invocation of every queue: ~1,000 writes/s per partition, and lease expiry times
#: only grow, so a split for heat does not help). The sweep queries every partition,
#: about once a second per plane: start at one.
LEASE_SHARDS = 1
#: partitions of the expiry index (written on finish and strip); purge queries each
#: twice, about once a minute per plane
EXPIRY_SHARDS = 1
#: TTL after expires_at of a record purge() does not strip (nearly all): past any
#: tombstone a plane uses (30 days by default), as the record must answer "expired"
#: until its tombstone ends
TTL_AFTER_EXPIRY = 35 * 86400

# --- S3 ------------------------------------------------------------------------------
#: content-addressed blobs (put_blob); a lifecycle rule expires them (template.yaml)
BLOB_PREFIX = "blob/"
#: offloaded invocation fields; deleted with their record (purge, delete_queue). A
#: long lifecycle rule (template.yaml) only catches what a lost write left behind.
INV_PREFIX = "inv/"
#: a blob older than this is re-stamped (copied onto itself) when has_blobs() finds it,
#: so one still in use outlives the blob/ lifecycle rule (BlobRetentionDays, 30 by
#: default): a blob reported present has at least 23 more days
BLOB_REFRESH_AFTER = 7 * 86400
#: one small object per queue (``wake/<queue>``), rewritten (a new ETag) when a submit
#: finds the queue marked idle (``Q_IDLE``); idle workers poll it by presigned GET with
#: ``If-None-Match``. Deleted with its queue.
WAKE_PREFIX = "wake/"


def _shard(inv_id: str, shards: int) -> int:
    return zlib.crc32(inv_id.encode()) % shards


def shard_home(queue: str, inv_id: str) -> str:
    return f"{queue}#{_shard(inv_id, PENDING_SHARDS)}"


def pending_pks(queue: str) -> list[str]:
    """Every pending partition of a queue (queue names never contain ``#``)."""
    return [f"{queue}#{n}" for n in range(PENDING_SHARDS)]


def lease_pk(inv_id: str) -> str:
    return f"lease#{_shard(inv_id, LEASE_SHARDS)}"


def lease_pks() -> list[str]:
    """Every partition of the leases index."""
    return [f"lease#{n}" for n in range(LEASE_SHARDS)]


def strip_pk(shard: int) -> str:
    return f"strip#{shard}"


def bury_pk(shard: int) -> str:
    return f"bury#{shard}"


def expiry_shard(inv_id: str) -> int:
    return _shard(inv_id, EXPIRY_SHARDS)


def blob_key(digest: str) -> str:
    return f"{BLOB_PREFIX}{digest}"


def wake_key(queue: str) -> str:
    return f"{WAKE_PREFIX}{queue}"


def offload_key(inv_id: str, field: str, sha256: str) -> str:
    """Content-addressed per invocation: a refused write never clobbers stored bytes.

    The suffix has a fixed length, so distinct ids never share a key.
    """
    return f"{INV_PREFIX}{inv_id}/{field}-{sha256}"


def log_text_key(inv_id: str, seq: int, sha256: str) -> str:
    return f"{INV_PREFIX}{inv_id}/log-{seq}-{sha256}"
