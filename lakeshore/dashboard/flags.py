"""A queue's paused flag, kept in the store beside the plane's records.

The plane core has no notion of a paused queue, so the API keeps the flag itself: one
record per queue in the store's data-key table under a name no client can write (data
keys never start with a space), read back in one batched call and cached for a moment.
A paused queue still takes submits; the API hands out none of its invocations until it
is resumed. Workers on an embedded plane or on ``aws://`` (which skip the API) are not
held back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from ..plane import Plane

__all__ = ["PREFIX", "PauseFlags"]

#: the data key of a queue's flag: a leading space, which validate_key refuses to clients
PREFIX = " lakeshore:paused:"
_PAUSED, _RUNNING = "paused", "running"


class PauseFlags:
    """Read and write the paused flags of ``plane``'s queues.

    Reads are cached for ``ttl`` seconds per queue (a claim reads the flags of the
    queues it names: on DynamoDB that is a request), so a pause takes effect on other
    API processes within ``ttl``; in this process at once.
    """

    def __init__(
        self, plane: Plane, *, ttl: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._plane = plane
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, bool]] = {}

    def set_paused(self, queue: str, paused: bool) -> None:
        self._plane.store.put_data_key(
            PREFIX + queue, _PAUSED if paused else _RUNNING, self._plane.now()
        )
        with self._lock:
            self._cache[queue] = (self._clock() + self._ttl, paused)
        if paused:  # claims parked on it are handed no more calls (see Changes.reserve)
            self._plane.changes.withdraw(queue)
        else:  # claims waiting on other queues may take this one's work now
            self._plane.changes.notify(queues=[queue])

    def paused(self, queues: Iterable[str], *, fresh: bool = False) -> set[str]:
        """The queues among ``queues`` that are paused (``fresh``: read from the store,
        not the cache)."""
        names = list(dict.fromkeys(queues))
        now = self._clock()
        with self._lock:
            known = {q: v for q in names if not fresh and (v := self._cache.get(q)) and v[0] > now}
        missing: Sequence[str] = [q for q in names if q not in known]
        if missing:
            found = self._plane.store.get_data_keys([PREFIX + q for q in missing])
            with self._lock:
                for q in missing:
                    value = found.get(PREFIX + q) == _PAUSED
                    self._cache[q] = (now + self._ttl, value)
                    known[q] = (now + self._ttl, value)
        return {q for q, (_, value) in known.items() if value}
