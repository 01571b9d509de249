"""Elasticity holds across processes: a fixed cap of N running invocations on a file
plane, with two worker processes of two threads each competing for work."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dreamlake.lakeshore as dls

HERE = Path(__file__).resolve().parent
CAP = 2

WORKER = """
import sys, threading
from pathlib import Path
import dreamlake.lakeshore as dls

plane, stop_file = sys.argv[1], Path(sys.argv[2])
dp = dls.Dispatch(plane)
q = dls.SyncQueue("capped", dispatch=dp)
options = {"stop": stop_file.exists, "poll": 0.05}
threads = [threading.Thread(target=dls.run_worker, args=(q,), kwargs=options) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def job(log: str, i: int) -> int:
    """Write when it starts and ends; the span it logs lies inside its lease."""
    with open(log, "a") as f:
        f.write(f"{time.time()} 1\n")
    time.sleep(0.03)
    with open(log, "a") as f:
        f.write(f"{time.time()} -1\n")
    return i


def max_overlap(log: Path) -> int:
    events = sorted(
        (float(t), int(d)) for t, d in (line.split() for line in log.read_text().splitlines())
    )
    running = peak = 0
    for _, delta in events:  # at equal times, ends (-1) sort before starts (1)
        running += delta
        peak = max(peak, running)
    return peak


def test_fixed_elasticity_caps_running_invocations_across_processes(tmp_path: Path) -> None:
    # Given a capped queue on a file plane and 24 jobs that log their running spans
    plane = str(tmp_path / "plane.db")
    log = tmp_path / "spans.log"
    stop = tmp_path / "stop"
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("capped", dispatch=dp, elasticity={"kind": "fixed", "max": CAP})
        ids = [q.submit(job, str(log), i) for i in range(24)]
        # When two worker processes with two threads each drain it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
        procs = [
            subprocess.Popen([sys.executable, "-c", WORKER, plane, str(stop)], env=env)
            for _ in range(2)
        ]
        try:
            results = [q.result(inv, timeout=60) for inv in ids]
        finally:
            stop.touch()
            for p in procs:
                p.wait(timeout=30)
    # Then every job ran, and never more than CAP at once
    assert results == list(range(24))
    assert max_overlap(log) <= CAP
    assert max_overlap(log) == CAP, "the cap was never reached: the test proves nothing"
