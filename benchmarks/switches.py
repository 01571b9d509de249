"""Switches: where B's (or C's) CPU and context switches go, process by process, over ``serve``.

    .venv/bin/python benchmarks/switches.py [--calls 1000] [--runs 3] [--workload C]

Starts the ``ls-serve`` stack of ``compare.py`` (``lakeshore serve`` and 2 ``lakeshore
worker start`` processes), warms it up, then makes ``--calls`` sequential calls of
``square(i)`` as workload B does, and reads every thread of every process before and
after from ``/proc`` (Linux): CPU (user + system), voluntary context switches (a thread
that slept and was woken) and involuntary ones (a runnable thread put off its core, most
often by a process it had just woken). Prints, per call, the sums for the server, the
workers' parents and their job processes, and the producer's CPU (this process), with
B's p50. ``--workload C`` makes C's calls instead (a fresh 1 MiB ``bytes`` argument, the
job returns its length; use fewer calls: each holds a megabyte). On 2 shared cores every
wake-up and every preemption is time another hop of the call waits for a core. Run by
hand; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))
import compare  # noqa: E402
from common import percentile  # noqa: E402

import dreamlake.lakeshore as dls  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    return [pid] + [p for k in kids for p in tree(int(k))]


def threads(pid: int) -> list[tuple[float, int, int]]:
    """Each thread of ``pid``: (CPU seconds, voluntary, involuntary switches)."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out  # (it ended)
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        vol = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        invol = int(status.split("\nnonvoluntary_ctxt_switches:")[1].split()[0])
        out.append((cpu, vol, invol))
    return out


def snapshot(server: int, workers: list[int]) -> dict[str, list[float]]:
    """CPU, voluntary and involuntary switches, summed by role."""
    roles = {
        "server": [server],
        "parents": workers,
        "children": [pid for w in workers for pid in tree(w)[1:]],
    }
    sums = {}
    for role, pids in roles.items():
        total = [0.0, 0.0, 0.0]
        for pid in pids:
            for values in threads(pid):
                total = [t + v for t, v in zip(total, values, strict=True)]
        sums[role] = total
    return sums


def run(calls: int, workload: str = "B") -> str:
    with (
        tempfile.TemporaryDirectory(prefix="lks-switches-") as tmp,
        compare.lakeshore_stack("ls-serve", Path(tmp)) as stack,
        compare.dispatch(stack) as dp,
    ):
        server, workers = stack.trees[0], stack.trees[1:]
        q = dls.SyncQueue("bench", dispatch=dp)
        for i in range(100):
            compare.check(q.result(compare.square.submit(i, _dispatch=dp)) == i * i, "warm")
        if workload == "C":
            warm = os.urandom(2**20)
            compare.check(q.result(compare.nbytes.submit(warm, _dispatch=dp)) == 2**20, "warm")
        # (C: a fresh 1 MiB each call, as compare.py's C: a repeat would skip the upload)
        fresh = calls if workload == "C" else 0
        blobs = [i.to_bytes(8, "big") + os.urandom(2**20 - 8) for i in range(fresh)]
        before, ru0 = snapshot(server, workers), resource.getrusage(resource.RUSAGE_SELF)
        took = []
        for i in range(calls):
            t0 = time.perf_counter()
            if workload == "C":
                v = q.result(compare.nbytes.submit(blobs[i], _dispatch=dp), timeout=30)
                want = len(blobs[i])
            else:
                v, want = q.result(compare.square.submit(i, _dispatch=dp), timeout=30), i * i
            took.append(time.perf_counter() - t0)
            compare.check(v == want, f"call {i} = {v}")
        after, ru1 = snapshot(server, workers), resource.getrusage(resource.RUSAGE_SELF)
    producer = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / calls * 1e3
    p50 = percentile(took, 0.5) * 1e3
    cells = [f"{workload} p50 {p50:.2f} ms", f"producer CPU {producer:.2f} ms"]
    for role in ("server", "parents", "children"):
        cpu, vol, invol = (after[role][k] - before[role][k] for k in range(3))
        cells.append(
            f"{role} CPU {cpu / calls * 1e3:.2f} ms, switches {vol / calls:.1f}"
            f" + {invol / calls:.1f} preempted"
        )
    return " | ".join(cells) + " (a call)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workload", choices=("B", "C"), default="B")
    a = p.parse_args()
    if not Path("/proc/self/task").is_dir():
        print("reads /proc: Linux only", file=sys.stderr)
        return 2
    for _ in range(a.runs):
        print(run(a.calls, a.workload), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
