"""The key schema of the DynamoDB + S3 store: every table, index, attribute and prefix.

This is the one module that names them; ``template.yaml`` declares the same tables and
indexes, and ``tests/test_template.py`` checks that the tables built from the template
have exactly the indexes named here. Changing a name is a change here and in the
template, and nowhere else.

Four tables and a bucket::

    queues       name                  one item per queue: spec, activity, claim counter
    invocations  id                    one item per invocation (+ five indexes)
    logs         inv, seq              a job's output chunks, one item each
    records      kind, id              tokens, daemons, data keys, running counters
    bucket       blob/<digest>         content-addressed blobs
                 inv/<id>/<field>-<sha256>   payload/result/error/log text too large
                                             for an item

An invocation item holds every :class:`~dreamlake.lakeshore.plane.model.Invocation`
field under its own name (a ``None`` field is an absent attribute; ``available_at`` of
an invocation due on arrival is ``READY_AT``), plus the derived attributes below, which
the store keeps in step with the fields on every write.

Cost shapes the layout: DynamoDB bills every write of an item per KB, and every index
entry a write adds, changes or removes (docs/cost.md has the measured figures). So the
sparse index attributes exist only in the states whose index must find the item, and
an index projects only attributes that change when its entry changes anyway: a claim
writes the item and its pending and lease entries, nothing else.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

__all__ = [
    "BLOB_PREFIX",
    "BLOB_REFRESH_AFTER",
    "BUCKET_RESOURCE",
    "COUNTED",
    "DEADLINE",
    "DUE_INDEX",
    "ENV_VARS",
    "EXPIRY_INDEX",
    "EXPIRY_SHARDS",
    "FINAL",
    "INLINE_LIMITS",
    "INLINE_MAX",
    "INVOCATION_INDEXES",
    "INV_PREFIX",
    "LEASES_INDEX",
    "LEASE_PK",
    "LEASE_SHARDS",
    "LOG_INLINE_MAX",
    "LOG_INV",
    "LOG_SEQ",
    "LOG_TEXT_REF",
    "LOG_TTL",
    "LOGGED",
    "OFFLOAD_REFS",
    "Q_IDLE",
    "WAKE_PREFIX",
    "PENDING_INCLUDE",
    "PENDING_INDEX",
    "PENDING_INDEX_ATTRS",
    "PENDING_PK",
    "PENDING_SHARDS",
    "PURGE_AT",
    "PURGE_PK",
    "QUEUE_INDEX",
    "QUEUE_INDEX_ATTRS",
    "READY_AT",
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
    "SHARD_HOME",
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
    "InvocationsTable": "invocations",
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

# --- invocations table: indexes ------------------------------------------------------
#: pending work in claim order. Hash PENDING_PK, range order_key; projection
#: PENDING_INDEX_ATTRS, so a claim reads candidates in one Query. Sparse: only pending
#: invocations have PENDING_PK.
PENDING_INDEX = "pending"
#: pending invocations that were scheduled for later (a delay, a retry's backoff) by
#: available_at (hash PENDING_PK, range available_at, keys only): next_available_at()
#: is one Query with Limit 1 per shard, and counts() reads the scheduled ones from it.
#: Sparse twice over: an invocation due on arrival keeps its available_at as READY_AT,
#: so the common submit and claim write no entry here.
DUE_INDEX = "due"
#: running invocations by lease expiry (hash LEASE_PK, range lease_expires_at, keys
#: only). Sparse: only running invocations have LEASE_PK.
LEASES_INDEX = "leases"
#: finished invocations that hold objects in S3 or job output, which purge() must
#: delete, by expires_at (hash PURGE_PK, range expires_at, keys only). Sparse: PURGE_PK
#: is set when such an invocation finishes and removed when it is stripped. Every other
#: record is left to TTL whole: the plane core hides what has expired.
EXPIRY_INDEX = "expiry"
#: every invocation of a queue by id (hash queue, range id), with the attributes
#: counts(), list_invocations() and delete_queue() need (QUEUE_INDEX_ATTRS). It projects
#: FINAL rather than state, so only submit and finish write its entry (not a claim).
QUEUE_INDEX = "by_queue"
#: attributes QUEUE_INDEX projects besides its keys
QUEUE_INDEX_ATTRS = ("final", "payload_ref", "result_ref", "error_ref")
#: every index of the invocations table
INVOCATION_INDEXES = frozenset({PENDING_INDEX, DUE_INDEX, LEASES_INDEX, EXPIRY_INDEX, QUEUE_INDEX})

# --- invocations table: derived attributes -------------------------------------------
#: "<queue>#<shard>", written once at insert: the pending partition this invocation
#: joins whenever it becomes pending (an update copies it into PENDING_PK without
#: knowing the queue).
SHARD_HOME = "shard_pk"
#: = SHARD_HOME while state is pending, absent otherwise (PENDING_INDEX, DUE_INDEX)
PENDING_PK = "pending_pk"
#: where ``available_at`` is kept when the invocation was due on arrival (inserted with
#: ``available_at <= created_at``): not ``available_at``, so it has no DUE_INDEX entry.
#: Any later write of ``available_at`` (a retry's backoff) uses its own name again.
READY_AT = "ready_at"
#: = state once the invocation is finished (succeeded, failed, cancelled, dead), absent
#: before (QUEUE_INDEX projects it): counts() tells finished states apart by it
FINAL = "final"
#: what a claim reads of a candidate (none of it changes while the invocation is pending)
PENDING_INCLUDE = ("queue", "state", "attempt", "priority", "timeout", "available_at", READY_AT)
#: attributes the pending index projects besides its keys (None would be all of them,
#: a projection of ALL). A claim needs only PENDING_INCLUDE of a candidate (its update
#: returns the whole item), and the store reads any other field of a candidate the first
#: time it is used: entries of ~150 bytes instead of whole items, one write unit less at
#: submit and at claim for items over 1 KB (template.yaml projects the same).
PENDING_INDEX_ATTRS: tuple[str, ...] | None = PENDING_INCLUDE
#: "lease#<shard>" while state is running, absent otherwise (LEASES_INDEX)
LEASE_PK = "lease_pk"
#: "strip#<shard>" from finish until purge() strips payload and result (EXPIRY_INDEX),
#: for records with objects in S3 or job output only; absent otherwise, without
#: expires_at and once stripped, except for a record whose error is in S3:
#: "bury#<shard>" then, so purge() deletes it (and its object) at its tombstone's end
PURGE_PK = "purge_pk"
#: the table's TTL attribute, whole epoch seconds: expires_at + TTL_AFTER_EXPIRY from
#: finish (TTL deletes the record, free, within a day or two after; the plane core
#: hides it from its tombstone's end on). A record purge() strips gets expires_at + the
#: plane's tombstone (purge learns it from its arguments). purge() deletes only what
#: it finds in the expiry index past the tombstone unstripped.
PURGE_AT = "purge_at"
#: started_at + timeout, kept while both are set, so ``deadline_after`` is a condition
DEADLINE = "deadline"
#: present while the invocation holds a slot of its queue's running counter (it was
#: claimed with ``running_below``); leaving running gives the slot back
COUNTED = "counted"
#: present once the invocation has job output (logs table): a finished record with
#: output joins the expiry index, so purge deletes the output with payload and result
LOGGED = "logged"
#: revision: +1 on every update, so a read-then-write can be made exact
REV = "rev"
#: field → attribute holding the S3 key of that field when it is offloaded
OFFLOAD_REFS = {"payload": "payload_ref", "result": "result_ref", "error": "error_ref"}

# --- sizes and shards ----------------------------------------------------------------
#: string fields (worker, lease token, ...) longer than this are refused: an item stays
#: small whatever a client sends
INLINE_MAX = 4 * 1024
#: payload, result and (packed) error larger than this go to S3 (INV_PREFIX) and the item
#: keeps their key. An S3 PUT and a GET cost as much as ~8.6 write units. DynamoDB bills
#: each write of the item per KB: a payload inline is written at submit, claim, complete
#: and strip, and twice more as the pending index's copy (submit, claim): ~6 units per
#: KB, so it goes to S3 from 1.5 KB. A result or error is written at finish and strip:
#: ~2 units per KB, S3 from 4 KB. Every item stays far below 400 KB.
INLINE_LIMITS = {"payload": 1536, "result": 4 * 1024, "error": 4 * 1024}
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
