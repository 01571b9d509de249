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

A worker that has just gone idle (its last claim had work) looks sooner:
:data:`FIRST_LOOK` seconds after the empty claim, then twice as long after each look, up
to ``interval`` (0.1, 0.3, 0.7, 1.5, 3.1 s... then every 4.5 s): the next call of a
producer that submits one call after another is picked up in a fraction of a second
instead of up to ``interval`` later, for five more S3 GETs each time the worker goes
idle. The empty claim at a fallback (a worker idle all along) keeps the steady pace.
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
#: seconds from an empty claim to the first look (the pace then doubles up to interval)
FIRST_LOOK = 0.1


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
    #: seconds from the next look to the one after (doubles up to ``interval``)
    pace: float = 0.0

    @classmethod
    def from_answer(cls, raw: Any, now: float, *, soon: bool = True) -> WakeWatch | None:
        """The watch a claim answer's ``wake`` asks for (None if it has none or it is
        malformed: then the worker claims as on any other plane); ``soon``: the worker
        has just gone idle, so it looks soon and then ever less often (see above)."""
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
        first = min(interval, max(MIN_INTERVAL, FIRST_LOOK)) if soon else interval
        return cls(objects, interval, now + fallback, now + first, min(interval, 2 * first))

    def expired(self, now: float) -> bool:
        return now >= self.claim_at

    def look(self, get: Callable[[str, str], int]) -> bool:
        """GET every object (``get(url, etag)`` → HTTP status); True as soon as one
        is not a 304 (changed, expired, gone or failing: claim). Schedules the next
        look: ``pace`` after this one, the pace doubling up to ``interval``."""
        pace = self.pace or self.interval
        self.next_look = time.monotonic() + pace
        self.pace = min(self.interval, 2 * pace)
        return any(get(url, etag) != 304 for url, etag in self.objects.values())
