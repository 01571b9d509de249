"""Real processes sharing one file plane: workers racing for claims, producers and
workers in different processes.

Each worker here is a separate Python process running ``dls.run_worker`` on a
``SyncQueue`` over ``Dispatch(<tmp>/plane.db)``; it stops when a stop file appears, and
is killed if it has not stopped within a timeout. Functions sent to those processes are
closures (cloudpickle sends them by value), since this test module is not importable
there.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import dreamlake.lakeshore as dls

ROOT = Path(__file__).resolve().parent.parent
#: seconds to wait for anything a process does: starting, a result, exiting
WAIT = 60.0

WORKER_SCRIPT = """
import os, sys
import dreamlake.lakeshore as dls

db, name, stop_file = sys.argv[1:4]
dp = dls.Dispatch(db)
q = dls.SyncQueue(name, dispatch=dp)
print("ready", os.getpid(), flush=True)
ran = dls.run_worker(q, stop=lambda: os.path.exists(stop_file), poll=0.05)
print("ran", ran, flush=True)
dp.close()
"""

PRODUCER_SCRIPT = """
import json, os, sys
import dreamlake.lakeshore as dls

db, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])


def cube(x):  # defined in __main__ here: it travels by value
    return {"x": x, "cube": x ** 3, "pid": os.getpid()}


dp = dls.Dispatch(db)
q = dls.SyncQueue(name, dispatch=dp)
ids = [q.submit(cube, i) for i in range(n)]
results = [q.result(inv, timeout=30) for inv in ids]
print(json.dumps({"pid": os.getpid(), "ids": ids, "results": results}), flush=True)
dp.close()
"""

READER_SCRIPT = """
import json, sys
import dreamlake.lakeshore as dls

db, name = sys.argv[1:3]
ids = json.loads(sys.stdin.read())
dp = dls.Dispatch(db)
q = dls.SyncQueue(name, dispatch=dp)
out = {"status": [q.status(i) for i in ids], "results": [q.result(i, timeout=30) for i in ids]}
print(json.dumps(out), flush=True)
dp.close()
"""


ONE_JOB_WORKER_SCRIPT = """
import sys
import dreamlake.lakeshore as dls

db, name = sys.argv[1:3]
dp = dls.Dispatch(db)
ran = dls.run_worker(dls.SyncQueue(name, dispatch=dp), once=True)
print(ran, flush=True)
dp.close()
"""


class WorkerProcess:
    """A worker in its own process; its stdout lines are read by a thread."""

    def __init__(self, db: Path, queue_name: str, stop_file: Path, stderr: Path) -> None:
        self._stderr_path = stderr
        self._stderr = stderr.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_SCRIPT, str(db), queue_name, str(stop_file)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.pid = self.proc.pid
        self.returncode: int | None = None
        self.ran: int | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self) -> str:
        """The next line it printed (waits up to WAIT seconds)."""
        try:
            line = self._lines.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"worker {self.pid} printed nothing in {WAIT}s") from None
        assert line is not None, f"worker {self.pid} exited early:\n{self.stderr()}"
        return line

    def wait_ready(self) -> None:
        assert self.line() == f"ready {self.pid}"

    def stderr(self) -> str:
        self._stderr.flush()
        return self._stderr_path.read_text()

    def stop(self) -> None:
        """Wait for it to exit (the stop file is there), killing it after WAIT seconds.

        Afterwards ``returncode`` and ``ran`` (how many jobs it ran, from its last line)
        are set.
        """
        try:
            self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=WAIT)
        finally:
            self._reader.join(timeout=WAIT)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._stderr.close()
        self.returncode = self.proc.returncode
        while not self._lines.empty():
            line = self._lines.get()
            if line is not None and line.startswith("ran "):
                self.ran = int(line.split()[1])

    def check_exited_cleanly(self) -> None:
        assert self.returncode == 0, f"worker {self.pid} failed:\n{self.stderr()}"
        assert self.ran is not None, f"worker {self.pid} did not report:\n{self.stderr()}"


@contextmanager
def worker_processes(
    tmp_path: Path, db: Path, queue_name: str, n: int
) -> Iterator[list[WorkerProcess]]:
    """``n`` worker processes on ``queue_name``, each ready to claim; stopped after."""
    stop_file = tmp_path / f"stop-{queue_name}"
    workers: list[WorkerProcess] = []
    try:
        for k in range(n):
            workers.append(WorkerProcess(db, queue_name, stop_file, tmp_path / f"w{k}.err"))
        for w in workers:
            w.wait_ready()
        yield workers
    finally:
        stop_file.touch()
        for w in workers:
            w.stop()


def run_script(script: str, *args: str, stdin: str = "") -> Any:
    """Run a script in a fresh Python process; return the JSON it printed.

    The script's own waits (30 s) run out before this one (WAIT), so a stuck wait
    shows up as the script's TimeoutError and traceback.
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script, *args],
            cwd=ROOT,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"script still running after {WAIT}s:\n{exc.stderr!r}") from None
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def job_logging_to(log_dir: Path) -> Callable[[int], dict[str, int]]:
    """A job that appends ``i`` to a log file of the process running it."""
    folder = str(log_dir)

    def job(i: int) -> dict[str, int]:
        import os

        with open(os.path.join(folder, f"ran-{os.getpid()}.log"), "a") as f:
            f.write(f"{i}\n")
        return {"i": i, "pid": os.getpid()}

    return job


def worker_pid(rec: Any) -> int:
    """The pid in a record's worker id (``host:pid:thread``)."""
    return int(str(rec.worker).split(":")[-2])


@pytest.fixture
def plane_db(tmp_path: Path) -> Path:
    return tmp_path / "plane.db"


@pytest.fixture
def dispatch_file(plane_db: Path) -> Iterator[dls.Dispatch]:
    """This process's Dispatch on the file plane."""
    dp = dls.Dispatch(str(plane_db))
    yield dp
    dp.close()


def test_two_worker_processes_never_claim_one_invocation_twice(
    tmp_path: Path, plane_db: Path, dispatch_file: dls.Dispatch
) -> None:
    # Given two worker processes on one file plane, both ready to claim
    n = 400
    logs = tmp_path / "logs"
    logs.mkdir()
    job = job_logging_to(logs)
    q = dls.SyncQueue("race", dispatch=dispatch_file)
    with worker_processes(tmp_path, plane_db, "race", 2) as workers:
        pids = {w.pid for w in workers}

        # When this process submits 400 invocations and waits for every result
        ids = [q.submit(job, i) for i in range(n)]
        results = [q.result(inv, timeout=WAIT) for inv in ids]
    for w in workers:
        w.check_exited_cleanly()
    ran = [w.ran or 0 for w in workers]

    # Then every invocation ran in one of the two workers, with its own argument
    assert [r["i"] for r in results] == list(range(n))
    assert {r["pid"] for r in results} <= pids

    # And each was claimed exactly once, by the process that returned its result
    records = [dispatch_file.transport.get(inv) for inv in ids]
    assert [rec.attempt for rec in records] == [1] * n
    assert {rec.state for rec in records} == {dls.State.SUCCEEDED}
    assert [worker_pid(rec) for rec in records] == [r["pid"] for r in results]

    # And each ran exactly once: the workers' own logs hold every i once, in total
    logged = Counter(
        int(line) for path in logs.glob("ran-*.log") for line in path.read_text().split()
    )
    assert logged == Counter(range(n))

    # And the workers' counts of jobs run add up to n, one result recorded per job
    assert sum(ran) == n
    per_pid = Counter(r["pid"] for r in results)
    assert sorted(per_pid[w.pid] for w in workers) == sorted(ran)

    # And (with 400 jobs and both workers claiming before the first submit) both
    # took part
    assert len(per_pid) == 2, per_pid


def test_producer_here_worker_in_another_process(
    tmp_path: Path, plane_db: Path, dispatch_file: dls.Dispatch
) -> None:
    # Given a worker process on the file plane
    q = dls.SyncQueue("cross", dispatch=dispatch_file)
    aq = dls.Queue("cross", dispatch=dispatch_file)

    def where(x: int) -> tuple[int, int]:
        import os

        return x * 10, os.getpid()

    with worker_processes(tmp_path, plane_db, "cross", 1) as workers:
        # When this process submits calls (pickled, by reference, and one that raises)
        sync_ids = [q.submit(where, i) for i in range(5)]
        ref_id = q.submit("math:sqrt", 81.0)
        bad_id = q.submit(int, "not a number")

        # Then it gets the results the other process wrote, blocking ...
        assert [q.result(inv, timeout=WAIT) for inv in sync_ids] == [
            (i * 10, workers[0].pid) for i in range(5)
        ]
        assert q.result(ref_id, timeout=WAIT) == 9.0

        # ... and awaiting
        async def gather() -> list[Any]:
            ids = [await aq.submit(where, i) for i in range(5, 10)]
            return await asyncio.gather(*(aq.result(inv, timeout=WAIT) for inv in ids))

        assert asyncio.run(gather()) == [(i * 10, workers[0].pid) for i in range(5, 10)]

        # And the remote exception comes back as its own type, with the traceback
        with pytest.raises(ValueError, match="not a number") as info:
            q.result(bad_id, timeout=WAIT)
        assert "ValueError" in info.value.remote_traceback

    # And the records name the other process as the worker, which stopped cleanly
    workers[0].check_exited_cleanly()
    assert workers[0].pid != os.getpid()
    assert {worker_pid(dispatch_file.transport.get(i)) for i in sync_ids} == {workers[0].pid}


def test_producer_in_another_process_worker_here_results_read_by_a_third(
    plane_db: Path, dispatch_file: dls.Dispatch
) -> None:
    # Given a worker thread in this process on the file plane
    stop = threading.Event()
    worker = threading.Thread(
        target=dls.run_worker,
        args=(dls.SyncQueue("reverse", dispatch=dispatch_file),),
        kwargs={"stop": stop.is_set, "poll": 0.05},
        daemon=True,
    )
    worker.start()
    try:
        # When a producer process submits 20 calls and waits for their results
        out = run_script(PRODUCER_SCRIPT, str(plane_db), "reverse", "20")
    finally:
        stop.set()
        worker.join(timeout=WAIT)
    assert not worker.is_alive()

    # Then the producer got every result, computed here
    assert [(r["x"], r["cube"]) for r in out["results"]] == [(i, i**3) for i in range(20)]
    assert {r["pid"] for r in out["results"]} == {os.getpid()}
    assert out["pid"] != os.getpid()

    # And this process reads the same results by id, though it submitted none
    q = dls.SyncQueue("reverse", dispatch=dispatch_file)
    assert [q.result(inv, timeout=WAIT) for inv in out["ids"]] == out["results"]

    # And so does a third process that neither submitted nor ran them, after the
    # producer has exited
    read = run_script(READER_SCRIPT, str(plane_db), "reverse", stdin=json.dumps(out["ids"]))
    assert read["status"] == ["succeeded"] * 20
    assert read["results"] == out["results"]


def test_worker_process_without_the_module_fails_that_job_and_keeps_going(
    tmp_path: Path, plane_db: Path, dispatch_file: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a module only this process can import (the worker process runs without its
    # folder on sys.path), and a function from it, which pickles by reference
    here_only = tmp_path / "producer_only"
    here_only.mkdir()
    (here_only / "lakeshore_here_only_mod.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(here_only))
    monkeypatch.delitem(sys.modules, "lakeshore_here_only_mod", raising=False)
    import lakeshore_here_only_mod

    assert lakeshore_here_only_mod.triple(2) == 6
    q = dls.SyncQueue("missing-module", dispatch=dispatch_file)

    with worker_processes(tmp_path, plane_db, "missing-module", 1) as workers:
        # When a call of that function is submitted, then a good one
        bad = q.submit(lakeshore_here_only_mod.triple, 2)
        good = q.submit(pow, 2, 10)

        # Then the good one still succeeds: the worker kept going
        assert q.result(good, timeout=WAIT) == 1024
        assert workers[0].proc.poll() is None

        # And the bad one failed once, not retried, with the worker's import error
        with pytest.raises(ModuleNotFoundError, match="lakeshore_here_only_mod"):
            q.result(bad, timeout=WAIT)
        rec = dispatch_file.transport.get(bad)
        assert rec.state is dls.State.FAILED
        assert rec.attempt == 1
        assert q.status(bad) == "failed"
    workers[0].check_exited_cleanly()
    assert workers[0].ran == 2


def test_a_watch_sees_a_completion_written_while_the_poller_was_between_reads(
    plane_db: Path, dispatch_file: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given this process watching an invocation on the file plane, so its poller runs,
    # and the poller paused just before it reads the store's change marker
    store = dispatch_file.transport.store
    read_marker = store.change_marker
    pause, paused, resume = threading.Event(), threading.Event(), threading.Event()

    def change_marker() -> int:
        if pause.is_set():
            pause.clear()
            paused.set()
            resume.wait(WAIT)
        return int(read_marker())

    monkeypatch.setattr(store, "change_marker", change_marker)
    other = dls.SyncQueue("watched-elsewhere", dispatch=dispatch_file).submit(pow, 2, 1)
    unwatch_other = dispatch_file.transport.watch([other], lambda rec: None)
    pause.set()
    try:
        assert paused.wait(WAIT), "the poller never read the change marker"

        # When a new invocation is submitted and watched (still pending), and a worker
        # process runs it to completion before the poller reads the marker
        q = dls.SyncQueue("watched-here", dispatch=dispatch_file)
        inv = q.submit(pow, 2, 5)
        done = threading.Event()
        unwatch = dispatch_file.transport.watch([inv], lambda rec: done.set())
        assert not done.is_set()
        assert run_script(ONE_JOB_WORKER_SCRIPT, str(plane_db), "watched-here") == 1
        assert dispatch_file.transport.get(inv).state is dls.State.SUCCEEDED
    finally:
        resume.set()

    # Then the watch still fires (result() is built on it: else it waits forever)
    try:
        assert done.wait(5), "the completion was never delivered to the watch"
    finally:
        unwatch()
        unwatch_other()
    assert q.result(inv, timeout=WAIT) == 32
