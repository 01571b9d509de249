"""Wake: how soon a claim waiting in another process sees a call submitted to a plane file.

    .venv/bin/python benchmarks/wake.py [--calls 300] [--gaps 0.003,0.2]

A child process holds a claim (a blocking wait of up to 5 s, made again as each ends) on
a queue of a fresh plane file; this process submits one call at a time to the same file
and times each from before its submit to the child's claim returning it (both read the
machine's monotonic clock). ``--gaps`` are the pauses between calls: a short one keeps
the file busy, a long one lets the child's poller go back to sleep (with a short one, a call
that arrives before the child's next claim waits is claimed at once, not woken for).
Prints p50 / p90 / max of each. Run by hand; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

from dreamlake.lakeshore.plane import Plane, QueueSpec, Submission
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.submit import new_id
from dreamlake.lakeshore.wire import encode_ref_call

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
from common import percentile  # noqa: E402

PAYLOAD = encode_ref_call("math:sqrt", (4.0,), {}).payload


def claimer(path: str, calls: int, out: multiprocessing.Queue[tuple[str, float]]) -> None:
    """The other process: claim each call as it comes, telling when it was claimed."""
    plane = Plane(SqliteStore(path))
    try:
        for _ in range(calls):
            claims = []
            while not claims:
                claims = plane.claim(["wake"], "wake-bench", wait=5.0)
            out.put((claims[0].id, time.monotonic()))
            # (done with: a lease left to run out would hand it back to be claimed again)
            plane.complete(claims[0].id, claims[0].lease_token, b"")
    finally:
        plane.close()


def measure(path: str, calls: int, gap: float) -> list[float]:
    """Milliseconds from each submit to its claim in the other process."""
    out: multiprocessing.Queue[tuple[str, float]] = multiprocessing.Queue()
    child = multiprocessing.Process(target=claimer, args=(path, calls, out))
    child.start()
    plane = Plane(SqliteStore(path))
    try:
        time.sleep(0.5)  # (the child's claim is waiting)
        took = []
        for _ in range(calls):
            inv = new_id()
            began = time.monotonic()
            plane.submit([Submission(inv, "wake", PAYLOAD)])
            claimed, at = out.get(timeout=30)
            assert claimed == inv, (claimed, inv)
            took.append((at - began) * 1e3)
            time.sleep(gap)
        return took
    finally:
        plane.close()
        child.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--gaps", default="0.003,0.2")
    args = parser.parse_args()
    for gap in (float(g) for g in args.gaps.split(",") if g):
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "plane.db")
            setup = Plane(SqliteStore(path))
            setup.ensure_queue(QueueSpec("wake"))
            setup.close()
            took = measure(path, args.calls, gap)
        print(
            f"gap {gap * 1e3:6.0f} ms: submit → claim in another process p50 "
            f"{percentile(took, 0.5):.2f} / p90 {percentile(took, 0.9):.2f} / "
            f"max {max(took):.2f} ms ({len(took)} calls)"
        )


if __name__ == "__main__":
    main()
