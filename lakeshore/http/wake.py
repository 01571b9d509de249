"""What an idle worker watches instead of asking the plane: wake objects.

Contract: a plane whose store has wake objects (the DynamoDB + S3 plane) answers an
empty claim at once with ``wake``: a presigned GET URL and the current ETag of one
small object per queue, the seconds between looks (``interval``), the seconds after
which to claim anyway (``fallback``) and, when a scheduled invocation comes due sooner,
``due_in``. :class:`WakeWatch` keeps that across claim calls: until the fallback (or
``due_in``) passes, a claim only GETs the objects with ``If-None-Match`` every
``interval`` seconds (a 304 each: an S3 GET, no API request, no function) and claims
again as soon as one answers anything else — a new ETag (a submit woke the queue), a
403 (the URL expired), a 404 or an error. Planes without wake objects never send
``wake``: their claims long-poll as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["WakeWatch"]

#: the shortest interval and fallback a plane's answer is taken at (a bad answer must
#: not turn a worker into a busy loop)
MIN_INTERVAL = 0.05
MIN_FALLBACK = 0.1


def _seconds(raw: Any, floor: float) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    return max(floor, float(raw))


@dataclass
class WakeWatch:
    """The wake objects of one set of queues, and when to look at them next."""

    #: queue → (presigned GET URL, ETag it had when the plane answered)
    objects: dict[str, tuple[str, str]]
    interval: float
    #: monotonic time after which the worker claims anyway
    claim_at: float
    #: monotonic time of the next look
    next_look: float

    @classmethod
    def from_answer(cls, raw: Any, now: float) -> WakeWatch | None:
        """The watch a claim answer's ``wake`` asks for (None if it has none or it is
        malformed: then the worker claims as on any other plane)."""
        if not isinstance(raw, Mapping):
            return None
        urls, etags = raw.get("urls"), raw.get("etags")
        interval = _seconds(raw.get("interval"), MIN_INTERVAL)
        fallback = _seconds(raw.get("fallback"), MIN_FALLBACK)
        if not isinstance(urls, Mapping) or not isinstance(etags, Mapping):
            return None
        if not urls or interval is None or fallback is None:
            return None
        objects = {
            str(q): (str(u), str(etags.get(q) or "")) for q, u in urls.items() if isinstance(u, str)
        }
        if len(objects) != len(urls):
            return None
        due_in = _seconds(raw.get("due_in"), 0.0)
        if due_in is not None:
            fallback = min(fallback, due_in)
        return cls(objects, interval, now + fallback, now + interval)

    def expired(self, now: float) -> bool:
        return now >= self.claim_at

    def look(self, get: Callable[[str, str], int]) -> bool:
        """GET every object (``get(url, etag)`` → HTTP status); True as soon as one
        is not a 304 (changed, expired, gone or failing: claim). Schedules the next
        look ``interval`` after this one."""
        self.next_look = time.monotonic() + self.interval
        return any(get(url, etag) != 304 for url, etag in self.objects.values())
