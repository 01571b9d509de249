"""A blob file written whole: to a private name beside its final one, then renamed into
place, so a reader of ``<dir>/<digest>`` never sees part of one."""

from __future__ import annotations

import contextlib
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
    """Remove the parts of blobs whose writer died mid-write (a crash, a kill): each is
    named for its writer's process, and a part of a process that no longer runs here,
    untouched for ``idle`` seconds, will never be finished (the age guards a writer this
    machine cannot see: another container sharing the directory). Returns how many went."""
    dropped = 0
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(".")]
    except OSError:
        return 0
    old = time.time() - idle
    for entry in entries:
        fields = entry.name.split(".")  # "", digest, pid, suffix
        if len(fields) != 4 or not fields[2].isdigit() or _running(int(fields[2])):
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_mtime < old:
                os.unlink(entry.path)
                dropped += 1
    return dropped


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # (someone else's process: alive)
    return True
