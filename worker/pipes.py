"""The pipe between a process worker and each of its job processes.

A :class:`Pipe` wraps one end of a ``multiprocessing`` pipe. Its messages are tuples of
plain data (claims, outcomes, ids, output text), pickled with :mod:`pickle` itself. Two
costs of ``multiprocessing.connection.Connection`` are left out, because both are paid
for every job on a busy worker:

- ``Connection.send`` builds a ``ForkingPickler`` for each message, copying its
  reducer table.
- ``Connection.poll`` and ``multiprocessing.connection.wait`` build a ``selectors``
  object on every call.

So :meth:`Pipe.ready` asks a ``select.poll`` object the pipe registered once, and
:func:`wait` builds one poll object from plain descriptors. The framing on the pipe is
``Connection``'s and the pickles are read by protocol, so either end may still be a bare
``Connection`` (this side pickles with the highest protocol, it with its default).

Contract: :meth:`Pipe.ready` is true when a message is waiting or the other end has
closed (``recv`` then raises ``EOFError``), as ``Connection.poll()`` is.
"""

from __future__ import annotations

import math
import pickle
import select
from collections.abc import Sequence
from typing import Any

__all__ = ["Pipe", "dumps", "wait"]


def dumps(msg: tuple[Any, ...]) -> bytes:
    """A message as it goes on a pipe (:meth:`Pipe.send_bytes` sends it as it is)."""
    return pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)


class Pipe:
    """One end of a worker's pipe to a job process (see the module)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._fd: int = conn.fileno()
        self._poll = select.poll()  # (poll(2): Linux and macOS, where workers run)
        self._poll.register(self._fd, select.POLLIN)

    def fileno(self) -> int:
        return self._fd

    def send(self, msg: tuple[Any, ...]) -> None:
        self.conn.send_bytes(dumps(msg))

    def recv(self) -> Any:
        return self.conn.recv()  # (pickle.loads of the buffer read, without a copy of it)

    def recv_bytes(self) -> bytes:
        data: bytes = self.conn.recv_bytes()
        return data

    def send_bytes(self, data: bytes) -> None:
        self.conn.send_bytes(data)

    def ready(self) -> bool:
        """Whether :meth:`recv` would return at once (or raise: the other end closed)."""
        if self.conn.closed:
            raise OSError("handle is closed")
        return bool(self._poll.poll(0))

    def close(self) -> None:
        self.conn.close()


def wait(objects: Sequence[Any], timeout: float | None) -> list[Any]:
    """Those of ``objects`` (pipes or file descriptors, such as a process's
    ``sentinel``) that are readable, waiting up to ``timeout`` seconds for one."""
    poller = select.poll()
    by_fd: dict[int, Any] = {}
    for obj in objects:
        fd = obj if isinstance(obj, int) else obj.fileno()
        by_fd[fd] = obj
        poller.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
    return [by_fd[fd] for fd, _ in poller.poll(ms)]
