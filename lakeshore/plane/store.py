"""The store protocol: a few atomic primitives. Policy lives in :mod:`.core`.

A store persists queue specs, invocation records and content-addressed blobs, and
answers atomic questions. It never decides what a state transition means: the plane
core computes every new field value and asks the store to write them *only if* the
record still holds what the core read (a compare-and-set). A store that implements
these primitives passes the conformance suite in ``tests/test_store_conformance.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .model import DaemonRecord, Invocation, LogEntry, QueueSpec, TokenRecord

__all__ = [
    "BlobHome",
    "BlobWriter",
    "Store",
    "WakeObjects",
    "WatchesWrites",
    "WriteSignal",
    "blob_home",
    "blob_writer",
    "wake_objects",
]


class Store(Protocol):
    #: another process may write to this store, so waits must poll for changes
    shared: bool
    #: seconds between polls of :meth:`change_marker` while anyone waits
    poll_interval: float

    # --- queues -------------------------------------------------------------
    def put_queue(self, spec: QueueSpec, now: float) -> QueueSpec:
        """Create the queue unless one of that name exists; return the stored spec."""
        ...

    def get_queue(self, name: str) -> QueueSpec | None: ...

    def list_queues(self) -> list[tuple[QueueSpec, float]]:
        """Every queue with its last activity time."""
        ...

    def replace_queue(self, spec: QueueSpec, now: float) -> bool:
        """Overwrite an existing queue's settings; False if it does not exist."""
        ...

    def delete_queue(self, name: str, *, invocations: bool = True) -> int:
        """Remove the queue, and with ``invocations`` all its invocations; return how
        many invocations went."""
        ...

    def touch_queue(self, name: str, now: float) -> None:
        """Record activity on a queue (used for listing and pruning)."""
        ...

    def queue_counter(self, name: str, add: int) -> int:
        """Atomically add ``add`` to the queue's claim counter; return the new value
        (0 for a missing queue)."""
        ...

    # --- invocations --------------------------------------------------------
    def insert(self, inv: Invocation) -> Invocation | None:
        """Insert if no record has this id. Return the existing record otherwise."""
        ...

    def get(self, inv_id: str) -> Invocation | None: ...

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        """The records that exist among ``ids`` (any order)."""
        ...

    def update_if(
        self,
        inv_id: str,
        expect: Mapping[str, Any],
        changes: Mapping[str, Any],
        *,
        running_below: int | None = None,
        deadline_after: float | None = None,
    ) -> Invocation | None:
        """Apply ``changes`` iff every field in ``expect`` equals its value now.

        With ``running_below``, also only if fewer than that many invocations of the
        record's queue are running. With ``deadline_after``, also only if the record
        has no timeout or ``started_at + timeout`` is later than that time. Returns the
        updated record, or None when a condition failed (or the record does not
        exist). Atomic.
        """
        ...

    def insert_many(self, invs: Sequence[Invocation]) -> list[Invocation | None]:
        """:meth:`insert` for each, answers in order (None where inserted). Each is
        atomic on its own, not the whole: a store may write records that share a group
        (:mod:`.ids`) in one request."""
        ...

    def update_many_if(
        self,
        updates: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
        *,
        running_below: int | None = None,
        deadline_after: float | None = None,
    ) -> list[Invocation | None]:
        """:meth:`update_if` for each ``(id, expect, changes)``, answers in order. Each
        is atomic on its own, not the whole (a claim of many, completions of a batch):
        a store may write the updates of records that share a group in one request."""
        ...

    def pending(self, queue: str, now: float, limit: int) -> list[Invocation]:
        """Pending invocations of ``queue`` with ``available_at <= now``, by ``order_key``;
        fewer than ``limit`` only when there were no more (the claim relies on it)."""
        ...

    def next_available_at(self, queue: str) -> float | None:
        """The earliest ``available_at`` among the queue's pending invocations."""
        ...

    def expired_leases(self, now: float, limit: int) -> list[Invocation]:
        """Running invocations whose ``lease_expires_at`` has passed."""
        ...

    def counts(self, queue: str, now: float) -> dict[str, int]:
        """Invocations of a queue by state; pending ones not yet due count as
        ``scheduled``."""
        ...

    def running(self, queue: str) -> int:
        """How many invocations of ``queue`` hold a running slot, as ``running_below``
        counts them: the cheap question a refused capped claim asks (is the cap full,
        or was the race lost?)."""
        ...

    def purge(self, now: float, tombstone_until: float) -> int:
        """Reclaim what has expired: payload, result and output of records past
        ``expires_at``, and records whose ``expires_at`` is before ``tombstone_until``.
        Return records touched.

        The plane core hides both already (:meth:`.base.PlaneBase.visible`: past its
        tombstone a record is unknown, past expiry its payload and result read as
        None), so a store may leave either step to its own expiry (DynamoDB's TTL)
        or do it later; it must never drop the data of a record not yet expired."""
        ...

    def list_invocations(
        self, queue: str, state: str | None, now: float, after: str | None, limit: int
    ) -> list[Invocation]:
        """Invocations of a queue by id, after id ``after``; ``state`` filters by public
        state (``scheduled`` is pending and not yet due)."""
        ...

    # --- job output ------------------------------------------------------------------
    def append_logs(self, inv_id: str, entries: Sequence[LogEntry]) -> None:
        """Store output chunks; an entry whose (invocation, seq) exists is skipped."""
        ...

    def read_logs(self, inv_id: str, after: int, limit: int) -> list[LogEntry]:
        """Output chunks with ``seq > after``, in order."""
        ...

    # --- tokens and daemons (small tables of records) -----------------------------
    def put_token(self, token: TokenRecord) -> None: ...

    def get_token(self, token_id: str) -> TokenRecord | None: ...

    def list_tokens(self) -> list[TokenRecord]: ...

    def get_daemon(self, daemon_id: str) -> DaemonRecord | None: ...

    def change_daemon(
        self, daemon_id: str, change: Callable[[DaemonRecord | None], DaemonRecord | None]
    ) -> DaemonRecord | None:
        """Read a daemon's record (None: there is none), hand it to ``change`` and write
        the record ``change`` returns, as one step: a write by anyone else between the
        read and the write is never undone (``change`` may be called again, with the
        record as it then is). ``change`` returning None writes nothing. The record
        written, or None."""
        ...

    def list_daemons(self) -> list[DaemonRecord]: ...

    def delete_daemon(self, daemon_id: str) -> bool:
        """Remove a daemon record; whether there was one."""
        ...

    # --- data keys (named blobs for data UDFs) ----------------------------------------
    def put_data_key(self, key: str, digest: str, now: float) -> None:
        """Point ``key`` at a blob (replacing what it pointed at)."""
        ...

    def get_data_keys(self, keys: Sequence[str]) -> dict[str, str]:
        """The digests the existing keys among ``keys`` point at."""
        ...

    # --- blobs (content-addressed) --------------------------------------------
    def put_blob(self, digest: str, data: bytes, now: float) -> None:
        """Store ``data`` under its digest; a second put of the same digest is a no-op."""
        ...

    def get_blob(self, digest: str) -> bytes | None: ...

    def has_blobs(self, digests: Iterable[str]) -> set[str]: ...

    # --- change detection -------------------------------------------------------
    def change_marker(self) -> int:
        """A number that changes when another process commits (for polling waits)."""
        ...

    def close(self) -> None: ...


class WriteSignal(Protocol):
    """Tells of writes to a store by any process (see :class:`WatchesWrites`)."""

    #: seconds a write may take to show after it is told (the poller keeps looking
    #: that long after one)
    settle: float

    def wait(self, timeout: float) -> bool:
        """Block until the store is written or ``timeout`` seconds pass: whether it was
        (each write since the last call counts once)."""
        ...

    def written(self) -> bool:
        """Whether the store was written since the last call (never blocks)."""
        ...

    def interrupt(self) -> None:
        """End a :meth:`wait` under way (from another thread)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class WatchesWrites(Protocol):
    """An optional capability: the store can tell when any process writes to it (the
    SQLite store on Linux, by inotify on the file and its log), so the plane's poller of
    :meth:`Store.change_marker` sleeps until then instead of looking every
    ``poll_interval`` while anybody waits."""

    def write_watch(self) -> WriteSignal | None:
        """A new signal of writes (the poller closes it), or None if there is none."""
        ...


@runtime_checkable
class WakeObjects(Protocol):
    """An optional capability: idle workers watch one cheap object per queue instead of
    asking the plane (the DynamoDB + S3 store; SQLite planes hold claims instead).

    A claim that finds nothing marks its queues idle (:meth:`mark_idle`) and hands the
    workers a URL per queue (:meth:`wake_url`) with the object's ETag; a submit that
    reads the mark (:meth:`queue_and_idle`, the spec read it makes anyway) clears it and
    rewrites the object (:meth:`wake`), so a busy queue's submits write nothing extra.
    """

    def queue_and_idle(
        self, name: str, *, consistent: bool = False
    ) -> tuple[QueueSpec | None, bool]:
        """The queue's spec (None if it does not exist) and whether it is marked idle,
        in one read; ``consistent``: a read that sees every write made before it began
        (a mark set a moment ago), else one that may miss it."""
        ...

    def mark_idle(self, name: str, now: float) -> tuple[str, bool]:
        """Mark the queue idle unless it is, make sure its wake object exists, and
        return the object's ETag (as of after the mark) and whether the queue exists
        (a queue that does not has no mark to set, but its object is made all the
        same: its watchers look at an object, not at a 404, until a submit creates
        the queue and rewrites it)."""
        ...

    def wake(self, name: str, *, created: bool = False) -> bool:
        """If the queue is marked idle, clear the mark and rewrite its wake object (a
        new ETag); True if this call did. Atomic: of racing calls one wakes. With
        ``created`` (the caller just created the queue, which had no mark to set)
        rewrite the object regardless."""
        ...

    def wake_url(self, name: str, ttl: int) -> str:
        """A URL to GET the queue's wake object for ``ttl`` seconds (presigned)."""
        ...


def _has(store: Any, capability: type) -> bool:
    """Whether ``store`` has an optional capability: a runtime check of a protocol
    costs ~30 us, so its answer is kept by the store's class (but a wrapper's, whose
    attributes are another store's)."""
    key = (type(store), capability)
    found = _capabilities.get(key)
    if found is None:
        found = isinstance(store, capability)
        if not hasattr(type(store), "__getattr__"):
            _capabilities[key] = found
    return found


_capabilities: dict[tuple[type, type], bool] = {}


def wake_objects(store: Any) -> WakeObjects | None:
    """``store`` if it has the :class:`WakeObjects` capability, else None."""
    return store if _has(store, WakeObjects) else None


@runtime_checkable
class BlobHome(Protocol):
    """An optional capability: the store keeps blobs as files in a directory, each
    written whole under its digest (a SQLite plane file). Clients on the same machine
    read them there instead of over HTTP (``GET /v1/hello`` names the directory), and
    check them against their digests as they would an HTTP read."""

    def blob_home(self) -> tuple[str, str] | None:
        """The directory's absolute path and the id written in its ``.id`` file (a
        reader that finds the same id there is reading this plane's files); None when
        the store keeps no blob files."""
        ...

    def blob_writer(self, digest: str) -> BlobWriter | None:
        """A writer of the blob's file for a blob that arrives in pieces (an upload
        streamed to ``lakeshore serve``); None when the store keeps no blob files."""
        ...


class BlobWriter(Protocol):
    """One blob's file being written: pieces, then commit (renamed into place whole) or
    abort (nothing left behind)."""

    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


def blob_home(store: Any) -> tuple[str, str] | None:
    """Where ``store`` keeps its blob files and their directory's id, if it does."""
    return store.blob_home() if _has(store, BlobHome) else None


def blob_writer(store: Any, digest: str) -> BlobWriter | None:
    """A writer of one blob's file in ``store``, if it keeps blobs as files."""
    return store.blob_writer(digest) if _has(store, BlobHome) else None
