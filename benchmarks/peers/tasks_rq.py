"""RQ's side: functions the workers import by name (``tasks_rq.square``).

Workers: ``rq worker --worker-class rq.SimpleWorker`` (jobs run in the worker process, no
fork per job); the default pickle serializer.
"""

from __future__ import annotations


def square(x: int) -> int:
    return x * x


def nbytes(b: bytes) -> int:
    return len(b)
