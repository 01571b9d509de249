"""Fleet daemons: long-running workers whose queues and concurrency live on the plane.

A daemon registers under an id it keeps across restarts; once the plane knows it, the
plane's queues and concurrency win over the daemon's start-up flags, so an operator's
``daemon update`` sticks. Each heartbeat returns the record as the plane has it — how
a running daemon learns of new queues, a new concurrency or a drain.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

from ..errors import InvalidRequest, NotFound
from .base import PlaneBase
from .kinds import check_queue_name
from .model import DaemonRecord

__all__ = ["MAX_CONCURRENCY", "DaemonOps"]

#: the most job slots a daemon may be given
MAX_CONCURRENCY = 10_000


def _check_concurrency(concurrency: int) -> None:
    if isinstance(concurrency, bool) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise InvalidRequest(f"concurrency must be 1 to {MAX_CONCURRENCY}")


class DaemonOps(PlaneBase):
    def register_daemon(
        self,
        name: str,
        *,
        daemon_id: str | None = None,
        queues: Sequence[str] = (),
        concurrency: int = 1,
        python: str = "",
        pickle_protocols: Sequence[int] = (),
        host: str = "",
    ) -> DaemonRecord:
        """Register (or re-register) a daemon; return the record it should follow."""
        for queue in queues:
            check_queue_name(queue)
        _check_concurrency(concurrency)
        now = self.clock.now()
        daemon_id = daemon_id or f"d-{secrets.token_hex(6)}"

        def register(old: DaemonRecord | None) -> DaemonRecord:
            protocols = pickle_protocols or (old.pickle_protocols if old else [])
            return DaemonRecord(
                id=daemon_id,
                name=name,
                host=host or (old.host if old else ""),
                queues=list(old.queues) if old else [str(q) for q in queues],
                concurrency=old.concurrency if old else concurrency,
                python=python or (old.python if old else ""),
                pickle_protocols=[int(p) for p in protocols],
                registered_at=old.registered_at if old else now,
                last_heartbeat=now,
                running=0,
                draining=False,
            )

        rec = self.store.change_daemon(daemon_id, register)
        assert rec is not None
        return rec

    def get_daemon(self, daemon_id: str) -> DaemonRecord:
        rec = self.store.get_daemon(daemon_id)
        if rec is None:
            raise NotFound(f"no daemon {daemon_id!r}")
        return rec

    def _change(self, daemon_id: str, change: Callable[[DaemonRecord], None]) -> DaemonRecord:
        """Change a daemon's record in place (a drain, an update or a removal landing at
        the same time is kept, not written over with what was read before it)."""

        def changed(rec: DaemonRecord | None) -> DaemonRecord | None:
            if rec is not None:
                change(rec)
            return rec

        rec = self.store.change_daemon(daemon_id, changed)
        if rec is None:
            raise NotFound(f"no daemon {daemon_id!r}")
        return rec

    def daemon_heartbeat(
        self, daemon_id: str, running: int | None = None, *, stopped: bool = False
    ) -> DaemonRecord:
        """A daemon is alive (``running`` jobs now); with ``stopped``, its last word: it
        is exiting of its own accord (its record then shows it stopped, not silent)."""
        now = self.clock.now()

        def beat(rec: DaemonRecord) -> None:
            rec.last_heartbeat = now
            if running is not None:
                rec.running = running
            rec.stopped_at = now if stopped else None
            if stopped:
                rec.running = 0

        return self._change(daemon_id, beat)

    def list_daemons(self) -> list[DaemonRecord]:
        return self.store.list_daemons()

    def update_daemon(
        self,
        daemon_id: str,
        *,
        add_queues: Sequence[str] = (),
        remove_queues: Sequence[str] = (),
        concurrency: int | None = None,
    ) -> DaemonRecord:
        """Change a daemon's queues or concurrency; it follows at its next heartbeat."""
        if not all(isinstance(q, str) and q for q in remove_queues):
            raise InvalidRequest("queues must be names")
        for queue in add_queues:
            check_queue_name(queue)
        if concurrency is not None:
            _check_concurrency(concurrency)

        def update(rec: DaemonRecord) -> None:
            queues = [q for q in rec.queues if q not in remove_queues]
            rec.queues = queues + [q for q in dict.fromkeys(add_queues) if q not in queues]
            if concurrency is not None:
                rec.concurrency = concurrency

        return self._change(daemon_id, update)

    def remove_daemon(self, daemon_id: str) -> bool:
        """Forget a daemon (one that stopped for good: a ``worker start`` that exits);
        whether there was one (a repeat, after a lost answer, finds none)."""
        return self.store.delete_daemon(daemon_id)

    def drain_daemon(self, daemon_id: str) -> DaemonRecord:
        """Ask a daemon to finish what it runs, claim nothing more, and exit."""

        def drain(rec: DaemonRecord) -> None:
            rec.draining = True

        return self._change(daemon_id, drain)
