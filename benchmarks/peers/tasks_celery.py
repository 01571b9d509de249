"""Celery's side: Redis broker and Redis result backend, pickle (bytes travel as bytes).

Workers: ``celery -A tasks_celery worker -P solo`` (one process each, jobs run in it).
"""

from __future__ import annotations

import os

from celery import Celery

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("bench", broker=URL, backend=URL)
app.conf.update(
    task_serializer="pickle",
    result_serializer="pickle",
    accept_content=["pickle", "json"],
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
)


@app.task
def square(x: int) -> int:
    return x * x


@app.task
def nbytes(b: bytes) -> int:
    return len(b)
