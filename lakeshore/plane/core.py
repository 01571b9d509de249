"""The plane core: every lifecycle rule of an invocation, in one place.

::

    submit ─▶ pending ──claim──▶ running ──complete──▶ succeeded
      │  (scheduled while       │   │  └──fail──▶ failed   (or back to pending: retry policy)
      │   its delay runs)       │   └──lease expires──▶ pending (attempt + 1) │ dead
      └──────────cancel─────────┴──cancel──▶ cancelled

Rules the core enforces (stores only persist and compare-and-set):

- A claim leases an invocation to one worker with a fresh lease token. Only the holder
  of the current token may heartbeat, complete or fail it, so a result is recorded
  exactly once even when execution happens more than once.
- A lease that runs out (no heartbeat) is swept: back to pending with its place in the
  queue kept, or ``dead`` once ``max_attempts`` claims have been made. A per-invocation
  ``timeout`` caps the lease: past it the invocation fails with a timeout error.
- A raise fails the invocation, unless its retry policy allows another try after a
  backoff. Worker death is always redelivered (up to ``max_attempts``).
- Submit is idempotent on the invocation id: the same id with the same request returns
  the existing invocation, with another request it is a conflict.
- Finished invocations keep their result for ``retention`` seconds; after that the plane
  answers "expired", which stays distinct from "unknown" for ``tombstone`` more seconds.

Every time comes from the injected clock; nothing here sleeps to let time pass.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from ..clock import Clock, SystemClock
from ..errors import InvalidRequest, NotFound
from .blobs import BlobUpload, put_checked
from .changes import Changes
from .daemons import DaemonOps
from .data import DataOps
from .model import Invocation
from .producers import ProducerOps, request_digest
from .queues import QueueOps
from .store import Store, blob_writer
from .workers import WorkerOps

__all__ = ["Plane", "request_digest"]


class Plane(QueueOps, ProducerOps, WorkerOps, DaemonOps, DataOps):
    """The control plane over one :class:`~.store.Store`.

    Thread-safe: every decision is a compare-and-set on the store, so any number of
    threads (and, on a shared store, processes) may call it at once. The rules live in
    parts: :mod:`.queues`, :mod:`.producers`, :mod:`.workers`, :mod:`.daemons` and
    :mod:`.data`.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        lease_seconds: float = 60.0,
        max_attempts: int = 3,
        retention: float = 7 * 86400.0,
        tombstone: float = 30 * 86400.0,
        sweep_interval: float = 1.0,
        rng: random.Random | None = None,
        inline_limit: int = 256 * 1024,
        keep_payload: bool = True,
    ) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.retention = retention
        self.tombstone = tombstone
        self.sweep_interval = sweep_interval
        self._rng = rng or random.Random()
        self._inline_limit = inline_limit
        self.keep_payload = keep_payload
        self._changes = Changes(cast(Store, _Shown(self)))
        self._next_sweep = 0.0
        self._next_purge = 0.0
        self._sweep_lock = threading.Lock()
        self._touched: dict[str, float] = {}
        self._caps: dict[str, tuple[float, bool]] = {}
        self.on_attempt_ended = None

    def inline_limit(self) -> int:
        return self._inline_limit

    @property
    def changes(self) -> Changes:
        """The plane's wake-ups (what a server holding waits on an event loop follows)."""
        return self._changes

    # ------------------------------------------------------------------ blobs
    def put_blob(self, digest: str, data: bytes) -> None:
        self.put_blobs({digest: data})

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed blobs. Each is checked against its digest first:
        one that does not match raises :class:`InvalidRequest` and none is stored (a
        large one is hashed while another thread writes its file: :func:`~.blobs.put_checked`)."""
        put_checked(self.store, blobs, self.clock.now())

    def blob_upload(self, digest: str, *, limit: int) -> BlobUpload:
        """A blob put in pieces, up to ``limit`` bytes: checked against its digest as
        :meth:`put_blobs` checks a whole one (see :class:`~.blobs.BlobUpload`)."""
        return BlobUpload(
            digest,
            limit=limit,
            writer=blob_writer(self.store, digest),
            keep=lambda data: self.store.put_blob(digest, data, self.clock.now()),
        )

    def get_blob(self, digest: str) -> bytes:
        data = self.store.get_blob(digest)
        if data is None:
            raise NotFound(f"no blob {digest!r} on this plane")
        return data

    def blob_url(self, digest: str, ttl: int = 3600) -> str:
        """A URL for the blob when the store serves blobs itself (S3); an embedded
        SQLite plane has none: read blobs through the SDK."""
        store_url = getattr(self.store, "blob_url", None)
        if store_url is None:
            raise InvalidRequest("this plane keeps blobs in its database: it has no URLs")
        if not self.store.has_blobs([digest]):
            raise NotFound(f"no blob {digest!r} on this plane")
        return str(store_url("GET", digest, ttl))

    def missing_blobs(self, digests: Iterable[str]) -> set[str]:
        wanted = set(digests)
        return wanted - self.store.has_blobs(wanted)

    def close(self) -> None:
        self._changes.close()
        self.store.close()


class _Shown:
    """The store as the change poller reads it: its records through
    :meth:`PlaneBase.visible`, so a watch never sees what the plane hides."""

    def __init__(self, plane: Plane) -> None:
        self._plane = plane
        self._store = plane.store
        self.shared = plane.store.shared
        self.poll_interval = plane.store.poll_interval

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        return self._plane._read_many(ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
