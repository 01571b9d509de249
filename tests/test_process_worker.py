"""The process worker: child processes per slot, killed on timeout and cancel,
crash-proof, with output and progress reported to the plane."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support import counting_calls, role_token, wait_for

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.errors import InvalidRequest, LeaseLost, Unavailable
from dreamlake.lakeshore.plane.model import Claim, State
from dreamlake.lakeshore.server import LocalServer
from dreamlake.lakeshore.wire import encode_exec, encode_ref_call, encode_result
from dreamlake.lakeshore.worker import pool
from dreamlake.lakeshore.worker.child import (
    _claim_here,
    _complete_here,
    _completes_here,
    _Sent,
    child_main,
)
from dreamlake.lakeshore.worker.execute import Outcome
from dreamlake.lakeshore.worker.pipes import Pipe
from dreamlake.lakeshore.worker.pool import ProcessWorker
from dreamlake.lakeshore.worker.report import report_many


def square(x: int) -> int:
    return x * x


def chatty(n: int) -> int:
    for i in range(n):
        print(f"line {i}")
        dls.progress((i + 1) / n, f"step {i + 1}")
    return n


def sleepy(seconds: float) -> dict[str, bool]:
    time.sleep(seconds)
    return {"woke": True}


def _told(fifo: str) -> None:
    """Block until the test tells (:func:`tell`): a writer opens the FIFO and closes it."""
    with open(fifo, "rb") as told:
        told.read()


def until_told(fifo: str) -> dict[str, str]:
    _told(fifo)
    return {"path": fifo}


def pid_when_told(fifo: str) -> int:
    _told(fifo)
    return os.getpid()


def a_fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


def tell(fifo: str, *, if_waiting: bool = False) -> None:
    """End the job waiting on ``fifo`` (its open is waited for: it runs already); with
    ``if_waiting``, only if it has it open now (a test that failed before it ran)."""
    if not if_waiting:
        with open(fifo, "wb"):
            return
    with contextlib.suppress(OSError):  # (ENXIO: nobody reads it)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def segfault() -> None:
    ctypes.string_at(0)


def hard_exit() -> None:
    os._exit(3)


@contextmanager
def worker(
    dp: dls.Dispatch, queue: str, **options: Any
) -> Iterator[tuple[ProcessWorker, list[Any]]]:
    """A process worker on ``queue`` in a background thread, stopped cold after."""
    claimed: list[Any] = []
    w = ProcessWorker(dp, [queue], on_claimed=claimed.append, **options)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    try:
        yield w, claimed
    finally:
        w.request_stop()
        w.request_stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the worker did not stop"


@pytest.fixture
def dp(tmp_path: Path) -> Iterator[dls.Dispatch]:
    with dls.Dispatch(str(tmp_path / "plane.db")) as d:
        yield d


def test_jobs_run_in_child_processes_and_report_results(dp: dls.Dispatch) -> None:
    q = dls.SyncQueue("work", dispatch=dp)
    ids = [q.submit(square, i) for i in range(20)]
    with worker(dp, "work", concurrency=2):
        assert [q.result(i, timeout=60) for i in ids] == [i * i for i in range(20)]


def test_output_and_progress_reach_the_plane(dp: dls.Dispatch) -> None:
    q = dls.SyncQueue("talk", dispatch=dp)
    inv = q.submit(chatty, 3)
    with worker(dp, "talk"):
        assert q.result(inv, timeout=60) == 3
    text = "".join(e.text for e in dp.transport.read_logs(inv))
    assert text == "line 0\nline 1\nline 2\n"
    rec = dp.transport.get(inv)
    assert (rec.progress, rec.progress_message) == (1.0, "step 3")


def test_a_job_past_its_timeout_is_killed_and_fails(dp: dls.Dispatch) -> None:
    q = dls.SyncQueue("slow", dispatch=dp)
    inv = q.submit(sleepy, 60, _timeout=1)
    after = q.submit(square, 3)
    with worker(dp, "slow"):
        with pytest.raises(dls.InvocationTimeout):
            q.result(inv, timeout=30)
        # And the slot was replaced: the next job runs
        assert q.result(after, timeout=30) == 9


def test_cancel_kills_a_running_python_job_within_a_heartbeat(dp: dls.Dispatch) -> None:
    q = dls.SyncQueue("cancel", dispatch=dp)
    inv = q.submit(sleepy, 60)
    after = q.submit(square, 4)
    with worker(dp, "cancel", lease_seconds=1.5) as (_, claimed):
        wait_for(lambda: len(claimed) == 1)
        assert q.cancel(inv) == "cancelled"
        # the slot is free again well before the job would have ended
        assert q.result(after, timeout=15) == 16
    with pytest.raises(dls.CancelledError):
        q.result(inv, timeout=1)


def test_cancel_kills_a_running_exec_job_and_its_process_group(
    dp: dls.Dispatch, tmp_path: Path
) -> None:
    q = dls.SyncQueue("exec", dispatch=dp)
    marker = tmp_path / "pid"
    cmd = f"sh -c 'echo $$ > {marker}; exec sleep 60'"
    inv = submit_exec(dp, "exec", cmd)
    with worker(dp, "exec", lease_seconds=1.5):
        wait_for(marker.exists)
        wait_for(lambda: marker.read_text().strip() != "")
        pid = int(marker.read_text())
        q.cancel(inv)
        wait_for(lambda: not _alive(pid), timeout=15)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); look at its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_cold_stop_says_how_many_jobs_it_hands_back(
    dp: dls.Dispatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a worker running a long job
    q = dls.SyncQueue("long", dispatch=dp)
    inv = q.submit(sleepy, 60)
    with (
        caplog.at_level("WARNING", logger="dreamlake.lakeshore.worker"),
        worker(dp, "long") as (w, _),
    ):
        wait_for(lambda: w.running == 1 and q.status(inv) == "running", timeout=30)
        # When it is asked to stop, then to stop now
        w.request_stop()
        wait_for(lambda: "stopping once 1 running job(s) finish" in caplog.text, timeout=10)
        w.request_stop()
        wait_for(lambda: "stopping now, handing 1 job(s) back" in caplog.text, timeout=10)
    # Then it said each (above), and the job it handed back waits again
    assert q.status(inv) == "pending"


@pytest.mark.parametrize(("job", "reason"), [(segfault, "SIGSEGV"), (hard_exit, "exit code 3")])
def test_a_crashing_job_fails_and_the_worker_carries_on(
    dp: dls.Dispatch, job: Callable[[], None], reason: str
) -> None:
    q = dls.SyncQueue("crash", dispatch=dp)
    bad = q.submit(job)
    good = q.submit(square, 5)
    with worker(dp, "crash"):
        with pytest.raises(dls.WorkerCrashed, match=reason) as info:  # (a RemoteError)
            q.result(bad, timeout=30)
        assert info.value.type_name == "dreamlake.lakeshore.WorkerCrashed"
        assert isinstance(info.value, dls.RemoteError)
        assert q.result(good, timeout=30) == 25


def test_exec_jobs_stream_output_and_fail_with_their_exit_code(dp: dls.Dispatch) -> None:
    q = dls.SyncQueue("shell", dispatch=dp)
    ok = submit_exec(dp, "shell", "echo out; echo err >&2")
    bad = submit_exec(dp, "shell", "echo before; exit 7")
    with worker(dp, "shell"):
        assert q.result(ok, timeout=30)["exit_code"] == 0
        with pytest.raises(subprocess.CalledProcessError) as info:
            q.result(bad, timeout=30)
    assert info.value.returncode == 7
    logs = [(e.stream, e.text) for e in dp.transport.read_logs(ok)]
    assert sorted(logs) == [("stderr", "err\n"), ("stdout", "out\n")]
    assert [e.text for e in dp.transport.read_logs(bad)] == ["before\n"]


def submit_exec(dp: dls.Dispatch, queue: str, cmd: str) -> str:
    from dreamlake.lakeshore.plane import QueueSpec, Submission
    from dreamlake.lakeshore.submit import new_id

    dp.ensure_queue(QueueSpec(queue), strict=False, check=())
    sub = Submission(id=new_id(), queue=queue, payload=encode_exec(cmd, None, None).payload)
    return dp.transport.submit([sub])[0]


@contextmanager
def daemon_thread(daemon: Any) -> Iterator[threading.Thread]:
    """``daemon.run()`` in a thread (no signal handlers there), stopped cold after."""
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        daemon.request_stop()
        daemon.request_stop()
        thread.join(timeout=30)


def drain_ends(dp: dls.Dispatch, daemon_id: str, thread: threading.Thread) -> None:
    """A drain through the plane ends the daemon running in ``thread``."""
    dp.transport.drain_daemon(daemon_id)
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_daemon_follows_queue_and_concurrency_updates_without_restart(
    dp: dls.Dispatch, tmp_path: Path
) -> None:
    from dreamlake.lakeshore.worker.daemon import Daemon

    # Given a daemon started on no queue
    daemon = Daemon(dp, "gpu-1", concurrency=1, heartbeat_every=0.2, state_dir=tmp_path)
    with daemon_thread(daemon) as thread:
        wait_for(lambda: daemon.record is not None)
        assert daemon.record is not None
        daemon_id = daemon.record.id
        q = dls.SyncQueue("late", dispatch=dp)
        inv = q.submit(square, 6)
        # When an operator adds a queue and more slots on the plane
        dp.transport.update_daemon(daemon_id, add_queues=["late"], concurrency=2)
        # Then the running daemon serves it within a heartbeat
        assert q.result(inv, timeout=20) == 36
        wait_for(lambda: daemon.worker is not None and len(daemon.worker._slots) == 2)
        # And a drain ends it
        drain_ends(dp, daemon_id, thread)
    # And its record says it stopped of its own accord (not silent, as if killed)
    (stopped,) = [d for d in dp.transport.list_daemons() if d.id == daemon_id]
    assert stopped.stopped_at is not None and stopped.running == 0
    # And a restart under the same name keeps the identity and the plane's settings
    again = Daemon(dp, "gpu-1", state_dir=tmp_path).register()
    assert (again.id, again.queues, again.concurrency) == (daemon_id, ["late"], 2)
    assert again.stopped_at is None


def test_a_daemon_whose_worker_fails_is_not_shown_stopped(
    dp: dls.Dispatch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dreamlake.lakeshore.worker.daemon import Daemon

    # Given a daemon whose worker's loop raises (a crash: not a stop of its own accord)
    def crash(self: ProcessWorker) -> int:
        raise RuntimeError("the worker's loop failed")

    monkeypatch.setattr(ProcessWorker, "run", crash)
    daemon = Daemon(dp, "gpu-9", queues=["q"], heartbeat_every=60, state_dir=tmp_path)
    with pytest.raises(RuntimeError, match="loop failed"):
        daemon.run()
    # Then its record says nothing of a stop (it falls silent, as a killed one does)
    assert daemon.record is not None
    (rec,) = [d for d in dp.transport.list_daemons() if d.id == daemon.record.id]
    assert rec.stopped_at is None


def touch(path: str) -> dict[str, str]:
    Path(path).write_text("ran")
    return {"touched": path}


def test_short_jobs_queued_behind_a_running_one_run_in_order_and_a_cancelled_one_never(
    dp: dls.Dispatch, tmp_path: Path
) -> None:
    # Given a worker whose recent jobs were short (so it sends more behind a running one)
    q = dls.SyncQueue("work", dispatch=dp)
    with worker(dp, "work"):
        for i in range(20):
            assert q.result(q.submit(square, i), timeout=30) == i * i
        # When a slow job is followed by short ones, all claimed at once
        slow = q.submit(sleepy, 1.5)
        marks = [str(tmp_path / f"mark-{i}") for i in range(5)]
        shorts = [q.submit(touch, m) for m in marks]
        # And the last one is cancelled while it waits (behind the slow one in the child,
        # in the worker's buffer, or still on the plane: wherever it is, it must not run)
        wait_for(lambda: q.status(slow) == "running")
        victim = shorts[-1]
        q.cancel(victim)
        # Then the slow job and the others succeed; the cancelled one never ran
        assert q.result(slow, timeout=30) == {"woke": True}
        for inv, mark in zip(shorts, marks, strict=True):
            if inv == victim:
                with pytest.raises(dls.CancelledError):
                    q.result(inv, timeout=30)
            else:
                assert q.result(inv, timeout=30) == {"touched": mark}
        # And the worker still runs new work; the one slot runs in order, so had the
        # cancelled job run, it would have run before this one
        assert q.result(q.submit(square, 7), timeout=30) == 49
        assert not Path(marks[shorts.index(victim)]).exists()


def test_a_busy_worker_whose_queue_ran_dry_leaves_new_work_to_an_idle_one(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a one-slot worker whose recent jobs were short (a buffer of claims would be
    # worth holding: kept so here however long the running job takes), running a slow
    # job with nothing else on its queue
    monkeypatch.setattr(pool, "_PREFETCH_SECONDS", 60.0)
    asking: list[int] = []  # the worker's claims in flight
    claim = dp.transport.claim

    def counted(*args: Any, **kwargs: Any) -> list[Claim]:
        asking.append(kwargs["limit"])
        try:
            return claim(*args, **kwargs)
        finally:
            asking.pop()

    monkeypatch.setattr(dp.transport, "claim", counted)
    q = dls.SyncQueue("dry", dispatch=dp)
    with worker(dp, "dry") as (w, claimed):
        assert q.result(q.submit(square, 2), timeout=30) == 4
        slow = q.submit(sleepy, 2.0)
        wait_for(lambda: any(s.claim is not None and s.claim.id == slow for s in w._slots))
        # When it has run a while, and a call comes (the window is what the check of
        # an absence needs: a worker that parks a claim while busy does so within
        # milliseconds of starting the job, and nothing announces that it did not)
        time.sleep(0.3)
        assert asking == []  # (no claim of the busy worker waits on the plane)
        inv = q.submit(square, 3)
        # Then another worker gets it, not the busy one
        (got,) = claim(["dry"], "idle", limit=1, wait=5)
        assert got.id == inv
        dp.transport.complete(got.id, got.lease_token, encode_result(9)[0])
        assert q.result(inv, timeout=30) == 9
        # And once its slot is free it asks again, and takes the next call
        assert q.result(slow, timeout=30) == {"woke": True}
        assert q.result(q.submit(square, 4), timeout=30) == 16
        assert [c.id for c in claimed].count(inv) == 0


def test_a_slot_is_free_when_it_has_no_job_whatever_waits_behind_another(
    dp: dls.Dispatch,
) -> None:
    # Given two slots: one running a job with short ones queued behind it, one idle
    w = ProcessWorker(dp, ["q"], concurrency=2)
    busy, idle = w._slots
    claim = Claim("i", "q", b"", lease_token="t", lease_expires_at=0.0, attempt=1, timeout=None)
    busy.proc = idle.proc = SimpleNamespace(pid=-1)
    busy.claim, busy.queued = claim, deque([claim, claim])
    # Then a slot is free (the fetcher may wait on the plane for work), until a claim
    # taken from the buffer is on its way to it
    with w._cv:
        assert w._has_free_slot()
        w._starting = 1
        assert not w._has_free_slot()


@pytest.mark.parametrize("signals", [1, 2], ids=["one signal", "two signals"])
def test_a_sigterm_while_a_daemon_registers_stops_it_cleanly(
    dp: dls.Dispatch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signals: int
) -> None:
    import signal

    from dreamlake.lakeshore.worker.daemon import Daemon

    # Given a daemon run in this (the main) thread, sent SIGTERM while it registers,
    # before the worker's own handlers are in place (once, or twice)
    before = signal.getsignal(signal.SIGTERM)
    transport = dp.transport
    register = transport.register_daemon

    def register_then_signalled(*args: Any, **kwargs: Any) -> Any:
        rec = register(*args, **kwargs)
        for _ in range(signals):
            os.kill(os.getpid(), signal.SIGTERM)
        return rec

    monkeypatch.setattr(transport, "register_daemon", register_then_signalled)
    daemon = Daemon(dp, "early", concurrency=1, heartbeat_every=0.2, state_dir=tmp_path)
    # When it runs, then it stops at once, having run nothing, instead of the process
    # dying of the signal; warm after one signal, cold after two (as once it runs)
    assert daemon.run() == 0
    assert daemon.worker is not None and daemon.worker._stopping.is_set()
    assert daemon.worker._cold.is_set() == (signals == 2)
    # And the handlers in place before are back
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.timeout(60)
def test_a_second_signal_while_a_stop_is_being_set_is_taken_not_waited_on(
    dp: dls.Dispatch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    from dreamlake.lakeshore.worker import pool
    from dreamlake.lakeshore.worker.daemon import Daemon

    # Given a SIGTERM while a daemon registers, and a second one landing just as the
    # first is handed to the worker: while setting the worker's stop holds its lock
    class Interrupted(threading.Event):
        fired = False

        def set(self) -> None:
            with self._cond:
                if not Interrupted.fired:
                    Interrupted.fired = True
                    os.kill(os.getpid(), signal.SIGTERM)  # (its handler runs here)
                self._flag = True
                self._cond.notify_all()

    made = pool.ProcessWorker.__init__

    def with_interrupted_stop(self: pool.ProcessWorker, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        self._stopping = Interrupted()

    monkeypatch.setattr(pool.ProcessWorker, "__init__", with_interrupted_stop)
    register = dp.transport.register_daemon

    def register_then_signalled(*args: Any, **kwargs: Any) -> Any:
        rec = register(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return rec

    monkeypatch.setattr(dp.transport, "register_daemon", register_then_signalled)
    daemon = Daemon(dp, "twice", concurrency=1, heartbeat_every=0.2, state_dir=tmp_path)
    # When it runs, then the handler does not wait on the lock its own thread holds:
    # the daemon stops, cold (two signals)
    assert daemon.run() == 0
    assert Interrupted.fired
    assert daemon.worker is not None and daemon.worker._cold.is_set()


def test_a_named_daemon_whose_record_is_removed_registers_again(
    dp: dls.Dispatch, tmp_path: Path
) -> None:
    from dreamlake.lakeshore.worker.daemon import Daemon

    # Given a named daemon serving (in a thread: no signal handlers) with an update applied
    daemon = Daemon(dp, "box", queues=["a"], heartbeat_every=0.05, state_dir=tmp_path)
    rec = daemon.register()
    dp.transport.update_daemon(rec.id, add_queues=["b"], concurrency=2)
    with daemon_thread(daemon) as thread:
        wait_for(lambda: daemon.worker is not None and daemon.worker.queues == ["a", "b"])
        # When its record is removed from the plane
        assert dp.transport.remove_daemon(rec.id) is True
        # Then it registers again under its id, as it runs now (so it can be reached)
        wait_for(lambda: [d.id for d in dp.transport.list_daemons()] == [rec.id], timeout=10)
        (again,) = dp.transport.list_daemons()
        assert (again.queues, again.concurrency) == (["a", "b"], 2)
        # and a drain through the plane still stops it
        drain_ends(dp, rec.id, thread)


def test_a_sigterm_as_a_daemons_worker_begins_its_run_stops_it(
    dp: dls.Dispatch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    from dreamlake.lakeshore.worker import pool
    from dreamlake.lakeshore.worker.daemon import Daemon

    # Given a daemon run in this (the main) thread, sent SIGTERM after its worker was
    # made, before the worker's run put its own handlers in place
    before = signal.getsignal(signal.SIGTERM)
    run = pool.ProcessWorker.run

    def signalled_then_run(self: pool.ProcessWorker) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        return run(self)

    monkeypatch.setattr(pool.ProcessWorker, "run", signalled_then_run)
    daemon = Daemon(dp, "late", concurrency=1, heartbeat_every=0.2, state_dir=tmp_path)
    # When it runs, then the signal is not lost: it stops at once, having run nothing
    assert daemon.run() == 0
    assert daemon.worker is not None and daemon.worker._stopping.is_set()
    assert not daemon.worker._cold.is_set()  # (one signal: a warm stop)
    # And the handlers in place before are back
    assert signal.getsignal(signal.SIGTERM) is before


# --- a lone job's completion, sent by its job process ----------------------------------


def loud(x: int) -> int:
    print("working")
    return x + 1


@pytest.fixture
def remote(served: LocalServer) -> Iterator[tuple[dls.Dispatch, dls.Dispatch]]:
    """A producer's and a worker's Dispatch on ``lakeshore serve``."""
    with (
        dls.Dispatch(served.url, token=role_token(served, "producer")) as producer,
        dls.Dispatch(served.url, token=role_token(served, "worker")) as worker_dp,
    ):
        yield producer, worker_dp


@pytest.fixture
def nearby(
    remote: tuple[dls.Dispatch, dls.Dispatch], monkeypatch: pytest.MonkeyPatch
) -> tuple[dls.Dispatch, dls.Dispatch]:
    """``remote``, its plane taken as close by however loaded the machine: job processes
    complete lone jobs and make the worker's claims (the report bound is generous)."""
    monkeypatch.setattr(pool, "_REPORT_HERE_SECONDS", 10.0)
    return remote


def parent_reports(monkeypatch: pytest.MonkeyPatch, dp: dls.Dispatch) -> list[list[str]]:
    """The ids the worker's own process completes on the plane, call by call."""
    sent: list[list[str]] = []
    complete_many = dp.transport.complete_many

    def counting(items: Any) -> Any:
        sent.append([item[0] for item in items])
        return complete_many(items)

    monkeypatch.setattr(dp.transport, "complete_many", counting)
    return sent


@pytest.mark.parametrize(
    ("bound", "max_jobs", "by_parent"),
    [(10.0, None, 1), (0.0, None, 4), (10.0, 8, 4)],
    ids=[
        "reports quick: the job processes complete",
        "reports slow: the parent does",
        "children recycled every 8 jobs: the parent does",
    ],
)
def test_a_lone_silent_job_is_completed_by_its_job_process_while_reports_are_quick(
    remote: tuple[dls.Dispatch, dls.Dispatch],
    monkeypatch: pytest.MonkeyPatch,
    bound: float,
    max_jobs: int | None,
    by_parent: int,
) -> None:
    # Given a process worker doing nothing else, and how long its reports may take for
    # its job processes to complete lone jobs (generous or nil here: a loaded test
    # machine is slow)
    monkeypatch.setattr(pool, "_REPORT_HERE_SECONDS", bound)
    producer, worker_dp = remote
    q = dls.SyncQueue("lone", dispatch=producer)
    sent = parent_reports(monkeypatch, worker_dp)
    with worker(worker_dp, "lone", max_jobs_per_child=max_jobs) as (w, _):
        # When calls come one at a time, and their jobs print nothing
        ids = []
        for i in range(4):
            ids.append(q.submit(square, i))
            assert q.result(ids[-1], timeout=60) == i * i
        wait_for(lambda: w.completed == 4)
    # Then the parent reported the first (how long reports take was not known yet);
    # the later ones the job processes completed on the plane themselves, unless the
    # parent's reports took longer than the bound (its slot is free while it reports)
    assert [inv for batch in sent for inv in batch] == ids[:by_parent]
    assert w.report_seconds is not None


def _switches(thread: threading.Thread) -> int:
    """How many times ``thread`` has slept and woken (its voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_the_reporter_sleeps_while_job_processes_complete_their_jobs(
    nearby: tuple[dls.Dispatch, dls.Dispatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a process worker whose job processes complete lone jobs themselves (its
    # reporter has nothing to send), warmed up
    producer, worker_dp = nearby
    q = dls.SyncQueue("quiet", dispatch=producer)
    sent = parent_reports(monkeypatch, worker_dp)
    with worker(worker_dp, "quiet") as (w, _):
        idle_with_a_claiming_child(w, q)
        [reporter] = [t for t in threading.enumerate() if t.name == "lakeshore-report"]
        before, reports = _switches(reporter), len(sent)
        # When 20 calls come one at a time
        for i in range(20):
            assert q.result(q.submit(square, i), timeout=60) == i * i
        wait_for(lambda: w.completed == 21)
        # Then the reporter slept through them: the fetcher's wake-ups (a slot freed, a
        # claim answered: several a job) are not its own (it woke ~8 times a job)
        assert len(sent) == reports
        assert _switches(reporter) - before <= 3


def parent_claims(monkeypatch: pytest.MonkeyPatch, dp: dls.Dispatch) -> list[list[str]]:
    """The ids the worker's own process leases, claim by claim (empty ones left out)."""
    leased: list[list[str]] = []
    claim = dp.transport.claim

    def counting(*args: Any, **kwargs: Any) -> Any:
        claims = claim(*args, **kwargs)
        if claims:
            leased.append([c.id for c in claims])
        return claims

    monkeypatch.setattr(dp.transport, "claim", counting)
    return leased


def idle_with_a_claiming_child(w: ProcessWorker, q: dls.SyncQueue) -> None:
    """Warm ``w`` up (its first report measures the plane) until a job process of its
    makes its claim (once the parent's own claim, sent before that, came back empty:
    these tests wait 0.5 s a claim)."""
    assert q.result(q.submit(square, 1), timeout=60) == 1
    wait_for(lambda: any(s.claiming for s in w._slots))


def parked_in_a_job_process(
    dp: dls.Dispatch, queue: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[ProcessWorker, threading.Thread]:
    """A one-slot process worker, started, whose job process is in a claim that lasts
    (30 s: no gap between two claims to stop or kill it in), its plane known as close."""
    monkeypatch.setattr(pool, "_CLAIM_WAIT_CAP", 30.0)
    w = ProcessWorker(dp, [queue], max_idle_wait=30.0)
    w.report_seconds = 0.0  # (the first report would measure it: not needed here)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    wait_for(lambda: w._slots[0].claiming)
    return w, thread


def test_an_idle_workers_claim_is_made_by_its_job_process_which_runs_what_it_leased(
    nearby: tuple[dls.Dispatch, dls.Dispatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an idle process worker on a plane close by (its job processes complete lone
    # jobs: the bound is generous here, a loaded test machine is slow), with two slots
    producer, worker_dp = nearby
    q = dls.SyncQueue("selfclaim", dispatch=producer)
    leased = parent_claims(monkeypatch, worker_dp)
    with worker(worker_dp, "selfclaim", concurrency=2, max_idle_wait=0.5) as (w, claimed):
        idle_with_a_claiming_child(w, q)
        before = len(leased)
        # When calls come one at a time, and then six at once
        lone = []
        for i in range(3):
            lone.append(q.submit(square, i))
            assert q.result(lone[-1], timeout=60) == i * i
            wait_for(lambda: any(s.claiming for s in w._slots))
        with dls.batch():
            burst = [q.submit(square, i) for i in range(6)]
        assert [q.result(inv, timeout=60) for inv in burst] == [i * i for i in range(6)]
        wait_for(lambda: w.completed == 10)
    # Then a job process leased each lone call, and the burst's first two (a claim for
    # both slots; the first ran in that job process, the second went to the other slot),
    # the parent none of them; it claims itself only while the worker is busy
    by_parent = {inv for ids in leased[before:] for inv in ids}
    assert not by_parent & {*lone, *burst[:2]}
    ids = [c.id for c in claimed]  # (and every call was started once)
    assert set(lone + burst) <= set(ids) and len(ids) == len(set(ids)) == 10


def test_a_job_process_carries_the_claim_on_from_one_lone_call_to_the_next(
    nearby: tuple[dls.Dispatch, dls.Dispatch], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given an idle one-slot worker on a plane close by, its job process making its claim
    producer, worker_dp = nearby
    q = dls.SyncQueue("chain", dispatch=producer)
    leased = parent_claims(monkeypatch, worker_dp)
    with worker(worker_dp, "chain", max_idle_wait=0.5, prefetch=0) as (w, _):
        idle_with_a_claiming_child(w, q)
        handed = counting_calls(w, "_claim_in_child", monkeypatch)
        before = len(leased)
        # When calls come one at a time
        for i in range(10):
            assert q.result(q.submit(square, i), timeout=60) == i * i
        # Then the job process made each next claim as its job ended: the fetcher handed
        # it none (it still waits on the claim it handed over first), the parent made none
        assert handed == [] and leased[before:] == []
        # When a call prints (the parent reports it: the chain ends there), the claims
        # handed over from then on waiting long (no empty answer ends the chain)
        monkeypatch.setattr(pool, "_CLAIM_WAIT_CAP", 30.0)
        w.max_idle_wait = 30.0
        assert q.result(q.submit(chatty, 1), timeout=60) == 1
        for i in range(3):
            assert q.result(q.submit(square, i), timeout=60) == i * i
        # Then the fetcher handed its claim to the job process once more, and from there
        # the chain went on
        wait_for(lambda: len(handed) == 1)
        assert leased[before:] == []
        # When the worker grows a slot while the chain holds the fetcher's claim (one
        # call a claim: no prefetch), and two calls come at once
        w.set_concurrency(2)
        wait_for(lambda: len(w._slots) == 2)
        fifos = [a_fifo(tmp_path / "one"), a_fifo(tmp_path / "two")]
        with dls.batch():
            two = [q.submit(pid_when_told, fifo) for fifo in fifos]

        # Then they run side by side, each in a slot of its own (the new slot was not
        # left idle while the chain went on in the first): both started before either
        # is told to end (leased is not enough: a call leased with the other, buffered,
        # would start in whichever slot frees first)
        def both_started() -> bool:
            return sorted(s.claim.id for s in w._slots if s.claim is not None) == sorted(two)

        try:
            wait_for(both_started)
        except BaseException:
            for fifo in fifos:
                tell(fifo, if_waiting=True)
            raise
        for fifo in fifos:
            tell(fifo)
        pids = [q.result(inv, timeout=60) for inv in two]
        assert len(set(pids)) == 2
        wait_for(lambda: w.completed == 17)


def test_a_slot_that_frees_while_another_runs_a_long_job_takes_the_next_call(
    nearby: tuple[dls.Dispatch, dls.Dispatch], tmp_path: Path
) -> None:
    # Given a two-slot worker on a plane close by (its job processes make its claims),
    # running two calls that end when told, each in a slot, the second claimed by the
    # job process of the slot that was idle while the first ran
    producer, worker_dp = nearby
    q = dls.SyncQueue("two-slots", dispatch=producer)
    first, second = a_fifo(tmp_path / "first"), a_fifo(tmp_path / "second")
    with worker(worker_dp, "two-slots", concurrency=2, max_idle_wait=0.5) as (w, _):
        idle_with_a_claiming_child(w, q)
        a = q.submit(until_told, first)
        wait_for(lambda: q.status(a) == "running")
        wait_for(lambda: any(s.claiming for s in w._slots))
        b = q.submit(until_told, second)
        wait_for(lambda: q.status(b) == "running")
        # When the first ends, and a call comes while the second still runs
        tell(first)
        assert q.result(a, timeout=60) == {"path": first}
        try:
            # Then the freed slot takes it (it waited for the second to end before)
            assert q.result(q.submit(square, 7), timeout=20) == 49
            assert q.status(b) == "running"
        except BaseException:
            tell(second, if_waiting=True)
            raise
        tell(second)
        assert q.result(b, timeout=60) == {"path": second}


def test_a_child_recycled_after_its_jobs_is_replaced_once(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker whose job processes are replaced every two jobs
    q = dls.SyncQueue("recycled", dispatch=dp)
    with worker(dp, "recycled", max_jobs_per_child=2) as (w, _):
        died = counting_calls(w, "_died", monkeypatch)
        spawned = counting_calls(w, "_spawn", monkeypatch)
        # When six calls come one at a time
        for i in range(6):
            assert q.result(q.submit(square, i), timeout=60) == i * i
        # Then each replacement was a retirement and one spawn: the new child was not
        # taken for dead (the old pipe, closed, was read again after the recycle, and a
        # healthy child was joined for 5 s and spawned anew)
        wait_for(lambda: len(spawned) >= 3)
        assert died == [] and len(spawned) == 3


@pytest.mark.parametrize("stop", ["first", "cold"])
def test_a_stop_while_a_job_process_claims_runs_nothing_more_and_holds_nothing(
    remote: tuple[dls.Dispatch, dls.Dispatch], monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    # Given an idle worker whose job process waits on the plane for its claim
    producer, worker_dp = remote
    q = dls.SyncQueue("stopping", dispatch=producer)
    w, thread = parked_in_a_job_process(worker_dp, "stopping", monkeypatch)
    # When the worker is stopped (once: drain; twice: cold), and then a call comes that
    # its job process's claim may lease
    w.request_stop()
    if stop == "cold":
        w.request_stop()
    inv = q.submit(square, 7)
    thread.join(timeout=30)
    assert not thread.is_alive()
    # Then the stopping worker did not run it, and holds no lease on it: another
    # worker gets it at once
    assert producer.transport.get(inv).state is State.PENDING
    (claim,) = worker_dp.transport.claim(["stopping"], "other", limit=1, wait=5)
    assert claim.id == inv


def test_a_job_process_that_does_not_answer_a_stop_in_time_is_killed(
    remote: tuple[dls.Dispatch, dls.Dispatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an idle worker whose job process claims, and no time for it to answer a stop
    monkeypatch.setattr(pool, "_CLAIM_GRACE", -60.0)
    _, worker_dp = remote
    w, thread = parked_in_a_job_process(worker_dp, "deaf", monkeypatch)
    (slot,) = w._slots
    child = slot.proc
    # When the worker is stopped
    w.request_stop()
    thread.join(timeout=30)
    # Then it stopped, its job process killed mid-claim
    assert not thread.is_alive()
    assert child.exitcode == -signal.SIGKILL


def test_a_job_process_makes_a_claim_and_runs_nothing_once_its_worker_stops() -> None:
    claims = [
        Claim(f"i{n}", "q", b"", lease_token="t", lease_expires_at=0.0, attempt=1, timeout=None)
        for n in range(2)
    ]

    def plane_answering(answer: Any) -> Callable[[], Any]:
        def claim(*args: Any, **kwargs: Any) -> Any:
            if isinstance(answer, Exception):
                raise answer
            return answer

        return lambda: SimpleNamespace(transport=SimpleNamespace(claim=claim))

    def ask(answer: Any, *, stopping: bool = False) -> tuple[Any, Any]:
        parent_end, child_end = multiprocessing.Pipe()
        msg = ("claim", ["q"], "w", 2, 0.0, 60.0, True, False)
        plane = plane_answering(answer)
        to_run = _claim_here(plane, msg, _Sent(Pipe(child_end)), lambda: stopping)
        return to_run, parent_end.recv()[:4]

    # leased: the parent hears of it all first, and this process runs the first
    assert ask(claims) == (claims, ("claimed", claims, None, True))
    # the worker is stopping: it runs none, and the parent hands them back
    assert ask(claims, stopping=True) == ([], ("claimed", claims, None, False))
    # the claim failed: the reason goes to the parent, which asks again later
    assert ask(Unavailable("the plane is away")) == (
        [],
        ("claimed", [], "Unavailable: the plane is away", False),
    )


def test_a_skip_that_comes_after_its_job_ran_does_not_skip_a_later_retry_of_it() -> None:
    # Given a job process that ran a claim, and then heard it was to be skipped (the
    # parent took it back while the child was already running it)
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe()
    proc = ctx.Process(target=child_main, args=(child_end, [], 1 << 20, ":memory:", None))
    proc.start()
    child_end.close()
    payload = encode_ref_call("builtins:abs", (-3,), {}).payload
    claim = Claim("i", "q", payload, "a", lease_expires_at=0.0, attempt=1, timeout=None)
    nap = encode_ref_call("time:sleep", (0.3,), {}).payload
    busy = Claim("n", "q", nap, "c", lease_expires_at=0.0, attempt=1, timeout=None)
    try:
        parent_end.send(("run", claim, {}, False))
        assert parent_end.recv()[:2] == ("done", "i")
        # When, while it runs another job, the skip and then the same invocation again (a
        # retry) come, so that it reads both at once
        parent_end.send(("run", busy, {}, False))
        parent_end.send(("skip", "i"))
        retry = Claim("i", "q", payload, "b", lease_expires_at=0.0, attempt=2, timeout=None)
        parent_end.send(("run", retry, {}, False))
        # Then it runs the retry
        assert parent_end.recv()[:2] == ("done", "n")
        answer = parent_end.recv()
        assert answer[:2] == ("done", "i") and answer[2].ok
    finally:
        parent_end.send(("stop",))
        proc.join(timeout=10)


def test_a_job_process_killed_while_it_claims_is_replaced_and_the_worker_carries_on(
    remote: tuple[dls.Dispatch, dls.Dispatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, worker_dp = remote
    q = dls.SyncQueue("killed", dispatch=producer)
    w, thread = parked_in_a_job_process(worker_dp, "killed", monkeypatch)
    try:
        # When the job process making the claim dies
        (slot,) = w._slots
        first = slot.proc
        first.kill()
        # Then a new one takes its place, and the next call runs (the dead one's claim,
        # parked on the server, is dropped when the server hears it hung up)
        wait_for(lambda: slot.proc is not None and slot.proc is not first)
        assert q.result(q.submit(square, 4), timeout=20) == 16
    finally:
        w.request_stop()
        w.request_stop()
        thread.join(timeout=30)


@pytest.mark.parametrize(("job", "reason"), [(segfault, "SIGSEGV"), (hard_exit, "exit code 3")])
def test_a_job_its_own_job_process_claimed_that_crashes_fails_and_the_worker_carries_on(
    nearby: tuple[dls.Dispatch, dls.Dispatch],
    monkeypatch: pytest.MonkeyPatch,
    job: Callable[[], None],
    reason: str,
) -> None:
    producer, worker_dp = nearby
    q = dls.SyncQueue("crashself", dispatch=producer)
    leased = parent_claims(monkeypatch, worker_dp)
    with worker(worker_dp, "crashself", max_idle_wait=0.5) as (w, _):
        idle_with_a_claiming_child(w, q)
        before = len(leased)
        bad = q.submit(job)
        with pytest.raises(dls.RemoteError, match=reason) as info:
            q.result(bad, timeout=30)
        assert info.value.type_name == "dreamlake.lakeshore.WorkerCrashed"
        assert len(leased) == before  # (its job process had claimed it)
        assert q.result(q.submit(square, 5), timeout=30) == 25


@pytest.mark.parametrize("job", ["prints", "reports progress"])
def test_a_job_that_tells_its_parent_something_is_reported_by_the_parent_after_it(
    remote: tuple[dls.Dispatch, dls.Dispatch], monkeypatch: pytest.MonkeyPatch, job: str
) -> None:
    # Given a lone job that writes output, or reports progress
    producer, worker_dp = remote
    q = dls.SyncQueue("told", dispatch=producer)
    sent = parent_reports(monkeypatch, worker_dp)
    with worker(worker_dp, "told"):
        inv = q.submit(loud, 1) if job == "prints" else q.submit(chatty_quietly, 2)
        # When its result is read
        assert q.result(inv, timeout=60) in (2,)
        # Then what it told the parent is on the plane already: the parent reported it
        if job == "prints":
            assert "".join(e.text for e in producer.transport.read_logs(inv)) == "working\n"
        else:
            rec = producer.transport.get(inv)
            assert (rec.progress, rec.progress_message) == (1.0, "step 2")
    assert sent == [[inv]]


def chatty_quietly(n: int) -> int:
    for i in range(n):
        dls.progress((i + 1) / n, f"step {i + 1}")
    return n


def test_a_job_process_leaves_the_report_to_the_parent_when_it_cannot_send_it() -> None:
    claim = Claim("i", "q", b"", lease_token="t", lease_expires_at=0.0, attempt=1, timeout=None)
    done = Outcome(ok=True, result=encode_result(1)[0])

    def unreachable() -> dls.Dispatch:
        raise Unavailable("the plane is away")

    def answering(refusal: Exception | None) -> Callable[[], Any]:
        transport = SimpleNamespace(complete_many=lambda items: [refusal])
        return lambda: SimpleNamespace(transport=transport)

    # a completion that does not reach the plane: the parent reports it (and retries)
    assert not _complete_here(unreachable, claim, done)
    # one the plane refuses as unreadable: the parent reports it (and fails the job)
    assert not _complete_here(answering(InvalidRequest("not an envelope")), claim, done)
    # accepted, or refused as the plane's decision (the lease is gone): done here
    assert _complete_here(answering(None), claim, done)
    assert _complete_here(answering(LeaseLost("taken back")), claim, done)
    # a failure, a data manifest or result blobs: always the parent's
    assert _completes_here(done)
    assert not _completes_here(Outcome(ok=False, error={"type": "E"}))
    assert not _completes_here(Outcome(ok=True, result=b"", manifest=["k"]))
    assert not _completes_here(Outcome(ok=True, result=b"", blobs={"d": b"x"}))


def test_a_result_the_plane_refuses_as_unreadable_fails_its_invocation(
    remote: tuple[dls.Dispatch, dls.Dispatch],
) -> None:
    # Given a claim, and an outcome whose result no reader could decode
    producer, worker_dp = remote
    q = dls.SyncQueue("odd", dispatch=producer)
    inv = q.submit(square, 3)
    (claim,) = worker_dp.transport.claim(["odd"], "w", limit=1, wait=5)
    # When the worker reports it
    report_many(worker_dp, [(claim, Outcome(ok=True, result=b"\xc1"))])
    # Then the invocation failed with the plane's reason, and is not retried
    with pytest.raises(Exception, match="refused the job's result") as caught:
        q.result(inv, timeout=10)
    assert not isinstance(caught.value, TimeoutError)
    assert producer.transport.get(inv).state is State.FAILED


def test_a_result_blob_sent_before_but_gone_from_the_plane_is_sent_again(
    remote: tuple[dls.Dispatch, dls.Dispatch],
) -> None:
    # Given a claim whose result is a blob this worker's Dispatch sent before (so it
    # would not send it again) but the plane no longer holds (expired since)
    producer, worker_dp = remote
    q = dls.SyncQueue("again", dispatch=producer)
    inv = q.submit(square, 3)
    (claim,) = worker_dp.transport.claim(["again"], "w", limit=1, wait=5)
    big = b"x" * 100_000
    result, blobs = encode_result(big, inline_limit=1024)
    worker_dp._blobs.update(blobs)  # (as if sent long ago)
    # When the worker reports it, then the plane refuses the result that names a blob
    # it lacks, the worker sends the blob again, and the result is recorded
    report_many(worker_dp, [(claim, Outcome(ok=True, result=result, blobs=blobs))])
    assert q.result(inv, timeout=10) == big


def test_a_ref_call_answering_a_map_with_int_keys_reads_back() -> None:
    # msgpack results travel as maps with string keys: this one goes pickled instead
    with dls.Dispatch(":memory:") as dp:
        q = dls.SyncQueue("maps", dispatch=dp)
        inv = q.submit("builtins:dict", [[1, "a"], [2, "b"]])
        dls.run_worker(q, once=True)
        assert q.result(inv, timeout=10) == {1: "a", 2: "b"}


@pytest.mark.parametrize("why", ["cancel", "timeout"])
def test_a_job_whose_child_is_completing_it_is_not_killed(dp: dls.Dispatch, why: str) -> None:
    # Given a slot whose job has ended and whose child said it completes it itself
    w = ProcessWorker(dp, ["q"])
    slot = w._slots[0]
    parent_end, child_end = multiprocessing.Pipe()
    claim = Claim("i", "q", b"", lease_token="t", lease_expires_at=0.0, attempt=1, timeout=1.0)
    killed: list[str] = []
    w._kill = lambda s, reason: killed.append(reason)  # type: ignore[method-assign]
    slot.proc, slot.conn = SimpleNamespace(pid=-1), Pipe(parent_end)
    w._begin(slot, claim)
    child_end.send(("finishing", claim.id))
    # When a heartbeat finds it finished (as cancelled), or its timeout passes, before
    # the parent read the child's word
    if why == "cancel":
        slot.cancel_requested = True
    else:
        slot.deadline = time.monotonic() - 1
    w._enforce()
    # Then nothing is killed: the child's word, sent first, was read first
    assert killed == [] and slot.finishing
    # and a job that is still running is killed as before
    w._begin(slot, claim)
    slot.cancel_requested = True
    w._enforce()
    assert killed == ["cancel"]


def test_a_job_process_rings_its_parent_for_every_word_but_a_quiet_one() -> None:
    # Given a job process's end of its pipe, and its bell (the pipe its parent waits on)
    parent_end, child_end = multiprocessing.Pipe()
    bell_r, bell_w = multiprocessing.Pipe(duplex=False)
    sent = _Sent(Pipe(child_end), Pipe(bell_w))
    bell = Pipe(bell_r)
    # When it says its job ended, quietly (its parent waits on nothing for it)
    sent.send(("finishing", "i"), quiet=True)
    # Then the word is on the pipe, in order, and the bell did not ring
    assert not bell.ready() and parent_end.recv() == ("finishing", "i")
    # When it says something its parent must read now, then the bell rings once
    sent.send(("done", "i"))
    assert bell.ready() and bell.recv_bytes() == b"" and not bell.ready()
    assert parent_end.recv() == ("done", "i")


def test_a_job_process_rings_before_a_word_too_large_for_the_pipe() -> None:
    # Given a job process's end of its pipe and its bell, and a parent that waits on the
    # bell alone, as the worker's loop does, and then reads the pipe
    parent_end, child_end = multiprocessing.Pipe()
    bell_r, bell_w = multiprocessing.Pipe(duplex=False)
    sent = _Sent(Pipe(child_end), Pipe(bell_w))
    word = ("done", "i", b"x" * (1 << 20))  # (far more than the pipe holds)
    got: list[Any] = []

    def parent() -> None:
        if bell_r.poll(10):
            got.append(parent_end.recv())

    reading = threading.Thread(target=parent, daemon=True)
    reading.start()
    # When it sends a word too large for the pipe
    sending = threading.Thread(target=sent.send, args=(word,), daemon=True)
    sending.start()
    # Then the parent was rung before the write, and the write did not wait for good
    sending.join(10)
    reading.join(10)
    assert not sending.is_alive() and got == [word]


def _dead_slot(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch, signum: int
) -> tuple[ProcessWorker, Any, Any, list[tuple[str, Any]], list[str]]:
    """A one-slot worker whose job process is gone (``signum`` ended it; no other is
    started), stood in for by a pipe: the worker, its slot, the child's end of the pipe,
    and the outcomes it records and the claims it hands back from then on."""
    w = ProcessWorker(dp, ["q"])
    w._cold.set()
    slot = w._slots[0]
    parent_end, child_end = multiprocessing.Pipe()
    bell_r, _ = multiprocessing.Pipe(duplex=False)
    slot.conn, slot.bell = Pipe(parent_end), Pipe(bell_r)
    slot.proc = SimpleNamespace(
        join=lambda timeout=None: None, exitcode=-signum, is_alive=lambda: False, kill=lambda: None
    )
    recorded: list[tuple[str, Any]] = []
    released: list[str] = []
    monkeypatch.setattr(w, "_record", lambda c, out, **_: recorded.append((c.id, out)))
    monkeypatch.setattr(dp.transport, "release", lambda inv_id, token: released.append(inv_id))
    return w, slot, child_end, recorded, released


def test_a_job_begun_after_the_one_its_process_was_killed_for_is_handed_back(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a slot whose job was cancelled and its process killed, which had said the
    # job ended just before (read only now), with another job queued behind it
    w, slot, child_end, recorded, released = _dead_slot(dp, monkeypatch, signal.SIGKILL)
    first, second = (
        Claim(i, "q", b"", lease_token="t", lease_expires_at=0.0, attempt=1, timeout=None)
        for i in ("a", "b")
    )
    w._begin(slot, first)
    slot.queued.append(second)
    w._kill(slot, "cancel")
    child_end.send(("done", "a", Outcome(ok=True, result=b"r"), 50.0, False, None))
    # When its parent learns of its end
    w._died(slot)
    # Then the cancelled job's outcome counts as it ended, and the one begun behind it
    # goes back untried (not dropped, its lease left to run out)
    assert [(i, out.ok) for i, out in recorded] == [("a", True)] and released == ["b"]


def test_a_job_process_that_dies_after_its_quiet_word_has_its_claim_failed_not_handed_back(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a one-slot worker whose job process made its claim, said quietly that it
    # leased a call (its parent has not read it yet), then died running that call
    w, slot, child_end, recorded, released = _dead_slot(dp, monkeypatch, signal.SIGSEGV)
    slot.claiming = True
    claim = Claim("i", "q", b"", lease_token="t", lease_expires_at=0.0, attempt=1, timeout=None)
    child_end.send(("claimed", [claim], None, True, time.monotonic()))
    # When its parent learns of its end
    w._died(slot)
    # Then the call it leased is failed as the crash it was, not handed back untried (a
    # call that crashes its job process would come back again and again)
    assert [(i, out.error["type"]) for i, out in recorded] == [
        ("i", "dreamlake.lakeshore.WorkerCrashed")
    ]
    assert released == []


def test_failing_claims_are_told_once_with_their_reason_and_again_when_they_go_through(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a plane whose first three claims fail as a plane that went away does
    failures = 3
    claim = dp.transport.claim

    def away(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise Unavailable("cannot reach the plane at http://plane.example: refused")
        return claim(*args, **kwargs)

    monkeypatch.setattr(dp.transport, "claim", away)
    q = dls.SyncQueue("flaky", dispatch=dp)
    inv = q.submit(square, 4)
    # When a worker serves the queue, then its job runs once claims go through
    with caplog.at_level(logging.WARNING, logger="dreamlake.lakeshore.worker"), worker(dp, "flaky"):
        assert q.result(inv, timeout=60) == 16
    # and it said why claims failed once (not once a try), and that they go through again
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name == "dreamlake.lakeshore.worker" and "claim" in r.getMessage()
    ]
    assert len(said) == 2
    assert said[0] == (
        "lakeshore worker: a claim failed: Unavailable: cannot reach the plane at"
        " http://plane.example: refused; retrying"
    )
    assert said[1].startswith("lakeshore worker: claims go through again, after ")


def test_claims_failing_for_long_are_told_again_at_the_reminder_or_a_new_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing = pool._Failing()
    with caplog.at_level(logging.WARNING, logger="dreamlake.lakeshore.worker"):
        # Given claims failing for one reason, again within the reminder's interval
        failing.failed("Unavailable: cannot reach the plane")
        failing.failed("Unavailable: cannot reach the plane")
        # then for another (the plane back, the token revoked meanwhile), and the two
        # alternating within the interval
        failing.failed("Forbidden: token revoked")
        failing.failed("Unavailable: cannot reach the plane")
        failing.failed("Forbidden: token revoked")
        # and on past the interval
        monkeypatch.setattr(pool, "_FAILING_REMINDER", 0.0)
        failing.failed("Forbidden: token revoked")
        failing.answered()
        failing.answered()  # (said once)
    # Then the first, the new reason at once (once), the reminder and the return are told
    said = [r.getMessage() for r in caplog.records if r.name == "dreamlake.lakeshore.worker"]
    assert said[0] == (
        "lakeshore worker: a claim failed: Unavailable: cannot reach the plane; retrying"
    )
    assert said[1].startswith("lakeshore worker: claims still failing after 0s: Forbidden: token")
    assert said[2].startswith("lakeshore worker: claims still failing after 0s: Forbidden: token")
    assert said[3].startswith("lakeshore worker: claims go through again")
    assert len(said) == 4


def test_a_worker_whose_token_the_plane_does_not_know_says_what_that_most_often_means(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="dreamlake.lakeshore.worker"):
        pool._Failing().failed("Unauthorized: unknown or wrong token")
    (said,) = [r.getMessage() for r in caplog.records if r.name == "dreamlake.lakeshore.worker"]
    assert said.startswith("lakeshore worker: a claim failed: Unauthorized: unknown or wrong token")
    assert "`lakeshore dev`, which keeps nothing across a restart" in said


def test_a_job_process_claim_that_goes_through_is_told_at_once(
    dp: dls.Dispatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a worker whose claims failed (as a job process's claim does, with its reason)
    w = ProcessWorker(dp, ["q"])
    slot = pool._Slot(0)
    with caplog.at_level(logging.WARNING, logger="dreamlake.lakeshore.worker"):
        w._claimed_in_child(slot, [], "Unavailable: the plane is away", False)
        w._failing.failed("Unavailable: the plane is away")
        # When a job process's claim goes through (even one that found nothing, or whose
        # job holds its claim open on a one-slot worker)
        w._claimed_in_child(slot, [], None, False)
    # Then the worker says so then, not when the fetcher next hears from the plane
    said = [r.getMessage() for r in caplog.records if r.name == "dreamlake.lakeshore.worker"]
    assert len(said) == 2 and said[1].startswith("lakeshore worker: claims go through again")


def test_an_outcome_the_plane_does_not_take_is_said_with_its_call(
    remote: tuple[dls.Dispatch, dls.Dispatch],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dreamlake.lakeshore.errors import Unauthorized

    # Given a claimed call, and a plane that refuses the worker's token when it reports
    producer, worker_dp = remote
    q = dls.SyncQueue("lost", dispatch=producer)
    inv = q.submit(square, 3)
    (claim,) = worker_dp.transport.claim(["lost"], "w", limit=1, wait=5)

    def revoked(*args: Any, **kwargs: Any) -> Any:
        raise Unauthorized("this token was revoked")

    monkeypatch.setattr(worker_dp.transport, "complete_many", revoked)
    # When its result is reported
    with caplog.at_level(logging.WARNING, logger="dreamlake.lakeshore.worker"):
        report_many(worker_dp, [(claim, Outcome(ok=True, result=encode_result(9)[0]))])
    # Then the worker says which call's result was lost, why, and what happens to it
    (said,) = [r.getMessage() for r in caplog.records if r.name == "dreamlake.lakeshore.worker"]
    assert f"the result of 1 call(s) ({inv}) did not reach the plane" in said
    assert "Unauthorized: this token was revoked" in said
    assert "the plane hands each on when its lease runs out" in said
    assert producer.transport.get(inv).state is State.RUNNING
