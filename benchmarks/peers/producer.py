"""A peer's producer for one workload, run by ``compare.py`` in the peers' venv.

    python producer.py --system celery --workload B --url redis://127.0.0.1:P/0 --n 1000

Prints one JSON object (the measurements) on its last line of stdout. Every workload
checks its results and exits non-zero on a wrong one. The workers are already running
(``compare.py`` starts them); ``--trees`` are their pids and Redis's, for CPU per job.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_seconds, cpu_snapshot, percentile
from netproxy import Proxy


class Celery:
    def __init__(self) -> None:
        from celery.result import ResultSet

        self.t = importlib.import_module("tasks_celery")
        self.ResultSet = ResultSet

    def submit(self, i: int) -> Any:
        return self.t.square.apply_async((i,))

    def submit_bytes(self, b: bytes) -> Any:
        return self.t.nbytes.apply_async((b,))

    def result(self, h: Any, timeout: float) -> Any:
        return h.get(timeout=timeout)

    def fan_out(self, n: int, deadline: float) -> list[Any]:
        out = []
        for i in range(n):
            out.append(self.t.square.apply_async((i,)))
            if i % 100 == 0 and time.monotonic() > deadline:
                break
        return out

    def gather(self, hs: list[Any], deadline: float) -> list[Any]:
        rs = self.ResultSet(hs, app=self.t.app)
        return list(rs.get(timeout=max(1.0, deadline - time.monotonic())))


class Dramatiq:
    def __init__(self) -> None:
        self.t = importlib.import_module("tasks_dramatiq")

    def submit(self, i: int) -> Any:
        return self.t.square.send(i)

    def submit_bytes(self, b: bytes) -> Any:
        return self.t.nbytes.send(b)

    def result(self, h: Any, timeout: float) -> Any:
        return h.get_result(block=True, timeout=int(timeout * 1000))

    def fan_out(self, n: int, deadline: float) -> list[Any]:
        out = []
        for i in range(n):
            out.append(self.t.square.send(i))
            if i % 100 == 0 and time.monotonic() > deadline:
                break
        return out

    def gather(self, hs: list[Any], deadline: float) -> list[Any]:
        out = []
        for h in hs:
            left = max(1000, int((deadline - time.monotonic()) * 1000))
            out.append(h.get_result(block=True, timeout=left))
            if time.monotonic() > deadline:
                raise TimeoutError(f"gathered {len(out)} of {len(hs)}")
        return out


class RQ:
    """``enqueue`` / ``enqueue_many`` (one pipeline a chunk); results from their streams."""

    def __init__(self, url: str) -> None:
        import redis
        import rq
        from rq.results import Result

        self.t = importlib.import_module("tasks_rq")
        self.conn = redis.Redis.from_url(url)
        self.q = rq.Queue("bench", connection=self.conn)
        self.Queue = rq.Queue
        self.Result = Result

    def submit(self, i: int) -> Any:
        return self.q.enqueue(self.t.square, i)

    def submit_bytes(self, b: bytes) -> Any:
        return self.q.enqueue(self.t.nbytes, b)

    def _value(self, res: Any, job_id: str) -> Any:
        if res is None or res.type != self.Result.Type.SUCCESSFUL:
            raise RuntimeError(f"job {job_id} failed: {getattr(res, 'exc_string', res)}")
        return res.return_value

    def result(self, h: Any, timeout: float) -> Any:
        return self._value(h.latest_result(timeout=max(1, int(timeout))), h.id)

    def fan_out(self, n: int, deadline: float) -> list[Any]:
        out: list[Any] = []
        for start in range(0, n, 1000):
            datas = [self.Queue.prepare_data(self.t.square, (i,)) for i in range(start, n)][:1000]
            out.extend(self.q.enqueue_many(datas))
            if time.monotonic() > deadline:
                break
        return out

    def gather(self, hs: list[Any], deadline: float) -> list[Any]:
        """Poll the result streams of unfinished jobs, up to 1,000 a pipeline."""
        values: dict[str, Any] = {}
        pending = [h.id for h in hs]
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"gathered {len(values)} of {len(hs)}")
            batch = pending[:1000]
            with self.conn.pipeline(transaction=False) as pipe:
                for job_id in batch:
                    pipe.xrevrange(self.Result.get_key(job_id), "+", "-", count=1)
                answers = pipe.execute()
            got = 0
            for job_id, answer in zip(batch, answers, strict=True):
                if answer:
                    rid, payload = answer[0]
                    res = self.Result.restore(job_id, rid.decode(), payload, connection=self.conn)
                    values[job_id] = self._value(res, job_id)
                    got += 1
            pending = [j for j in pending if j not in values]
            if got == 0:
                time.sleep(0.002)
        return [values[h.id] for h in hs]


def make(system: str, url: str) -> Any:
    os.environ["BENCH_REDIS_URL"] = url
    if system == "celery":
        return Celery()
    if system == "dramatiq":
        return Dramatiq()
    return RQ(url)


def check(ok: bool, what: str) -> None:
    if not ok:
        print(f"WRONG RESULT: {what}", file=sys.stderr)
        sys.exit(3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=["celery", "dramatiq", "rq"], required=True)
    p.add_argument("--workload", choices=["B", "C", "A", "D", "RT"], required=True)
    p.add_argument("--url", required=True, help="the producer's Redis URL")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--trees", default="", help="pids whose trees count for CPU (workers, Redis)")
    p.add_argument("--cap", type=float, default=120.0, help="give up on A/D after this long")
    a = p.parse_args()
    out: dict[str, Any] = {}
    proxy = None
    url = a.url
    if a.workload == "RT":  # count the producer's round trips through a loopback proxy
        host_port = url.split("//", 1)[1].split("/", 1)[0]
        host, port = host_port.rsplit(":", 1)
        proxy = Proxy(host, int(port)).start()
        url = url.replace(host_port, f"127.0.0.1:{proxy.port}")
    s = make(a.system, url)
    for i in range(a.warmup):  # connections, pools, pub/sub channels
        check(s.result(s.submit(i), 30) == i * i, "warm-up")

    if a.workload == "B":
        lat = []
        for i in range(a.n):
            t0 = time.perf_counter()
            v = s.result(s.submit(i), 30)
            lat.append(time.perf_counter() - t0)
            check(v == i * i, f"square({i}) = {v}")
        out = {"p50_ms": percentile(lat, 0.5) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3}
    elif a.workload == "C":
        lat = []
        blobs = [i.to_bytes(8, "big") + os.urandom(1024 * 1024 - 8) for i in range(a.n)]
        for b in blobs:
            t0 = time.perf_counter()
            v = s.result(s.submit_bytes(b), 60)
            lat.append(time.perf_counter() - t0)
            check(v == len(b), f"len = {v}")
        out = {"ms": percentile(lat, 0.5) * 1e3}
    elif a.workload == "RT":
        assert proxy is not None
        proxy.reset()
        check(s.result(s.submit(7), 30) == 49, "square(7)")
        c = proxy.snapshot()
        proxy.stop()
        out = {"round_trips": c.exchanges, "requests": c.redis_commands}
    else:  # A and D: fan out n, gather them all
        trees = [int(x) for x in a.trees.split(",") if x]
        before = cpu_snapshot([os.getpid()], trees)
        t0 = time.perf_counter()
        deadline = time.monotonic() + a.cap
        hs = s.fan_out(a.n, deadline)
        if len(hs) < a.n:
            out = {"capped": a.cap, "submitted": len(hs)}
        else:
            try:
                values = s.gather(hs, deadline)
            except TimeoutError as e:
                out = {"capped": a.cap, "submitted": len(hs), "note": str(e)}
            else:
                elapsed = time.perf_counter() - t0
                cpu = cpu_seconds(before, cpu_snapshot([os.getpid()], trees))
                check(sum(values) == sum(i * i for i in range(a.n)), "sum of squares")
                out = {"seconds": elapsed, "jobs_per_s": a.n / elapsed}
                out["cpu_ms_per_job"] = cpu / a.n * 1e3
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
