"""What every part of the plane shares: its settings, its store and clock, and the
reads the other parts build on."""

from __future__ import annotations

import random
import threading

from ..clock import Clock
from ..errors import QueueNotFound, UnknownInvocation
from .changes import Changes
from .model import Invocation, QueueSpec
from .store import Store

__all__ = ["PlaneBase"]


class PlaneBase:
    """State and shared reads of a :class:`~.core.Plane` (see there for the settings)."""

    store: Store
    clock: Clock
    lease_seconds: float
    max_attempts: int
    retention: float
    tombstone: float
    sweep_interval: float
    _rng: random.Random
    _inline_limit: int
    _changes: Changes
    _next_sweep: float
    _next_purge: float
    _sweep_lock: threading.Lock
    _touched: dict[str, float]

    def now(self) -> float:
        return self.clock.now()

    def get_queue(self, name: str) -> QueueSpec:
        spec = self.store.get_queue(name)
        if spec is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        return spec

    def get(self, inv_id: str) -> Invocation:
        """The record of one invocation. Raises :class:`UnknownInvocation`."""
        rec = self.store.get(inv_id)
        if rec is None:
            raise UnknownInvocation(f"no invocation {inv_id!r} on this plane")
        return rec

    def _touch(self, queue: str, now: float) -> None:
        """Record activity on a queue, at most once a second per queue and plane."""
        if self._touched.get(queue, -1.0) + 1.0 <= now:
            self._touched[queue] = now
            self.store.touch_queue(queue, now)

    def _drained(self, name: str, now: float) -> bool:
        raw = self.store.counts(name, now)
        return not (raw.get("pending", 0) + raw.get("scheduled", 0) + raw.get("running", 0))
