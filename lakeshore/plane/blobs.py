"""Blobs checked against their digests before the plane keeps them: whole ones
(:func:`put_checked`, what :meth:`Plane.put_blobs <.core.Plane.put_blobs>` does) and one
that arrives in pieces (:class:`BlobUpload`, an upload streamed to ``lakeshore serve``)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from ..errors import InvalidRequest, PayloadTooLarge
from .store import BlobWriter, blob_home, blob_writer

__all__ = ["HASH_BESIDE", "BlobUpload", "put_checked"]

#: a blob at least this large, bound for a file, has its file written on a thread of its
#: own while the calling thread hashes it: writing and hashing both let go of the GIL, so
#: with two cores the check takes no time of its own (a 1 MiB blob's hash ~0.5-0.9 ms,
#: its fresh file ~0.3 ms on a small VM, ~2.6 ms once the page cache is full of dirty
#: pages; the hash starts at once, the write a thread's wake-up later; smaller blobs are
#: not worth the hand-over)
HASH_BESIDE = 256 * 1024

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _writers() -> ThreadPoolExecutor:
    """The process's blob-writing threads (made on first use; a forked child makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lakeshore-blobs")
        return _pool


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # the parent's threads are not in a child


os.register_at_fork(after_in_child=_forget_pool)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _mismatch(digest: str) -> InvalidRequest:
    return InvalidRequest(f"blob {digest[:12]}… does not match its bytes")


def _write_part(store: Any, home: str, digest: str, data: bytes) -> BlobWriter | None:
    """On a writing thread: the blob written to its private part file, not yet named;
    None when its file is in the store's blob directory ``home`` already (nothing
    written). It never takes the store's lock: whoever waits for it may hold that."""
    if os.path.exists(os.path.join(home, digest)):
        return None
    writer = blob_writer(store, digest)
    if writer is None:
        return None
    try:
        writer.write(data)
    except BaseException:
        writer.abort()
        raise
    return writer


def put_checked(store: Any, blobs: Mapping[str, bytes], now: float) -> None:
    """Store content-addressed ``blobs`` in ``store``, each checked against its digest
    first: one that does not match raises :class:`InvalidRequest` and none is stored.

    A blob of :data:`HASH_BESIDE` bytes or more bound for a store that keeps blobs as
    files is written to its private part file by another thread while this one hashes
    it; the part is renamed into place only once every blob has matched, and dropped
    otherwise, so a reader never sees unchecked bytes under a blob's name. A blob whose
    file is there already is checked and not written again.
    """
    home = blob_home(store)
    parts: list[tuple[str, bytes, Future[BlobWriter | None]]] = []
    whole: dict[str, bytes] = {}
    try:
        for digest, data in blobs.items():
            if home is not None and len(data) >= HASH_BESIDE:
                writing = _writers().submit(_write_part, store, home[0], digest, data)
                parts.append((digest, data, writing))
            elif _sha256(data) != digest:
                raise _mismatch(digest)
            else:
                whole[digest] = data
        for digest, data, _ in parts:
            if _sha256(data) != digest:
                raise _mismatch(digest)
        written = [(digest, data, part.result()) for digest, data, part in parts]
    except BaseException:
        for _, _, part in parts:
            part.cancel()
        wait([part for _, _, part in parts])  # (no thread goes on writing a refused put)
        for _, _, part in parts:
            writer = None if part.cancelled() or part.exception() else part.result()
            if writer is not None:
                writer.abort()
        raise
    for digest, data, writer in written:
        if writer is None:
            whole[digest] = data  # (its file is there: put_blob keeps it once)
        else:
            writer.commit()
    for digest, data in whole.items():
        store.put_blob(digest, data, now)


class BlobUpload:
    """:meth:`write` the pieces in order, then :meth:`finish`; :meth:`abort` drops them.

    With a ``writer`` (a store that keeps blobs as files) each piece goes to the blob's
    file as it comes, so a blob of gigabytes is never held whole; without one they are
    kept in memory and handed to ``keep`` at the end. Over ``limit`` bytes,
    :meth:`write` raises :class:`PayloadTooLarge`; bytes that do not hash to the digest
    make :meth:`finish` raise :class:`InvalidRequest`. Either way nothing is stored.
    """

    def __init__(
        self,
        digest: str,
        *,
        limit: int,
        writer: BlobWriter | None,
        keep: Callable[[bytes], None],
    ) -> None:
        self.digest = digest
        self.limit = limit
        #: bytes written so far
        self.size = 0
        self._hash = hashlib.sha256()
        self._writer = writer
        self._keep = keep
        self._parts: list[bytes] = []
        self._ended = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._ended:
            raise InvalidRequest("the upload has ended")
        self.size += len(data)
        if self.size > self.limit:
            self.abort()
            raise PayloadTooLarge(f"blob over the {self.limit} byte limit")
        self._hash.update(data)
        if self._writer is not None:
            self._writer.write(data)
        else:
            self._parts.append(bytes(data))

    def finish(self) -> None:
        """Keep the blob if its bytes hash to its digest; refuse it otherwise."""
        if self._ended:
            raise InvalidRequest("the upload has ended")
        if self._hash.hexdigest() != self.digest:
            self.abort()
            raise _mismatch(self.digest)
        self._ended = True
        if self._writer is not None:
            self._writer.commit()
        else:
            data, self._parts = b"".join(self._parts), []
            self._keep(data)

    def abort(self) -> None:
        """Drop what was written (idempotent)."""
        self._ended = True
        self._parts = []
        if self._writer is not None:
            self._writer.abort()
