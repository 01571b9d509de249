"""Hand-off: what passing a call between two threads costs, on one core and on two.

    .venv/bin/python benchmarks/handoff.py [--runs 3] [--calls 3000]

Embedded B (``Dispatch(":memory:")`` with 2 worker threads in the producer's process)
hands each call to a worker thread and its result back: two thread wake-ups a call.
This measures, in fresh processes, alternating, ``--runs`` times each:

- ``pingpong``: a bare round trip between two Python threads over a
  ``threading.Condition`` (the floor of those two wake-ups, no plane at all);
- ``embedded``: workload B on the embedded plane, as ``compare.py`` runs it;

each with the process free to use every CPU and pinned to one (``sched_setaffinity``,
which its threads inherit). Prints the medians of the runs' p50s. On a machine where
waking a thread on another core is dear (a small VM), the gap between the two columns
is that cost; the pinned column is the plane's own work. Run by hand (Linux); the
machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import dreamlake.lakeshore as dls

KINDS = ("pingpong", "embedded")


@dls.udf(queue="bench")
def square(x: int) -> int:
    return x * x


def pingpong(calls: int) -> list[float]:
    """Round trips between this thread and another over one condition."""
    cond = threading.Condition()
    turn = [0]

    def other() -> None:
        for _ in range(calls):
            with cond:
                while turn[0] != 1:
                    cond.wait()
                turn[0] = 0
                cond.notify()

    t = threading.Thread(target=other)
    t.start()
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        with cond:
            turn[0] = 1
            cond.notify()
            while turn[0] != 0:
                cond.wait()
        lat.append(time.perf_counter() - t0)
    t.join()
    return lat


def embedded(calls: int) -> list[float]:
    """Workload B on ``Dispatch(":memory:")`` with 2 worker threads (as compare.py)."""
    dp = dls.Dispatch(":memory:")
    q = dls.SyncQueue("bench", dispatch=dp)
    stop = threading.Event()
    workers = [
        threading.Thread(target=dls.run_worker, args=(q,), kwargs={"stop": stop.is_set})
        for _ in range(2)
    ]
    for w in workers:
        w.start()
    try:
        for i in range(300):  # warm-up
            q.result(square.submit(i, _dispatch=dp), timeout=30)
        lat = []
        for i in range(calls):
            t0 = time.perf_counter()
            v = q.result(square.submit(i, _dispatch=dp), timeout=30)
            lat.append(time.perf_counter() - t0)
            if v != i * i:
                raise SystemExit(f"square({i}) = {v}")
        return lat
    finally:
        stop.set()
        for w in workers:
            w.join()


def child(kind: str, pinned: bool, calls: int) -> None:
    if pinned:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    run: Callable[[int], list[float]] = {"pingpong": pingpong, "embedded": embedded}[kind]
    lat = sorted(run(calls))
    print(json.dumps({"p50_ms": lat[len(lat) // 2] * 1e3}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--pinned", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.pinned, args.calls)
        return 0
    cpus = len(os.sched_getaffinity(0))
    p50s: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.runs):
        for kind in KINDS:
            for pinned in (False, True):
                cmd = [sys.executable, __file__, "--child", kind, "--calls", str(args.calls)]
                out = subprocess.run(
                    cmd + (["--pinned"] if pinned else []),
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                p50s.setdefault((kind, pinned), []).append(json.loads(out)["p50_ms"])
    print(f"p50 ms, median of {args.runs} runs ({args.calls} calls each)")
    print(f"| | {cpus} CPUs | 1 CPU | runs ({cpus} CPUs) | runs (1 CPU) |")
    print("| --- | --- | --- | --- | --- |")
    for kind in KINDS:
        free, one = p50s[(kind, False)], p50s[(kind, True)]
        print(
            f"| {kind} | {statistics.median(free):.3f} | {statistics.median(one):.3f} "
            f"| {' / '.join(f'{v:.3f}' for v in free)} | {' / '.join(f'{v:.3f}' for v in one)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
