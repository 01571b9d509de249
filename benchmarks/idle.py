"""Idle: what idle workers cost ``lakeshore serve``, and what idle workers on a plane
file cost themselves.

    .venv/bin/python benchmarks/idle.py [--claims 0,50,200] [--waits 0,200] [--seconds 10]
    .venv/bin/python benchmarks/idle.py --claims "" --waits "" --file-workers 2

Starts ``lakeshore serve`` (a process of its own, a plane file), then for each count
holds that many idle workers' claims on it (long polls of up to 20 s on an empty queue,
made again as each ends, from threads of this process), then that many producers'
result waits on a call no worker runs, and prints the server's CPU (user + system) over
``--seconds`` as a share of one core, with the number of requests the server reports
holding (``lakeshore_serve_held_requests``). With ``--file-workers N``, it then starts N
``lakeshore worker start --plane`` processes on a plane file of their own, has them run
a call each, and prints their CPU (each process tree: the worker and its job processes)
over ``--seconds`` once they have sat idle for ``--settle`` seconds (a worker writes a
heartbeat every 15 s: windows of 30 s or more hold two). Run by hand; the machine is
shared and noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.plane import QueueSpec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))
from common import cpu_seconds, cpu_snapshot  # noqa: E402
from compare import lakeshore_cli, make_token, read_banner, spawn, start_workers  # noqa: E402


def held(url: str, admin: str, kind: str) -> int:
    req = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {admin}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(rf'lakeshore_serve_held_requests\{{kind="{kind}"\}} (\d+)', text)
    return int(found.group(1)) if found else 0


def claimer(url: str, token: str, stop: threading.Event) -> None:
    """An idle worker: claims on the empty queue, waiting up to 20 s each, until stopped."""
    with dls.Dispatch(url, token=token) as dp:
        while not stop.is_set():
            dp.transport.claim(["idle"], "idle-bench", limit=1, wait=20.0)  # type: ignore[attr-defined]


def waiter(url: str, token: str, inv: str, stop: threading.Event) -> None:
    """A producer waiting (up to 20 s a request) for a call no worker runs, until stopped."""
    with dls.Dispatch(url, token=token) as dp:
        q = dls.SyncQueue("unserved", dispatch=dp)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                q.result(inv, timeout=20.0)


def measure(
    pid: int,
    url: str,
    admin: str,
    kind: str,
    n: int,
    seconds: float,
    run: Callable[[threading.Event], None],
) -> float:
    """The server's CPU (share of a core) over ``seconds`` while ``n`` threads run
    ``run(stop)``, each holding a request of ``kind``."""
    stop = threading.Event()
    threads = [threading.Thread(target=run, args=(stop,), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while held(url, admin, kind) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    c0, t0 = cpu_snapshot([pid], []), time.monotonic()
    time.sleep(seconds)
    share = cpu_seconds(c0, cpu_snapshot([pid], [])) / (time.monotonic() - t0)
    name = "idle claims" if kind == "claim" else "result waits"
    print(f"{n:>5} {name} (held: {held(url, admin, kind)}): server {100 * share:.1f}% of a core")
    stop.set()  # (each thread ends with its request's answer: up to 20 s)
    for t in threads:
        t.join()
    return share


def file_workers(n: int, seconds: float, settle: float) -> float:
    """The CPU (share of a core, each) of ``n`` idle ``lakeshore worker start --plane``
    processes on one plane file, ``settle`` seconds after their last call."""
    with tempfile.TemporaryDirectory() as tmp:
        plane = Path(tmp) / "plane.db"
        workers = start_workers(["--plane", str(plane)], Path(tmp), n)
        try:
            with dls.Dispatch(str(plane)) as dp:
                q = dls.SyncQueue("bench", dispatch=dp)
                for i in range(4 * n):  # (each worker has run something, then nothing)
                    q.result(q.submit(abs, -i), timeout=60)
            time.sleep(settle)
            pids = [w.pid for w in workers]
            c0, t0 = cpu_snapshot([], pids), time.monotonic()
            time.sleep(seconds)
            share = cpu_seconds(c0, cpu_snapshot([], pids)) / (time.monotonic() - t0) / n
            what = f"idle file-plane workers ({settle:.0f} s idle)"
            print(f"{n:>5} {what}: {100 * share:.2f}% of a core each")
            return share
        finally:
            for w in workers:
                w.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", default="0,50,200")
    parser.add_argument("--waits", default="0,200")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--file-workers", type=int, default=0)
    parser.add_argument("--settle", type=float, default=5.0)
    args = parser.parse_args()
    if args.claims or args.waits:
        serve_side(args)
    if args.file_workers:
        file_workers(args.file_workers, args.seconds, args.settle)


def serve_side(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = spawn(
            [*lakeshore_cli(), "serve", "--port", "0", "--plane", str(Path(tmp) / "plane.db")],
            Path(tmp) / "serve.log",
        )
        try:
            banner = read_banner(server, r"serving at (http://\S+).*?admin token: (lks_\S+)")
            url, admin = banner.group(1), banner.group(2)
            worker = make_token(url, admin, "worker")
            with dls.Dispatch(url, token=admin) as dp:
                dp.transport.ensure_queue(QueueSpec("idle"))  # type: ignore[attr-defined]
                inv = dls.SyncQueue("unserved", dispatch=dp).submit(abs, -1)
            look = partial(measure, server.pid, url, admin)
            for n in (int(c) for c in args.claims.split(",") if c):
                look("claim", n, args.seconds, partial(claimer, url, worker))
            for n in (int(c) for c in args.waits.split(",") if c):
                look("wait", n, args.seconds, partial(waiter, url, admin, inv))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
