"""Lakeshore figures: sequential round trip (B) and fan-out/gather (A).

    .venv/bin/python benchmarks/roundtrip.py [--runs 5] [--calls 2000] [--store memory|file|serve]

``memory`` and ``file`` are the embedded plane; ``serve`` starts ``lakeshore serve`` on
loopback (a SQLite file) and talks to it over HTTP, workers included.

B: one producer submits ``square(i)`` and waits for its result, one call at a time,
with two worker threads serving the queue; p50 and p99 of the round trip.
A: ``asyncio.gather`` over 2,000 submits with two worker threads; end-to-end jobs/s.
Each figure is the median of ``--runs`` runs; results are checked (sum of squares).
Run by hand: the machine is shared and noisy, so read medians, not single runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dreamlake.lakeshore as dls


@dls.udf(queue="bench")
def square(x: int) -> int:
    return x * x


@contextmanager
def _target(store: str, tmp: str) -> Iterator[tuple[str, str | None]]:
    if store == "memory":
        yield ":memory:", None
    elif store == "file":
        yield str(Path(tmp) / "plane.db"), None
    else:
        from dreamlake.lakeshore.server import serve_in_thread

        with serve_in_thread(Path(tmp) / "plane.db") as (url, admin):
            yield url, admin


@contextmanager
def plane(store: str, workers: int = 2) -> Iterator[dls.Dispatch]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        _target(store, tmp) as (target, token),
        dls.Dispatch(target, token=token) as dp,
    ):
        stop = threading.Event()
        q = dls.SyncQueue("bench", dispatch=dp)
        threads = [
            threading.Thread(target=dls.run_worker, args=(q,), kwargs={"stop": stop.is_set})
            for _ in range(workers)
        ]
        for t in threads:
            t.start()
        try:
            yield dp
        finally:
            stop.set()
            for t in threads:
                t.join()


def round_trips(dp: dls.Dispatch, n: int) -> list[float]:
    q = dls.SyncQueue("bench", dispatch=dp)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        assert q.result(square.submit(i, _dispatch=dp), timeout=30) == i * i
        out.append(time.perf_counter() - t0)
    return out


def fan_out(dp: dls.Dispatch, n: int) -> float:
    async def gather() -> list[int]:
        q = dls.Queue("bench", dispatch=dp)
        ids = [square.submit(i, _dispatch=dp) for i in range(n)]
        return await asyncio.gather(*(q.result(inv, timeout=120) for inv in ids))

    t0 = time.perf_counter()
    results = asyncio.run(gather())
    elapsed = time.perf_counter() - t0
    assert sum(results) == sum(i * i for i in range(n)), "wrong results"
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--round-trips", type=int, default=1000)
    parser.add_argument("--store", choices=["memory", "file", "serve"], default="memory")
    args = parser.parse_args()

    p50s, p99s, rates = [], [], []
    for _ in range(args.runs):
        with plane(args.store) as dp:
            round_trips(dp, 50)  # warm up
            lat = sorted(round_trips(dp, args.round_trips))
            p50s.append(lat[len(lat) // 2] * 1e3)
            p99s.append(lat[int(len(lat) * 0.99)] * 1e3)
        with plane(args.store) as dp:
            rates.append(fan_out(dp, args.calls))

    med = statistics.median
    print(f"plane: {args.store}, median of {args.runs} runs")
    print(f"  B sequential submit->result  p50 {med(p50s):.3f} ms   p99 {med(p99s):.3f} ms")
    print(f"  A fan-out/gather of {args.calls}, 2 worker threads  {med(rates):,.0f} jobs/s")


if __name__ == "__main__":
    main()
