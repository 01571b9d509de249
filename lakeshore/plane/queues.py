"""Queue administration: create-or-check, list with counts, change, remove, prune."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..errors import InvalidRequest, QueueNotFound
from .base import PlaneBase
from .kinds import (
    anneal_origin,
    check_kind_settings,
    check_settings,
    check_spec_retry,
    validate_spec,
)
from .model import QueueSpec, State
from .store import wake_objects

__all__ = ["QueueOps"]

_log = logging.getLogger("dreamlake.lakeshore.plane")


class QueueOps(PlaneBase):
    def ensure_queue(
        self, spec: QueueSpec, *, create: bool = True, check: Iterable[str] = ()
    ) -> QueueSpec:
        """Return the queue, creating it from ``spec`` when missing and ``create``.

        Raises :class:`QueueMismatch` when it exists and any setting named in ``check``
        differs from ``spec``; :class:`QueueNotFound` when missing and not ``create``.
        """
        validate_spec(spec)
        check_spec_retry(spec)
        stored = self.store.get_queue(spec.name)
        if stored is None:
            if not create:
                raise QueueNotFound(f"queue {spec.name!r} does not exist (strict mode)")
            now = self.clock.now()
            stored = self.store.put_queue(anneal_origin(spec, now, 0), now)
            self._wake_created(spec.name)
        check_settings(spec, stored, check)
        return stored

    def _wake_created(self, name: str) -> None:
        """A queue just made: on a store with wake objects, workers may watch its object
        since before it existed (a queue that does not exist has no idle mark to set),
        so it is rewritten whoever made the queue (an API submit or ``PUT``, the
        ``aws://`` transport). Best effort, as :meth:`wake_idle`."""
        wakes = wake_objects(self.store)
        if wakes is None:
            return
        try:
            wakes.wake(name, created=True)
        except Exception:
            _log.warning("waking new queue %r failed", name, exc_info=True)

    def list_queues(self) -> list[dict[str, Any]]:
        """Every queue with its last activity (submit or claim) and counts by state."""
        return [
            {"spec": spec, "last_activity": last, "counts": self.counts(spec.name)}
            for spec, last in self.store.list_queues()
        ]

    def prune_queues(self, older_than: float) -> list[str]:
        """Remove queues idle for ``older_than`` seconds with nothing pending or running.

        Their finished invocations stay until retention ends. Returns the names removed.
        """
        now = self.clock.now()
        removed = []
        for spec, last in self.store.list_queues():
            if last <= now - older_than and self._drained(spec.name, now):
                self.store.delete_queue(spec.name, invocations=False)
                removed.append(spec.name)
        return removed

    def counts(self, name: str) -> dict[str, int]:
        """Invocations of a queue by public state (``scheduled`` split from pending)."""
        raw = self.store.counts(name, self.clock.now())
        return {s.value: raw.get(s.value, 0) for s in State}

    def update_queue(self, name: str, **settings: Any) -> QueueSpec:
        """Change a queue's settings live (``temperature``, ``anneal``, ``elasticity``,
        ...). A new ``anneal`` schedule starts now."""
        spec = self.get_queue(name)
        unknown = set(settings) - set(spec.settings())
        if unknown:
            raise InvalidRequest(f"unknown queue settings: {', '.join(sorted(unknown))}")
        new = QueueSpec(name=name, **{**spec.settings(), **settings})
        check_kind_settings(new.kind, settings)
        validate_spec(new)
        if "retry" in settings:
            check_spec_retry(new)
        now = self.clock.now()
        if "anneal" in settings or "temperature" in settings:
            new = anneal_origin(new, now, self.store.queue_counter(name, 0))
        if not self.store.replace_queue(new, now):
            raise QueueNotFound(f"queue {name!r} does not exist")
        self._caps.pop(name, None)  # (its running cap as set now)
        self._changes.notify()
        self.wake_idle([name])  # (its running cap raised, say: its idle workers look again)
        return new

    def delete_queue(self, name: str, *, force: bool = False) -> int:
        """Remove a queue. Without ``force`` only when nothing is pending or running."""
        self.get_queue(name)
        if not force:
            raw = self.store.counts(name, self.clock.now())
            busy = raw.get("pending", 0) + raw.get("scheduled", 0) + raw.get("running", 0)
            if busy:
                raise InvalidRequest(
                    f"queue {name!r} has {busy} pending or running invocations; delete it"
                    " with force to drop them too (--force, force=true, force=True)"
                )
        gone = self.store.delete_queue(name)
        self._caps.pop(name, None)
        self._changes.removed()
        return gone
