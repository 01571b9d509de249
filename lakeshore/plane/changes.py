"""Wake-ups: claim waits and result watches without sleep-polling in one process.

Writes made through this plane object notify at once. When the store is shared with
other processes (a SQLite file, DynamoDB), one poller thread per plane watches the
store's change marker every ``store.poll_interval`` seconds while anybody waits, and
wakes them on a change.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from .model import FINISHED, Invocation
from .store import Store

__all__ = ["Changes"]

Callback = Callable[[Invocation], None]


class _Watch:
    """One watch over some ids; it fires once per id."""

    __slots__ = ("callback", "fired")

    def __init__(self, callback: Callback) -> None:
        self.callback = callback
        self.fired: set[str] = set()


class Changes:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._poll_interval = store.poll_interval
        self._cond = threading.Condition()
        self._generation = 0
        self._waiters = 0
        #: claim waiters that a finish may unblock (capped queues)
        self._finish_waiters = 0
        #: finishes seen so far (what :meth:`wait_finish` waits on), and its waiters
        self._finishes = 0
        self._finish_listeners = 0
        self._watches: dict[str, list[_Watch]] = defaultdict(list)
        self._poller: threading.Thread | None = None
        self._marker = 0
        self._closed = False

    # --- generic wake-ups --------------------------------------------------------
    @property
    def generation(self) -> int:
        return self._generation

    def notify(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, since: int, timeout: float, *, finishes: bool = False) -> None:
        """Block until something changed after generation ``since``, or ``timeout``.

        A finish (a record reaching a finished state) wakes only waiters that ask for
        ``finishes`` (claims on capped queues, which a finish may unblock): a claim wait
        on work to arrive is not woken by every job that ends.
        """
        with self._cond:
            if self._generation != since:
                return
            self._waiters += 1
            self._finish_waiters += finishes
            self._ensure_poller()
            try:
                self._cond.wait_for(lambda: self._generation != since or self._closed, timeout)
            finally:
                self._waiters -= 1
                self._finish_waiters -= finishes

    @property
    def finishes(self) -> int:
        return self._finishes

    def wait_finish(self, since: int, timeout: float) -> None:
        """Block until some record finished after count ``since`` (any record: the
        caller looks for its own), or ``timeout``, or the plane closes."""
        with self._cond:
            if self._finishes != since:
                return
            self._finish_listeners += 1
            self._ensure_poller()
            try:
                self._cond.wait_for(lambda: self._finishes != since or self._closed, timeout)
            finally:
                self._finish_listeners -= 1

    # --- result watches ------------------------------------------------------------
    def watch(self, ids: Iterable[str], callback: Callback) -> Callable[[], None]:
        entry = _Watch(callback)
        ids = list(ids)
        with self._cond:
            for inv_id in ids:
                self._watches[inv_id].append(entry)
            self._ensure_poller()

        def unwatch() -> None:
            with self._cond:
                for inv_id in ids:
                    entries = self._watches.get(inv_id)
                    if entries and entry in entries:
                        entries.remove(entry)
                        if not entries:
                            del self._watches[inv_id]

        return unwatch

    def finished(self, records: Iterable[Invocation]) -> None:
        """Deliver finished records to their watchers (each watch fires once)."""
        due: list[tuple[_Watch, Invocation]] = []
        records = list(records)
        with self._cond:
            for rec in records:
                if rec.state not in FINISHED:
                    continue
                for entry in self._watches.pop(rec.id, ()):
                    if rec.id not in entry.fired:
                        entry.fired.add(rec.id)
                        due.append((entry, rec))
            # Records not finished (retried: pending again) are new work for claims, and
            # a claim held back by a cap waits for finishes: both see a new generation.
            # A cursor wait listens to the finish count only (claim waits sleep on).
            new_work = self._finish_waiters or any(rec.state not in FINISHED for rec in records)
            finish = any(rec.state in FINISHED for rec in records)
            if finish:
                self._finishes += 1  # always: a cursor wait reads it before it looks
            if new_work:
                self._generation += 1
            if new_work or (finish and self._finish_listeners > 0):
                self._cond.notify_all()
        for entry, rec in due:
            entry.callback(rec)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every waiter: the plane is going away (waits return empty)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- cross-process polling -------------------------------------------------------
    def _ensure_poller(self) -> None:
        if not self._store.shared or self._closed:
            return
        if self._poller is None or not self._poller.is_alive():
            # Read the marker now, before the caller checks the records it waits for:
            # any commit after this point is then seen as a change.
            self._marker = self._store.change_marker()
            self._poller = threading.Thread(
                target=self._poll, name="lakeshore-changes", daemon=True
            )
            self._poller.start()

    def _busy(self) -> bool:
        return not self._closed and (
            self._waiters > 0 or self._finish_listeners > 0 or bool(self._watches)
        )

    def _poll(self) -> None:
        marker = self._marker
        idle_rounds = 0
        while True:
            with self._cond:
                if not self._busy():
                    idle_rounds += 1
                    if idle_rounds > 500 or self._closed:
                        self._poller = None
                        return
                else:
                    idle_rounds = 0
                self._cond.wait(self._poll_interval)
            try:
                now_marker = self._store.change_marker()
            except Exception:  # the store was closed under us
                return
            if now_marker == marker:
                continue
            marker = now_marker
            # Take the watched ids only after reading the marker: a watch added since
            # checked its records itself, after this change was committed.
            with self._cond:
                watched = list(self._watches)
            if watched:
                self.finished(self._store_get_many(watched))
            with self._cond:  # another process wrote: maybe work, maybe a finish
                self._finishes += 1
            self.notify()

    def _store_get_many(self, ids: list[str]) -> list[Any]:
        return [r for r in self._store.get_many(ids) if r.state in FINISHED]
