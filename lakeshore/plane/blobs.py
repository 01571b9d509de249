"""A blob that arrives in pieces (an upload streamed to ``lakeshore serve``): checked
against its digest as :meth:`Plane.put_blob <.core.Plane.put_blob>` checks a whole one,
and kept only if it matches."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from ..errors import InvalidRequest, PayloadTooLarge
from .store import BlobWriter

__all__ = ["BlobUpload"]


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
            raise InvalidRequest(f"blob {self.digest[:12]}… does not match its bytes")
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
