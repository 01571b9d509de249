"""Sleeping until a file is written, by any process of this machine (Linux inotify).

The poller of a SQLite plane file (:mod:`..plane.changes`) asks SQLite for the file's
change marker to see other processes' commits. Without a way to be told of a write it
has to ask every few milliseconds while anybody waits — an idle worker's whole cost. With
a :class:`FileWatch` on the file's write-ahead log it sleeps until the log is written
(every commit appends to it), then looks.

Only where the kernel tells of writes (Linux, and only while the process may open one
more inotify instance: ``fs.inotify.max_user_instances``); elsewhere :func:`watch_file`
answers None and the poller keeps its pace. ctypes over libc, no dependency: inotify is
three system calls.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import sys
from pathlib import Path

__all__ = ["FileWatch", "watch_file"]

_IN_MODIFY = 0x00000002
_IN_Q_OVERFLOW = 0x00004000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
#: struct inotify_event: wd, mask, cookie, len (then ``len`` bytes of name)
_EVENT = struct.Struct("iIII")


class FileWatch:
    """Tells when the file it watches was written (by any process)."""

    def __init__(self, fd: int, settle: float = 0.0) -> None:
        self._fd = fd
        #: seconds a write may take to show after it is told (a commit is told at its
        #: first write to the log and seen once whole: longer when each commit syncs)
        self.settle = settle
        #: :meth:`interrupt` writes here to end a :meth:`wait` at once
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poll = select.poll()  # (not select(): an fd past 1023 is fine)
        self._poll.register(fd, select.POLLIN)
        self._poll.register(self._wake_r, select.POLLIN)

    def wait(self, timeout: float) -> bool:
        """Block until the file is written, ``timeout`` seconds pass or
        :meth:`interrupt` is called: whether it was written (every write since the
        last call counts, once)."""
        if self.written():
            return True
        with contextlib.suppress(InterruptedError):
            # (poll() counts whole milliseconds: a shorter wait is one, unless a write
            # comes first; a sleep would not wake for one)
            self._poll.poll(max(int(timeout * 1000 + 0.999), 1))
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass
        return self.written()

    def interrupt(self) -> None:
        """End a :meth:`wait` under way (from another thread; not after :meth:`close`)."""
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def written(self) -> bool:
        """Whether the file was written since the last call (never blocks)."""
        hit = False
        while True:
            try:
                data = os.read(self._fd, 4096)
            except (BlockingIOError, InterruptedError):
                return hit
            except OSError:  # closed
                return hit
            if not data:
                return hit
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                hit = hit or bool(mask & (_IN_MODIFY | _IN_Q_OVERFLOW))

    def close(self) -> None:
        fds = (self._fd, self._wake_r, self._wake_w)
        self._fd = self._wake_r = self._wake_w = -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def watch_file(path: str | Path, settle: float = 0.0) -> FileWatch | None:
    """A watch of writes to ``path``, or None where the kernel cannot tell of them (not
    Linux, no inotify instance left, no such file)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # (here: ~1.5 ms that every importer of the SQLite store would pay)

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init1, add_watch = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    fd = int(init1(_IN_NONBLOCK | _IN_CLOEXEC))
    if fd < 0:
        return None  # (EMFILE: this user's inotify instances are all taken)
    if int(add_watch(fd, os.fsencode(str(path)), _IN_MODIFY)) < 0:
        os.close(fd)
        return None
    try:
        return FileWatch(fd, settle)
    except OSError:  # (no descriptor left for its pipe)
        os.close(fd)
        return None
