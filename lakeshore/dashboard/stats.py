"""Per-minute throughput and queue time of a queue, read back from the store.

Nothing is kept in memory between calls (a Lambda keeps none worth trusting): each call
scans the queue's invocations submitted since twice ``window`` ago, starting from the id
that time stands for (ids are time-ordered), and buckets what it finds by the plane's
clock. So an invocation that waited longer than ``window`` before it was claimed is
not counted, and a scan stops after ``cap`` records (``truncated`` says so).
"""

from __future__ import annotations

import time
from typing import Any

from ..plane import Plane
from ..plane.model import Invocation, State
from ..submit import encode_id

__all__ = ["id_floor", "queue_stats"]

_PAGE = 500


def id_floor(at: float) -> str:
    """The smallest id :func:`~dreamlake.lakeshore.submit.new_id` could make at ``at``."""
    return encode_id(max(0, int(at * 1000)) << 80)


def _bucket(at: float | None, start: float, width: float, n: int) -> int | None:
    if at is None or at < start:
        return None
    i = int((at - start) // width)
    return i if i < n else None


def queue_stats(
    plane: Plane, queue: str, *, window: float = 3600.0, buckets: int = 60, cap: int = 20_000
) -> dict[str, Any]:
    """The last ``window`` seconds of ``queue`` in ``buckets`` equal slices, oldest first:
    ``submitted``, ``succeeded``, ``failed`` (failed or dead) per slice, and per slice the
    mean and max queue time (due → claimed, seconds) of the invocations claimed in it."""
    now = plane.now()
    width = window / buckets
    start = now - window
    submitted, succeeded, failed = [0] * buckets, [0] * buckets, [0] * buckets
    waits: list[list[float]] = [[] for _ in range(buckets)]
    # ids come from the submitting machine's wall clock; scan from well before the window
    cursor: str | None = id_floor(min(now, time.time()) - 2 * window)
    scanned = 0
    truncated = False
    while True:
        page: list[Invocation] = plane.list_invocations(queue, None, cursor, _PAGE)
        for rec in page:
            scanned += 1
            if (i := _bucket(rec.created_at, start, width, buckets)) is not None:
                submitted[i] += 1
            if (i := _bucket(rec.finished_at, start, width, buckets)) is not None:
                if rec.state is State.SUCCEEDED:
                    succeeded[i] += 1
                elif rec.state in (State.FAILED, State.DEAD):
                    failed[i] += 1
            i = _bucket(rec.started_at, start, width, buckets)
            if i is not None and rec.started_at is not None:
                waits[i].append(max(0.0, rec.started_at - rec.available_at))
        if len(page) < _PAGE:
            break
        if scanned >= cap:
            truncated = True
            break
        cursor = page[-1].id
    return {
        "name": queue,
        "start": start,
        "width": width,
        "submitted": submitted,
        "succeeded": succeeded,
        "failed": failed,
        "queue_time_mean": [sum(w) / len(w) if w else None for w in waits],
        "queue_time_max": [max(w) if w else None for w in waits],
        "scanned": scanned,
        "truncated": truncated,
    }
