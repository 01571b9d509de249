"""Lakeshore beside Celery, Dramatiq and RQ: one run, systems alternating, medians.

    .venv/bin/python benchmarks/compare.py [--runs 3] [--only A,B,C,D,E,RT]
        [--systems ls-memory,ls-file,ls-serve,ls-dev,celery,dramatiq,rq] [--quick]

Workloads (every one checks its results and fails loudly on a wrong one):

- B: sequential submit -> result of ``square(i)``, p50 / p99 (1,000 calls after 50 warm-up).
- C: one 1 MiB ``bytes`` argument, the job returns its length; median ms (20 calls).
- RT: network round trips the producer makes for one B call, counted by a loopback proxy
  (HTTP requests for Lakeshore; Redis exchanges, pipelined commands as one, for peers).
- A: fan-out/gather of 2,000 ``square(i)`` with 2 worker processes; jobs/s and CPU per job
  summed over the producer, the broker or server and the workers (``/proc/<pid>/stat``,
  children included).
- D: fan-out/gather of 10,000 over an emulated 20 ms round-trip link (a proxy that holds
  each direction 10 ms) between the producer and the server or Redis; seconds. A run
  that passes ``--d-cap`` seconds stops and is shown as "> cap".
- E: an A-style fan-out of 300 against ``lakeshore dev`` (the AWS handlers over moto);
  jobs/s and HTTP requests per job (the dev server's access log, all clients).

Systems: ``ls-memory`` (``Dispatch(":memory:")``, 2 worker threads in the producer's
process; B and C), ``ls-file`` (``Dispatch("plane.db")``, 2 ``lakeshore worker start
--plane`` processes), ``ls-serve`` (``lakeshore serve`` and 2 ``lakeshore worker start
--url`` processes; the producer here over HTTP), ``ls-dev`` (E only), and the peers over
Redis from the system's ``redis-server`` (installed with apt-get if missing, started on a
free loopback port): ``celery``, ``dramatiq``, ``rq``. The peers' packages live in
``benchmarks/.venv-peers`` (made from ``benchmarks/peers/requirements.txt``).

Each run starts every system afresh, each Lakeshore system's round and each peer's
producer in a process of its own; systems alternate within a run (their order rotates
from run to run). Prints a markdown table of medians with Lakeshore-serve / peer ratios
and writes every run to ``benchmarks/results/compare-<time>.json``. Run by hand: the
machine is shared and noisy, so read medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dreamlake.lakeshore as dls

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
sys.path.insert(0, str(PEERS))

from common import (  # noqa: E402
    cpu_seconds,
    cpu_snapshot,
    free_port,
    median,
    percentile,
    wait_lines,
    wait_port,
)
from netproxy import Proxy  # noqa: E402

LAKESHORE = ["ls-memory", "ls-file", "ls-serve", "ls-dev"]
PEER_SYSTEMS = ["celery", "dramatiq", "rq"]
SYSTEMS = LAKESHORE + PEER_SYSTEMS
WORKLOADS = ["B", "C", "RT", "A", "D", "E"]
#: which workloads each system runs
SUPPORTS = {
    "ls-memory": {"B", "C"},
    "ls-file": {"B", "C", "A"},
    "ls-serve": {"B", "C", "RT", "A", "D"},
    "ls-dev": {"E"},
    "celery": {"B", "C", "RT", "A", "D"},
    "dramatiq": {"B", "C", "RT", "A", "D"},
    "rq": {"B", "C", "RT", "A", "D"},
}
CONFIG = {
    "ls-memory": 'Dispatch(":memory:"), 2 worker threads (run_worker) in the producer process',
    "ls-file": 'Dispatch("plane.db"), 2 x `lakeshore worker start --plane plane.db`',
    "ls-serve": "`lakeshore serve` (SQLite file), 2 x `lakeshore worker start --url --token`",
    "ls-dev": "`lakeshore dev` (handlers over moto), 2 x `lakeshore worker start --url --token`",
    "celery": "2 x `celery worker -P solo`, Redis broker + Redis result backend, pickle",
    "dramatiq": "`dramatiq --processes 2 --threads 1`, Redis broker + Results(RedisBackend)",
    "rq": "2 x `rq worker --worker-class rq.SimpleWorker`, results from the job's stream",
}
DELAY = 0.010  # each direction: a 20 ms round trip


@dataclass
class Sizes:
    b: int = 1000
    b_warm: int = 50
    c: int = 20
    a: int = 2000
    d: int = 10_000
    e: int = 300

    @classmethod
    def quick(cls) -> Sizes:
        return cls(b=20, b_warm=5, c=2, a=40, d=40, e=10)


# --- the jobs (defined in __main__, so they travel by value to Lakeshore workers) ---------


@dls.udf(queue="bench")
def square(x: int) -> int:
    return x * x


@dls.udf(queue="bench")
def nbytes(b: bytes) -> int:
    return len(b)


class WrongResult(AssertionError):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise WrongResult(what)


# --- processes -----------------------------------------------------------------------


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        # children of the group that outlived their parent
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)


def spawn(
    cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Proc:
    with log.open("wb") as out:
        popen = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=cwd,
            start_new_session=True,  # its own process group: stopped with its children
        )
    return Proc(popen, log)


def lakeshore_cli() -> list[str]:
    script = Path(sys.executable).with_name("lakeshore")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dreamlake.lakeshore.cli"]


def read_banner(proc: Proc, pattern: str, timeout: float = 60.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        text = proc.log.read_text(errors="replace")
        m = re.search(pattern, text, re.S)
        if m:
            return m
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"no banner ({pattern}) from {proc.popen.args}:\n{text[-3000:]}")
        time.sleep(0.05)


def make_token(url: str, admin: str, role: str) -> str:
    req = urllib.request.Request(
        f"{url}/v1/tokens",
        data=json.dumps({"role": role, "name": f"bench {role}"}).encode(),
        headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(json.load(resp)["token"])


# --- Lakeshore stacks ------------------------------------------------------------------


@dataclass
class Stack:
    target: str  # what the producer's Dispatch takes
    token: str | None = None
    port: int | None = None  # the server's, for proxies
    trees: list[int] = field(default_factory=list)  # server and worker pids, for CPU
    server: Proc | None = None
    embedded: dls.Dispatch | None = None  # ls-memory: the one plane, shared with its workers


def start_workers(args: list[str], tmp: Path, n: int = 2) -> list[Proc]:
    procs = [
        spawn([*lakeshore_cli(), "worker", "start", "-q", "bench", *args], tmp / f"worker{k}.log")
        for k in range(n)
    ]
    for p in procs:
        wait_lines(p.log, "serving bench", 1, 60, p.alive)
    return procs


@contextlib.contextmanager
def lakeshore_stack(system: str, tmp: Path) -> Iterator[Stack]:
    procs: list[Proc] = []
    threads: list[threading.Thread] = []
    stop = threading.Event()
    try:
        if system == "ls-memory":
            dp = dls.Dispatch(":memory:")
            q = dls.SyncQueue("bench", dispatch=dp)
            for _ in range(2):
                t = threading.Thread(target=dls.run_worker, args=(q,), kwargs={"stop": stop.is_set})
                t.start()
                threads.append(t)
            yield Stack(":memory:", embedded=dp)
            return
        if system == "ls-file":
            plane = tmp / "plane.db"
            procs = start_workers(["--plane", str(plane)], tmp)
            yield Stack(str(plane), trees=[p.pid for p in procs])
            return
        if system == "ls-serve":
            server = spawn(
                [*lakeshore_cli(), "serve", "--port", "0", "--plane", str(tmp / "plane.db")],
                tmp / "serve.log",
            )
            m = read_banner(server, r"serving at (http://\S+).*?admin token: (lks_\S+)")
        else:  # ls-dev
            server = spawn(
                [*lakeshore_cli(), "dev", "--port", "0", "--access-log"], tmp / "dev.log"
            )
            m = read_banner(
                server, r"serving the Lambda handlers at (http://\S+).*?token: (lks_\S+)"
            )
        procs.append(server)
        url, admin = m.group(1), m.group(2)
        worker_token = make_token(url, admin, "worker")
        producer_token = make_token(url, admin, "producer")
        workers = start_workers(["--url", url, "--token", worker_token], tmp)
        procs.extend(workers)
        port = int(url.rsplit(":", 1)[1])
        yield Stack(url, producer_token, port, [p.pid for p in procs], server)
    finally:
        stop.set()
        for t in threads:
            t.join()
        for p in reversed(procs):
            p.stop()


@contextlib.contextmanager
def dispatch(stack: Stack, url: str | None = None) -> Iterator[dls.Dispatch]:
    if stack.embedded is not None:
        yield stack.embedded
        return
    with dls.Dispatch(url or stack.target, token=stack.token) as dp:
        yield dp


def ls_b(dp: dls.Dispatch, n: int, warm: int) -> dict[str, Any]:
    q = dls.SyncQueue("bench", dispatch=dp)
    for i in range(warm):
        check(q.result(square.submit(i, _dispatch=dp), timeout=30) == i * i, "warm-up")
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        v = q.result(square.submit(i, _dispatch=dp), timeout=30)
        lat.append(time.perf_counter() - t0)
        check(v == i * i, f"square({i}) = {v}")
    return {"p50_ms": percentile(lat, 0.5) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3}


def ls_c(dp: dls.Dispatch, n: int) -> dict[str, Any]:
    q = dls.SyncQueue("bench", dispatch=dp)
    # a fresh 1 MiB each call: blobs are content-addressed, a repeat would skip the upload
    blobs = [i.to_bytes(8, "big") + os.urandom(1024 * 1024 - 8) for i in range(n + 1)]
    check(q.result(nbytes.submit(blobs[-1], _dispatch=dp), timeout=60) == len(blobs[-1]), "warm")
    lat = []
    for b in blobs[:n]:
        t0 = time.perf_counter()
        v = q.result(nbytes.submit(b, _dispatch=dp), timeout=60)
        lat.append(time.perf_counter() - t0)
        check(v == len(b), f"len = {v}")
    return {"ms": percentile(lat, 0.5) * 1e3}


def ls_rt(stack: Stack) -> dict[str, Any]:
    assert stack.port is not None
    with (
        Proxy("127.0.0.1", stack.port) as proxy,
        dispatch(stack, f"http://127.0.0.1:{proxy.port}") as dp,
    ):
        q = dls.SyncQueue("bench", dispatch=dp)
        for i in range(3):  # hello, queue check, connections
            check(q.result(square.submit(i, _dispatch=dp), timeout=30) == i * i, "warm-up")
        proxy.reset()
        check(q.result(square.submit(7, _dispatch=dp), timeout=30) == 49, "square(7)")
        c = proxy.snapshot()
    return {
        "round_trips": len(c.http_requests),
        "exchanges": c.exchanges,
        "requests": c.http_requests,
    }


def ls_fan_out(
    dp: dls.Dispatch, n: int, cap: float, trees: list[int], warm: int = 5
) -> dict[str, Any]:
    q = dls.Queue("bench", dispatch=dp)
    sq = dls.SyncQueue("bench", dispatch=dp)
    for i in range(warm):
        check(sq.result(square.submit(i, _dispatch=dp), timeout=60) == i * i, "warm-up")

    async def gather(ids: list[str], left: float) -> list[int]:
        return await asyncio.wait_for(
            asyncio.gather(*(q.result(inv, timeout=left) for inv in ids)), left
        )

    before = cpu_snapshot([os.getpid()], trees)
    t0 = time.perf_counter()
    deadline = time.monotonic() + cap
    ids = []
    with dls.batch():  # the SDK's batch submit (as RQ's enqueue_many): few requests
        for i in range(n):
            ids.append(square.submit(i, _dispatch=dp))
            if i % 100 == 0 and time.monotonic() > deadline:
                return {"capped": cap, "submitted": len(ids)}
    try:
        values = asyncio.run(gather(ids, max(1.0, deadline - time.monotonic())))
    except TimeoutError:
        return {"capped": cap, "submitted": len(ids), "states": dp.transport.counts("bench")}
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds(before, cpu_snapshot([os.getpid()], trees))
    check(sum(values) == sum(i * i for i in range(n)), "sum of squares")
    return {"seconds": elapsed, "jobs_per_s": n / elapsed, "cpu_ms_per_job": cpu / n * 1e3}


HTTP_LOG = re.compile(r'"(?:GET|POST|PUT|DELETE|PATCH|HEAD) \S+ HTTP/1\.[01]" \d{3}')


def ls_e(stack: Stack, n: int, cap: float) -> dict[str, Any]:
    assert stack.server is not None
    log = stack.server.log
    with dispatch(stack) as dp:
        before = len(HTTP_LOG.findall(log.read_text(errors="replace")))
        out = ls_fan_out(dp, n, cap, [], warm=0)
        time.sleep(0.3)  # let the access log catch up
        after = len(HTTP_LOG.findall(log.read_text(errors="replace")))
    out.pop("cpu_ms_per_job", None)  # moto shares the server's process: not comparable
    out["http_requests_per_job"] = (after - before) / n
    return out


def run_lakeshore_fresh(system: str, workloads: list[str], sz: Sizes, cap: float) -> dict[str, Any]:
    """:func:`run_lakeshore` in a process of its own, as each peer's producer runs: every
    system's round starts from a fresh interpreter, not from the harness's process after
    the rounds before it (where embedded B came out 0.02 to 0.04 ms slower)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", system]
    cmd += ["--only", ",".join(workloads), "--d-cap", str(cap), "--sizes", json.dumps(vars(sz))]
    # (a session of its own: a Ctrl-C reaches it once, from here, not also from the
    # terminal while it stops its stack)
    out_err = subprocess.PIPE
    with subprocess.Popen(
        cmd, stdout=out_err, stderr=out_err, text=True, start_new_session=True
    ) as child:
        try:
            out, err = child.communicate(timeout=3600)
        except BaseException:
            # (a hang or a stop: the child stops its stack as a Ctrl-C stops it — its
            # server, workers and proxy were started in sessions of their own — then goes)
            child.send_signal(signal.SIGINT)
            try:
                child.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
            raise
    if child.returncode != 0:
        raise RuntimeError(f"{system} exited {child.returncode}:\n{err[-3000:]}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def run_lakeshore(system: str, workloads: list[str], sz: Sizes, cap: float) -> dict[str, Any]:
    res: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="lks-bench-") as tmp,
        lakeshore_stack(system, Path(tmp)) as stack,
    ):
        for w in workloads:
            t0 = time.monotonic()
            try:
                if w == "B":
                    with dispatch(stack) as dp:
                        res[w] = ls_b(dp, sz.b, sz.b_warm)
                elif w == "C":
                    with dispatch(stack) as dp:
                        res[w] = ls_c(dp, sz.c)
                elif w == "RT":
                    res[w] = ls_rt(stack)
                elif w == "A":
                    with dispatch(stack) as dp:
                        res[w] = ls_fan_out(dp, sz.a, 300, stack.trees)
                elif w == "D":
                    assert stack.port is not None
                    with (
                        delay_proxy(stack.port) as pport,
                        dispatch(stack, f"http://127.0.0.1:{pport}") as dp,
                    ):
                        res[w] = ls_fan_out(dp, sz.d, cap, stack.trees, warm=2)
                elif w == "E":
                    res[w] = ls_e(stack, sz.e, 300)
            except WrongResult as e:
                res[w] = {"error": f"WRONG RESULT: {e}"}
            except Exception as e:  # a broken run is reported, and the run goes on
                res[w] = {"error": f"{type(e).__name__}: {e}"}
            res[w]["wall_s"] = time.monotonic() - t0
    return res


@contextlib.contextmanager
def delay_proxy(port: int) -> Iterator[int]:
    """The 20 ms link: netproxy in its own process (the producer's CPU stays its own)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(PEERS / "netproxy.py"), "--target", f"127.0.0.1:{port}"]
        proc = spawn([*cmd, "--delay", str(DELAY)], Path(tmp) / "proxy.log")
        try:
            m = read_banner(proc, r"port (\d+)")
            yield int(m.group(1))
        finally:
            proc.stop()


# --- peers -------------------------------------------------------------------------------

VENV = HERE / ".venv-peers"
REQUIREMENTS = PEERS / "requirements.txt"


def peers_python() -> Path:
    py = VENV / "bin" / "python"
    marker = VENV / ".requirements"
    want = REQUIREMENTS.read_text()
    if py.exists() and marker.exists() and marker.read_text() == want:
        return py
    print(f"making {VENV.relative_to(HERE.parent)} from {REQUIREMENTS.name} ...", flush=True)
    base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    marker.write_text(want)
    return py


def redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() != 0:
        raise SystemExit("redis-server is missing: apt-get install redis-server (as root)")
    print("installing redis-server with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "redis-server"]
    if subprocess.run(install, env=env, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True)
        subprocess.run(install, env=env, check=True)
    found = shutil.which("redis-server")
    if not found:
        raise SystemExit("redis-server is still missing after apt-get install")
    return found


def redis_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\S+)", out)
    return m.group(1) if m else out.strip()


def peer_workers(system: str, py: Path, url: str, tmp: Path) -> list[Proc]:
    env = {"BENCH_REDIS_URL": url, "PYTHONPATH": str(PEERS)}
    if system == "celery":
        env["C_FORCE_ROOT"] = "1"  # pickle (for bytes) as root: Celery asks for this consent
        cmd = [str(py), "-m", "celery", "-A", "tasks_celery", "worker", "-P", "solo"]
        cmd += ["--loglevel", "INFO", "--without-gossip", "--without-mingle"]
        cmd += ["--without-heartbeat"]
        procs = [
            spawn([*cmd, "-n", f"w{k}@%h"], tmp / f"celery{k}.log", env, PEERS) for k in range(2)
        ]
        for p in procs:
            wait_lines(p.log, " ready.", 1, 60, p.alive)
    elif system == "dramatiq":
        cmd = [str(py), "-m", "dramatiq", "tasks_dramatiq", "--processes", "2", "--threads", "1"]
        procs = [spawn(cmd, tmp / "dramatiq.log", env, PEERS)]
        wait_lines(procs[0].log, "ready for action", 2, 60, procs[0].alive)
    else:
        cmd = [str(py.with_name("rq")), "worker", "--url", url, "--worker-class", "rq.SimpleWorker"]
        procs = [
            spawn([*cmd, "-n", f"w{k}-{os.getpid()}", "bench"], tmp / f"rq{k}.log", env, PEERS)
            for k in range(2)
        ]
        for p in procs:
            wait_lines(p.log, "Listening on", 1, 60, p.alive)
    return procs


def run_peer(system: str, workloads: list[str], sz: Sizes, cap: float) -> dict[str, Any]:
    py = peers_python()
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix=f"{system}-bench-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        cmd = [redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        cmd += ["--appendonly", "no", "--daemonize", "no", "--dir", str(tmp)]
        redis = spawn(cmd, tmp / "redis.log")
        workers: list[Proc] = []
        try:
            wait_port(port)
            url = f"redis://127.0.0.1:{port}/0"
            workers = peer_workers(system, py, url, tmp)
            trees = [redis.pid] + [w.pid for w in workers]
            for w in workloads:
                t0 = time.monotonic()
                n = {"B": sz.b, "C": sz.c, "RT": 1, "A": sz.a, "D": sz.d}[w]
                warm = {"B": sz.b_warm, "C": 1, "RT": 3, "A": 5, "D": 2}[w]
                args = ["--n", str(n), "--warmup", str(warm), "--trees", ",".join(map(str, trees))]
                args += ["--cap", str(cap if w == "D" else 300)]
                try:
                    if w == "D":
                        with delay_proxy(port) as pport:
                            res[w] = peer_producer(
                                py, system, w, f"redis://127.0.0.1:{pport}/0", args
                            )
                    else:
                        res[w] = peer_producer(py, system, w, url, args)
                except Exception as e:
                    res[w] = {"error": f"{type(e).__name__}: {e}"}
                res[w]["wall_s"] = time.monotonic() - t0
        finally:
            for p in workers:
                p.stop()
            redis.stop()
    return res


def peer_producer(
    py: Path, system: str, workload: str, url: str, args: list[str]
) -> dict[str, Any]:
    cmd = [str(py), str(PEERS / "producer.py"), "--system", system, "--workload", workload]
    proc = subprocess.run(
        [*cmd, "--url", url, *args], capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{system} {workload} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --- the report --------------------------------------------------------------------------

#: row label, workload, metric key, which way is better, target (text)
ROWS: list[tuple[str, str, str, str, str]] = [
    ("B p50 (ms)", "B", "p50_ms", "lower", "serve ≤ 1.2; embedded ≤ 0.3"),
    ("B p99 (ms)", "B", "p99_ms", "lower", "serve ≤ 3"),
    ("A jobs/s", "A", "jobs_per_s", "higher", "≥ 3,000"),
    ("A CPU ms/job", "A", "cpu_ms_per_job", "lower", "≤ 0.5"),
    ("C 1 MiB (ms)", "C", "ms", "lower", "≤ 5"),
    ("D 20 ms RTT (s)", "D", "seconds", "lower", "≤ 3 (10,000 calls)"),
    ("RT round trips/call", "RT", "round_trips", "lower", "≤ 3"),
    ("E jobs/s (dev)", "E", "jobs_per_s", "higher", ""),
    ("E HTTP req/job (dev)", "E", "http_requests_per_job", "lower", ""),
]


def cell_values(runs: list[dict[str, Any]], system: str, workload: str, key: str) -> list[float]:
    out = []
    for r in runs:
        m = r["results"].get(system, {}).get(workload)
        if not m:
            continue
        if "capped" in m and key == "seconds":
            out.append(math.inf)
        elif key in m:
            out.append(float(m[key]))
    return out


def fmt(v: float, key: str) -> str:
    if math.isinf(v):
        return "capped"
    if key in ("jobs_per_s",):
        return f"{v:,.0f}"
    if key in ("round_trips",):
        return f"{v:g}"
    return f"{v:.2f}" if v < 100 else f"{v:,.0f}"


def capped(runs: list[dict[str, Any]], system: str, workload: str) -> str:
    """ "> cap s (n sent)": how far a run that gave up had got."""
    hits = [m for r in runs if "capped" in (m := r["results"].get(system, {}).get(workload, {}))]
    sent = median([float(m["submitted"]) for m in hits])
    return f"> {hits[0]['capped']:g} s ({sent:,.0f} sent)"


def table(runs: list[dict[str, Any]], systems: list[str], cap: float) -> str:
    peers = [s for s in systems if s in PEER_SYSTEMS]
    ratio = "ls-serve" in systems and peers
    head = ["workload", *systems]
    if ratio:
        head += [f"serve/{p}" for p in peers]
    head += ["better", "target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, w, key, better, target in ROWS:
        meds: dict[str, float | None] = {}
        cells = []
        for s in systems:
            vals = cell_values(runs, s, w, key)
            errors = [r["results"].get(s, {}).get(w, {}).get("error") for r in runs]
            if vals:
                meds[s] = median(vals)
                cells.append(fmt(meds[s], key) if not math.isinf(meds[s]) else capped(runs, s, w))
            elif any(errors):
                meds[s] = None
                cells.append("ERROR")
            else:
                meds[s] = None
                cells.append("—")
        if not any(v is not None for v in meds.values()):
            continue
        if ratio:
            base = meds.get("ls-serve")
            for p in peers:
                other = meds.get(p)
                if base is None or other is None or math.isinf(other) or math.isinf(base):
                    cells.append("—")
                else:
                    cells.append(f"{base / other:.2f}" if other else "—")
        lines.append("| " + " | ".join([label, *cells, better, target]) + " |")
    return "\n".join(lines)


PACKAGE_DIRS = ["lakeshore", "worker", "cli", "handlers", "infra"]


def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--only", default=",".join(WORKLOADS), help="workloads, e.g. A,B")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--d-cap", type=float, default=60.0, help="seconds before D gives up")
    p.add_argument("--out", type=Path, default=None, help="the JSON file of raw runs")
    p.add_argument("--table", type=Path, default=None, help="print the table of a saved run")
    # (one Lakeshore system's round, in a process of its own: see run_lakeshore_fresh)
    p.add_argument("--one", choices=LAKESHORE, help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is not None:
        sizes = Sizes(**json.loads(a.sizes)) if a.sizes else Sizes()
        print(json.dumps(run_lakeshore(a.one, a.only.split(","), sizes, a.d_cap)))
        return 0
    if a.table is not None:
        saved = json.loads(a.table.read_text())
        print(table(saved["runs"], list(saved["meta"]["systems"]), saved["meta"]["d_cap_s"]))
        return 0
    only = [w.strip().upper() for w in a.only.split(",") if w.strip()]
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    for w in only:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w} (one of {', '.join(WORKLOADS)})")
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s} (one of {', '.join(SYSTEMS)})")
    sz = Sizes.quick() if a.quick else Sizes()
    systems = [s for s in systems if SUPPORTS[s] & set(only)]
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "sizes": vars(sz),
        "d_cap_s": a.d_cap,
        "delay_each_way_s": DELAY,
        "systems": {s: CONFIG[s] for s in systems},
        "commit": git("rev-parse", "--short", "HEAD"),
        # the package runs from the work tree: edits not yet committed are measured too
        "uncommitted": git("status", "--porcelain", "--", *PACKAGE_DIRS).splitlines(),
    }
    if meta["uncommitted"]:
        print(f"note: measuring commit {meta['commit']} plus uncommitted edits", flush=True)
    if any(s in PEER_SYSTEMS for s in systems):
        peers_python()
        meta["redis"] = redis_version(redis_server())
        meta["peers"] = [line for line in REQUIREMENTS.read_text().splitlines() if "==" in line]
    out = a.out or HERE / "results" / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    capped: set[str] = set()  # D that ran past the cap once is not tried again
    for r in range(a.runs):
        order = systems[r % len(systems) :] + systems[: r % len(systems)]
        run: dict[str, Any] = {"run": r + 1, "order": order, "results": {}}
        for s in order:
            todo = [w for w in WORKLOADS if w in only and w in SUPPORTS[s]]
            if s in capped:
                todo = [w for w in todo if w != "D"]
            t0 = time.monotonic()
            runner: Callable[..., dict[str, Any]] = (
                run_peer if s in PEER_SYSTEMS else run_lakeshore_fresh
            )
            try:
                res = runner(s, todo, sz, a.d_cap)
            except Exception as e:
                res = {w: {"error": f"{type(e).__name__}: {e}"} for w in todo}
            run["results"][s] = res
            if "capped" in res.get("D", {}):
                capped.add(s)
            brief = ", ".join(f"{w} " + ("ERROR" if "error" in m else "ok") for w, m in res.items())
            print(
                f"run {r + 1}/{a.runs} {s:<9} {time.monotonic() - t0:6.1f} s  {brief}", flush=True
            )
            for w, m in res.items():
                if "error" in m:
                    print(f"  {s} {w}: {m['error']}", file=sys.stderr, flush=True)
            # written as it goes: a run that breaks off keeps what it measured
            out.write_text(json.dumps({"meta": meta, "runs": [*runs, run]}, indent=1))
        runs.append(run)
    print()
    dirty = " + uncommitted edits" if meta["uncommitted"] else ""
    print(f"medians of {a.runs} run(s); {os.cpu_count()} CPUs; commit {meta['commit']}{dirty}")
    for s in systems:
        print(f"- {s}: {CONFIG[s]}")
    print()
    print(table(runs, systems, a.d_cap))
    print()
    print(f"raw runs: {out}")
    failed = [
        (r["run"], s, w)
        for r in runs
        for s, res in r["results"].items()
        for w, m in res.items()
        if "error" in m
    ]
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
