"""Network faults between SDK/worker and plane: a loopback TCP proxy drops connections,
delays them, and cuts answers after the plane processed the request. Submits are
retried without duplicates, completes without double results, result waits resume."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.server import serve_in_thread

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
JOBS = int(os.environ.get("LAKESHORE_FAULT_JOBS", "300"))


class FaultyProxy:
    """Relays loopback TCP to ``upstream``; each chunk of an answer may be cut (the
    plane did the work, the client never hears), each request delayed or dropped."""

    def __init__(self, upstream: tuple[str, int], seed: int = 3) -> None:
        self.upstream = upstream
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.faults = {"dropped": 0, "cut": 0, "delayed": 0}
        self.on = True
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _roll(self, p: float) -> bool:
        with self.lock:
            return self.on and self.rng.random() < p

    def _count(self, fault: str) -> None:
        with self.lock:
            self.faults[fault] += 1

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream)
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def close() -> None:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

        def answers() -> None:
            try:
                while data := upstream.recv(65536):
                    if self._roll(0.03):
                        self._count("cut")  # processed, but the answer never arrives
                        close()
                        return
                    client.sendall(data)
            except OSError:
                pass
            close()

        threading.Thread(target=answers, daemon=True).start()
        try:
            while data := client.recv(65536):
                if self._roll(0.02):
                    self._count("dropped")
                    close()
                    return
                if self._roll(0.05):
                    self._count("delayed")
                    time.sleep(0.05)
                upstream.sendall(data)
        except OSError:
            pass
        close()

    def close(self) -> None:
        self.server.close()


def record(log: str, i: int) -> int:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i * i


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with serve_in_thread(tmp_path / "plane.db") as (url, admin):
        assert admin is not None
        yield url, admin


def test_fan_out_through_a_faulty_network(served: tuple[str, str], tmp_path: Path) -> None:
    url, admin = served
    port = int(url.rsplit(":", 1)[1])
    proxy = FaultyProxy(("127.0.0.1", port))
    via = f"http://127.0.0.1:{proxy.port}"
    log = str(tmp_path / "runs.log")
    with dls.Dispatch(url, token=admin) as direct:
        worker_token = direct.transport.create_token("worker")["token"]  # type: ignore[attr-defined]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    worker = subprocess.Popen(
        [sys.executable, "-m", "dreamlake.lakeshore.cli", "worker", "start", "-q", "faulty",
         "--url", via, "--token", worker_token, "--concurrency", "2", "--lease", "5"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with dls.Dispatch(via, token=admin) as dp:
            q = dls.SyncQueue("faulty", dispatch=dp)
            ids = [q.submit(record, log, i) for i in range(JOBS)]
            results = [q.result(i, timeout=120) for i in ids]
        proxy.on = False
        with dls.Dispatch(url, token=admin) as direct:
            records = direct.transport.get_many(ids)
            counts = direct.transport.counts("faulty")
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        proxy.close()
    # Then: no duplicate invocations, every one succeeded once, results intact
    assert len(set(ids)) == JOBS and counts["succeeded"] == JOBS
    assert sum(counts.values()) == JOBS
    assert results == [i * i for i in range(JOBS)]
    assert {r.state.value for r in records} == {"succeeded"}
    assert set(int(x) for x in Path(log).read_text().split()) == set(range(JOBS))
    faults = proxy.faults
    print(f"\n{JOBS} jobs through {faults}")
    assert faults["cut"] > 0 and faults["dropped"] > 0
