"""Dramatiq's side: Redis broker and the Results middleware on Redis, pickle encoder.

Workers: ``dramatiq tasks_dramatiq --processes 2 --threads 1``.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

dramatiq.set_encoder(dramatiq.PickleEncoder())
broker = RedisBroker(url=URL)
broker.add_middleware(Results(backend=RedisBackend(url=URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, max_retries=0)
def square(x: int) -> int:
    return x * x


@dramatiq.actor(store_results=True, max_retries=0)
def nbytes(b: bytes) -> int:
    return len(b)
