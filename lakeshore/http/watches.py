"""Result watches over HTTP, coalesced: one long-poll per ``max_wait_ids`` watched ids.

Contract:

- Each watch fires its callback once per id, when the plane reports that id finished,
  from a poller thread (or from the thread that adds the watch, for records it hands in
  already finished). Other watches of the same ids fire too, as embedded. A callback
  that raises is logged and forgotten; it never stops the poller.
- An id the plane no longer has (its queue deleted with force) is dropped: its watches
  never fire. A poll that fails for any other reason is retried with backoff for as
  long as the transport is open; there is nobody to raise to.
- ``close()`` ends every poller (each closes its own connection); adding a watch after
  it raises :class:`LakeshoreError`.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..errors import LakeshoreError, UnknownInvocation
from ..plane.changes import Watch, due_watches
from ..plane.model import FINISHED, Invocation
from .answers import decode_map, expect_ok
from .connections import dropped, request_once
from .views import invocations_in

if TYPE_CHECKING:
    from ..transport import Unwatch
    from .transport import HttpTransport

__all__ = ["Watches"]

# The package's logger, as before the split into modules: one name to configure.
log = logging.getLogger(__package__)

#: after a kick, the next long-poll waits this long for more new watches (seconds) ...
_COALESCE = 0.01
#: ... and as long again while each such wait brought this many more (a burst still
#: being added), at most ``_COALESCE_MAX`` in all: ``asyncio.gather`` over thousands of
#: results adds one watch every few microseconds, and each cut poll's ids were still all
#: read by the plane, which answered into a closed socket; a steady stream of watches
#: (one every few milliseconds) polls as often as before
_BURST = 20
_COALESCE_MAX = 0.2
#: after a poll that returned results, give other finishing ids a moment (seconds) ...
_LINGER = 0.005
#: ... and more when many are watched: each poll carries every id, so polling at once
#: after each handful of results would send a large request for a few answers
_LINGER_PER_ID = 1e-5
_LINGER_MAX = 0.1
#: a poller thread with nothing to watch for this long ends (and closes its connection)
_IDLE_EXIT = 10.0


class Watches:
    """Every watch of one transport, awaited by one long-poll per ``max_wait_ids`` ids.

    A poller thread long-polls ``POST /v1/invocations/wait`` with all of its ids
    (``wait_timeout``, at most ``max_wait``), fires the watches of the finished ones and
    polls again with the rest. The wait is level-triggered (it answers with what *is*
    finished), so nothing is missed between two polls.

    A watch added while a poll is in flight that does not cover it *kicks* the poller:
    the poll's socket is shut down, so the poller stops waiting at once, waits
    ``_COALESCE`` (longer while a burst of watches is still coming, at most
    ``_COALESCE_MAX``) and polls again with the whole set on a fresh connection. So a
    new id is awaited within a round trip, and a burst of watches (``asyncio.gather``
    over many results) costs a poll or two, not one each.
    """

    def __init__(self, transport: HttpTransport) -> None:
        self.transport = transport
        self.cond = threading.Condition()
        self.closed = False
        self.entries: dict[str, list[Watch]] = {}
        self.owner: dict[str, _Poller] = {}
        self.pollers: list[_Poller] = []
        #: how many watches gave a poller new ids so far
        self.adds = 0
        #: set by close() (what a settling poller waits on: adds do not wake it)
        self.gone = threading.Event()

    def add(
        self, ids: list[str], callback: Callable[[Invocation], None], finished: list[Invocation]
    ) -> Unwatch:
        """Watch ``ids``; those among ``finished`` fire now, from this thread.

        Returns a function that removes the watch (or, given ids, those ids of it).
        Raises :class:`LakeshoreError` once the transport is closed.
        """
        entry = Watch(callback)
        done = {rec.id: rec for rec in finished if rec.state in FINISHED}
        due: list[tuple[Watch, Invocation]] = []
        with self.cond:
            if self.closed:
                raise LakeshoreError(f"{self.transport!r} is closed")
            kick: set[_Poller] = set()
            added = False
            cap = self.transport.limits.max_wait_ids
            for inv_id in ids:
                if inv_id in done:
                    entry.fired.add(inv_id)
                    due.append((entry, done[inv_id]))
                    continue
                self.entries.setdefault(inv_id, []).append(entry)
                if inv_id not in self.owner:
                    poller = self._poller_with_room(cap)
                    poller.ids.add(inv_id)
                    self.owner[inv_id] = poller
                    added = True
                    if poller.inflight is not None and inv_id not in poller.inflight:
                        kick.add(poller)
            if added:
                self.adds += 1
            for poller in kick:
                poller.kick()
            self.cond.notify_all()
        _fire(due)
        self.deliver(done.values())  # other watches of the same ids fire too, as embedded

        def unwatch(only: Iterable[str] | None = None, /) -> None:
            with self.cond:
                for inv_id in ids if only is None else only:
                    entries = self.entries.get(inv_id)
                    if entries and entry in entries:
                        entries.remove(entry)
                        if not entries:
                            self._forget(inv_id)

        return unwatch

    def deliver(self, records: Iterable[Invocation]) -> None:
        """Fire the watches of the finished records (unfinished ones are ignored)."""
        with self.cond:
            due = due_watches(records, self._forget)
        _fire(due)

    def drop(self, ids: Iterable[str]) -> None:
        """Stop polling for ids the plane no longer has (their watches never fire)."""
        with self.cond:
            for inv_id in ids:
                self._forget(inv_id)

    def _forget(self, inv_id: str) -> list[Watch]:
        """Stop watching ``inv_id``; returns the watches it had."""
        entries = self.entries.pop(inv_id, [])
        poller = self.owner.pop(inv_id, None)
        if poller is not None:
            poller.ids.discard(inv_id)
            # Watched again later, it is polled in full: the poller's cursor may be from
            # after its finish, which a poll since that cursor would never report.
            poller.checked.discard(inv_id)
        return entries

    def _poller_with_room(self, cap: int) -> _Poller:
        for poller in self.pollers:
            if len(poller.ids) < cap:
                return poller
        poller = _Poller(self)
        self.pollers.append(poller)
        poller.thread.start()
        return poller

    def stopping(self) -> bool:
        return self.closed

    def settle(self, window: float, burst: int, most: float) -> None:
        """Wait ``window`` seconds, and again while each wait brought ``burst`` or more
        watches of new ids, at most ``most`` seconds in all (cut short by close())."""
        deadline = time.monotonic() + most
        while True:
            seen = self.adds
            left = min(window, deadline - time.monotonic())
            if left <= 0 or self.gone.wait(left) or self.adds - seen < burst:
                return

    def sleep(self, seconds: float) -> None:
        """Sleep, cut short only by close()."""
        deadline = time.monotonic() + seconds
        with self.cond:
            while not self.closed and (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.gone.set()
            pollers = list(self.pollers)
            for poller in pollers:
                poller.kick()
            self.cond.notify_all()
        for poller in pollers:
            if poller.thread is not threading.current_thread():
                poller.thread.join(timeout=5)


def _fire(due: list[tuple[Watch, Invocation]]) -> None:
    for entry, rec in due:
        try:
            entry.callback(rec)
        except Exception:
            log.exception("a result watch callback raised")


class _Poller:
    """One thread long-polling one shard of the watched ids over its own connection."""

    def __init__(self, hub: Watches) -> None:
        self.hub = hub
        self.ids: set[str] = set()
        #: the ids of the poll in flight, None between polls
        self.inflight: frozenset[str] | None = None
        self.kicked = False
        self.conn: http.client.HTTPConnection | None = None
        self.thread = threading.Thread(target=self._run, name="lakeshore-watch", daemon=True)
        #: the plane's cursor from the last answer (None: the plane gives none)
        self.cursor: float | None = None
        #: ids some answer has covered in full; a poll of only these sends the cursor,
        #: so the plane reads what finished since rather than every id
        self.checked: set[str] = set()

    def kick(self) -> None:
        """End the poll in flight now (called with the hub's lock held)."""
        if self.inflight is None or self.kicked:
            return
        self.kicked = True
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            # The plain socket's shutdown, also under TLS: the reader sees EOF at once.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            if self.conn is not None:
                self.conn.close()

    def _loop(self) -> None:
        hub, transport = self.hub, self.hub.transport
        failures = 0
        while True:
            with hub.cond:
                idle_until = time.monotonic() + _IDLE_EXIT
                while not self.ids and not hub.closed:
                    left = idle_until - time.monotonic()
                    if left <= 0:
                        hub.pollers.remove(self)
                        return
                    hub.cond.wait(left)
                if hub.closed:
                    return
            timeout = min(transport.wait_timeout, transport.limits.max_wait)
            try:
                conn = self._connect()
            except Exception as exc:
                failures = self._failed(exc, failures)
                continue
            # Snapshot only once connected: a kick can then always reach the socket.
            with hub.cond:
                if hub.stopping():
                    return
                snapshot = frozenset(self.ids)
                if not snapshot:
                    continue
                self.inflight, self.kicked = snapshot, False
            self.checked &= snapshot
            since = self.cursor if snapshot <= self.checked else None
            try:
                records = self._poll(conn, sorted(snapshot), timeout, since)
            except Exception as exc:
                kicked = self._settle()
                conn.close()
                if kicked:
                    failures = 0
                    hub.settle(_COALESCE, _BURST, _COALESCE_MAX)
                elif isinstance(exc, UnknownInvocation):
                    self._recheck(snapshot)
                else:
                    failures = self._failed(exc, failures)
                continue
            if self._settle():
                conn.close()  # the answer made it, but the socket was shut down after it
            failures = 0
            hub.deliver(records)
            if records:
                linger = min(_LINGER_MAX, _LINGER + _LINGER_PER_ID * len(snapshot))
                with hub.cond:
                    hub.cond.wait(linger)

    def _settle(self) -> bool:
        """End the poll in flight; whether it was kicked."""
        with self.hub.cond:
            kicked, self.inflight = self.kicked, None
        return kicked

    def _failed(self, exc: Exception, failures: int) -> int:
        """Back off after a failed poll (the watch has nobody to raise to: keep trying)."""
        failures += 1
        if failures == 3:
            log.warning("waiting for results from %r keeps failing: %s", self.hub.transport, exc)
        self.hub.sleep(max(self.hub.transport._backoff(min(failures, 10)), 1.0))
        return failures

    def _connect(self) -> http.client.HTTPConnection:
        transport = self.hub.transport
        if self.conn is None:
            self.conn = transport._new_conn(transport._origin)
        if self.conn.sock is not None and dropped(self.conn.sock):
            self.conn.close()
        if self.conn.sock is None:
            self.conn.connect()
        return self.conn

    def _poll(
        self,
        conn: http.client.HTTPConnection,
        ids: list[str],
        timeout: float,
        since: float | None,
    ) -> list[Invocation]:
        transport = self.hub.transport
        target = transport._target("/v1/invocations/wait")
        ask: dict[str, object] = {"ids": ids, "timeout": timeout}
        if since is not None:
            ask["since"] = since
        body, headers = transport._encode(target, ask)
        answer = request_once(conn, "POST", target, body, headers, transport.timeout + timeout)
        expect_ok(answer)
        got = decode_map(answer)
        cursor = got.get("cursor")
        self.cursor = float(cursor) if isinstance(cursor, int | float) else None
        if since is None:
            self.checked.update(ids)
        now = transport.now()
        return invocations_in(got, now)

    def _recheck(self, ids: frozenset[str]) -> None:
        """A wait refused an unknown id (a queue deleted with force): find it, drop it."""
        transport, gone, finished = self.hub.transport, [], []
        for inv_id in sorted(ids):
            try:
                rec = transport.get(inv_id)
            except UnknownInvocation:
                gone.append(inv_id)
                continue
            except LakeshoreError:
                continue
            if rec.state in FINISHED:
                finished.append(rec)
        self.hub.drop(gone)
        self.hub.deliver(finished)
