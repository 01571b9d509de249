"""A blob file written whole: to a private name beside its final one, then renamed into
place, so a reader of ``<dir>/<digest>`` never sees part of one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from pathlib import Path

__all__ = ["BlobFile", "drop_stale_parts"]


class BlobFile:
    """One blob's file, written in pieces (:meth:`write`), then :meth:`commit` (renamed
    into place; flushed to disk first with ``sync``) or :meth:`abort` (nothing left)."""

    def __init__(self, path: Path, *, sync: bool = False) -> None:
        self.path = path
        self._sync = sync
        path.parent.mkdir(exist_ok=True)
        # (a private name per writer: two uploads of one blob never share a file)
        self._part = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        self._file = open(self._part, "xb")  # noqa: SIM115 (closed by commit or abort)
        # held while the part is written: a sweep that can take it knows nobody writes
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._file.write(data)

    def commit(self) -> None:
        """Put the file in place (a blob already there is kept: same digest, same bytes)."""
        try:
            if self._sync:
                self._file.flush()
                os.fsync(self._file.fileno())
            self._file.close()
            if self.path.exists():
                self._part.unlink(missing_ok=True)
            else:
                os.replace(self._part, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop what was written (idempotent)."""
        with contextlib.suppress(OSError):
            self._file.close()
        self._part.unlink(missing_ok=True)


def drop_stale_parts(directory: Path, *, idle: float = 3600.0) -> int:
    """Remove the parts of blobs whose writer died mid-write (a crash, a kill): a writer
    holds a lock on its part while it writes, so a part whose lock can be taken, and
    untouched for ``idle`` seconds, will never be finished. Returns how many went."""
    dropped = 0
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(".")]
    except OSError:
        return 0
    old = time.time() - idle
    for entry in entries:
        if len(entry.name.split(".")) != 4:  # ("", digest, writer's pid, suffix)
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_mtime >= old:
                continue
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (BlockingIOError: written)
                os.unlink(entry.path)
                dropped += 1
            finally:
                os.close(fd)
    return dropped
