"""Crash and restart: workers killed at random during a fan-out, and the plane's server
killed and restarted mid-fan-out. Every accepted invocation ends succeeded, each with
one recorded result (executions may repeat: at-least-once is allowed, two results not).

The default run uses 2,000 jobs; ``LAKESHORE_SOAK=1`` makes it 20,000 (opt-in soak).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dreamlake.lakeshore as dls

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
JOBS = 20_000 if os.environ.get("LAKESHORE_SOAK") else 2_000


def record(log: str, i: int) -> int:
    """Append one line per execution (O_APPEND writes are atomic for short lines)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i * i


def lakeshore(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "dreamlake.lakeshore.cli", *args],
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def test_random_kill_9_of_workers_loses_nothing_and_records_once(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    plane, log = str(tmp_path / "plane.db"), str(tmp_path / "runs.log")
    rng = random.Random(7)
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("chaos", dispatch=dp)
        ids = [q.submit(record, log, i) for i in range(JOBS)]
        start = ["worker", "start", "-q", "chaos", "--plane", plane, "--lease", "2"]

        def spawn() -> subprocess.Popen[bytes]:
            p = lakeshore(*start, "--concurrency", "2")
            reaper.append(p)
            return p

        workers = [spawn() for _ in range(4)]
        kills = 0
        deadline = time.monotonic() + 240
        while dp.transport.counts("chaos").get("succeeded", 0) < JOBS:
            assert time.monotonic() < deadline, dp.transport.counts("chaos")
            time.sleep(0.3)
            if kills < 8 and rng.random() < 0.5:
                victim = rng.randrange(len(workers))
                workers[victim].kill()  # kill -9: its leases just run out
                workers[victim].wait(timeout=30)
                workers[victim] = spawn()
                kills += 1
        results = [q.result(i, timeout=60) for i in ids]
        records = dp.transport.get_many(ids)
    # Every invocation succeeded, with its own result, recorded once
    assert results == [i * i for i in range(JOBS)]
    assert {r.state.value for r in records} == {"succeeded"}
    executions = [int(x) for x in Path(log).read_text().split()]
    assert set(executions) == set(range(JOBS))  # nothing lost
    repeats = len(executions) - JOBS  # at-least-once: a killed job may have run twice
    attempts = sum(r.attempt for r in records) - JOBS
    print(f"\n{JOBS} jobs, {kills} kill -9s, {repeats} repeated executions, {attempts} re-claims")
    assert kills > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, token: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with dls.Dispatch(url, token=token) as dp:
                dp.transport.hello()  # type: ignore[attr-defined]
                return
        except Exception:
            assert time.monotonic() < deadline, "serve did not come up"
            time.sleep(0.1)


def test_killing_and_restarting_serve_mid_fan_out_loses_nothing(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    from dreamlake.lakeshore.api import create_token
    from dreamlake.lakeshore.plane import Plane
    from dreamlake.lakeshore.stores import SqliteStore

    plane_file, log = tmp_path / "served.db", str(tmp_path / "runs.log")
    # Given tokens minted in the plane file, and serve on a fixed port
    plane = Plane(SqliteStore(plane_file))
    producer, _ = create_token(plane, "producer")
    worker_token, _ = create_token(plane, "worker")
    plane.close()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    serve_args = ["serve", "--port", str(port), "--plane", str(plane_file)]
    server = lakeshore(*serve_args)
    reaper.append(server)
    _wait_ready(url, producer)
    worker = lakeshore("worker", "start", "-q", "fan", "--url", url, "--token", worker_token,
                       "--concurrency", "2", "--lease", "3")  # fmt: skip
    reaper.append(worker)
    jobs = JOBS // 2
    ids: list[str] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with dls.Dispatch(url, token=producer) as dp:
                q = dls.SyncQueue("fan", dispatch=dp)
                for i in range(jobs):
                    ids.append(q.submit(record, log, i))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    producing = threading.Thread(target=produce)
    producing.start()
    # When serve is killed (kill -9) twice while the producer submits, and restarted
    for _ in range(2):
        while len(ids) < jobs // 4 and producing.is_alive():
            time.sleep(0.01)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        time.sleep(0.5)
        server = lakeshore(*serve_args)
        reaper.append(server)
        _wait_ready(url, producer)
        mark = len(ids)
        while len(ids) < mark + jobs // 4 and producing.is_alive():
            time.sleep(0.01)
    producing.join(timeout=300)
    assert not errors, errors
    # Then every accepted invocation is there and succeeds, one result each
    with dls.Dispatch(url, token=producer) as dp:
        q = dls.SyncQueue("fan", dispatch=dp)
        results = [q.result(i, timeout=120) for i in ids]
        records = dp.transport.get_many(ids)
    assert len(ids) == jobs and len(set(ids)) == jobs
    assert results == [i * i for i in range(jobs)]
    assert {r.state.value for r in records} == {"succeeded"}
    executions = [int(x) for x in Path(log).read_text().split()]
    assert set(executions) == set(range(jobs))
    print(
        f"\n{jobs} jobs through 2 kill -9s of serve; {len(executions) - jobs} repeated executions"
    )
