"""Load: a deep queue on ``lakeshore serve`` stays responsive.

    .venv/bin/python benchmarks/load.py [--queued 100000] [--samples 50]

Queues ``--queued`` invocations (batched submits over HTTP), then times, with the queue
that deep: queue listing with counts, one page of the invocation listing, a claim, a
complete, and a submit made while the plane sweeps a burst of expired leases.
Prints medians and p99 in milliseconds. Run by hand; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.plane import QueueSpec, Submission
from dreamlake.lakeshore.server import serve_in_thread
from dreamlake.lakeshore.submit import new_id
from dreamlake.lakeshore.wire import encode_ref_call, encode_result


def timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    payload = encode_ref_call("math:sqrt", (4.0,), {}).payload
    with (
        tempfile.TemporaryDirectory() as tmp,
        serve_in_thread(Path(tmp) / "plane.db") as (url, admin),
        dls.Dispatch(url, token=admin) as dp,
    ):
        t = dp.transport
        t.ensure_queue(QueueSpec("deep"))
        t0 = time.perf_counter()
        for start in range(0, args.queued, 500):
            n = min(500, args.queued - start)
            t.submit([Submission(new_id(), "deep", payload) for _ in range(n)])
        took = time.perf_counter() - t0
        print(f"queued {args.queued:,} in {took:.1f} s ({args.queued / took:,.0f}/s)")
        result = encode_result(2.0, prefer_msgpack=True)[0]

        def claim_complete() -> None:
            (c,) = t.claim(["deep"], "bench")
            t.complete(c.id, c.lease_token, result)

        rows = {
            "queues ls (counts)": lambda: t.list_queues(),
            "invocations ls (100)": lambda: t.list_invocations("deep", "pending", None, 100),
            "claim + complete": claim_complete,
            "submit one": lambda: t.submit([Submission(new_id(), "deep", payload)]),
        }
        for name, fn in rows.items():
            p50, p99 = timed(fn, args.samples)
            print(f"  {name:<22} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms")
        # a burst of leases that expire at once, swept while a producer submits
        for _ in range(20):
            t.claim(["deep"], "bench", limit=100, lease_seconds=1)
        time.sleep(1.5)
        p50, p99 = timed(lambda: t.submit([Submission(new_id(), "deep", payload)]), 50)
        print(f"  {'submit while sweeping':<22} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms")


if __name__ == "__main__":
    main()
