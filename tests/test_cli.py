"""The ``lakeshore`` command line on a file plane: queues, exec, invocations, and workers
and daemons as real processes (SIGTERM drain, kill -9 redelivery, live daemon update)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import wait_for
from typer.testing import CliRunner

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.cli.app import app
from dreamlake.lakeshore.server import LocalServer
from dreamlake.lakeshore.worker.pool import ProcessWorker

HERE = Path(__file__).resolve().parent
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def slow_square(x: int, seconds: float) -> int:
    time.sleep(seconds)
    return x * x


@pytest.fixture
def plane(tmp_path: Path) -> str:
    return str(tmp_path / "plane.db")


@contextmanager
def thread_worker(plane: str, queue: str) -> Iterator[None]:
    with dls.Dispatch(plane) as dp:
        worker = ProcessWorker(dp, [queue], lease_seconds=3)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            yield
        finally:
            worker.request_stop()
            worker.request_stop()
            thread.join(timeout=30)


def spawn(*args: str, **popen: Any) -> subprocess.Popen[bytes]:
    """``lakeshore ARGS`` as a process (its output goes to this test's output, unless
    ``popen`` says otherwise)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    cmd = [sys.executable, "-m", "dreamlake.lakeshore.cli", *args]
    return subprocess.Popen(cmd, env=env, **popen)


# --- queues ------------------------------------------------------------------------------


def test_queue_verbs(plane: str) -> None:
    assert (
        run(
            "queues",
            "add",
            "urgent",
            "--kind",
            "priority",
            "--priority-field",
            "p",
            "--plane",
            plane,
        )[0]
        == 0
    )
    code, out = run("queues", "add", "urgent", "--kind", "fifo", "--plane", plane)
    assert code == 1 and "queue_mismatch" in out
    assert "kind='priority' (asked: 'fifo')" in out  # (words for any caller, not a handle's)
    code, out = run("queues", "ls", "--plane", plane, "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert (row["spec"]["name"], row["spec"]["kind"]) == ("urgent", "priority")
    code, out = run("queues", "show", "urgent", "--plane", plane)
    assert code == 0 and "priority_field: p" in out
    assert run("queues", "prune", "--older-than", "7d", "--plane", plane) == (
        0,
        "pruned 0 queue(s)\n",
    )
    assert run("queues", "rm", "urgent", "--force", "--plane", plane)[0] == 0
    assert json.loads(run("queues", "ls", "--plane", plane, "--json")[1]) == []
    code, out = run("queues", "prune", "--older-than", "soon", "--plane", plane)
    assert code == 2 and "not a duration" in out


def test_pause_and_resume_hold_a_served_queue_and_ls_shows_it(served: LocalServer) -> None:
    # Given a call on a queue of a plane served over HTTP
    login = ["--url", served.url, "--token", str(served.admin_token)]
    with dls.Dispatch(served.url, token=served.admin_token) as dp:
        inv = dls.SyncQueue("held", dispatch=dp).submit(slow_square, 3, 0)
        # When the queue is paused from the command line
        assert run("queues", "pause", "held", *login) == (0, "paused queue held\n")
        # Then the listing says so, and a worker's claim gets none of its work
        (row,) = json.loads(run("queues", "ls", *login, "--json")[1])
        assert (row["paused"], row["counts"]["pending"]) == (True, 1)
        assert "paused: yes" in run("queues", "show", "held", *login)[1]
        assert dp.transport.claim(["held"], "w", wait=0) == []
        # and once resumed, it does
        assert run("queues", "resume", "held", *login) == (0, "resumed queue held\n")
        assert [c.id for c in dp.transport.claim(["held"], "w", wait=5)] == [inv]
    # and a queue that does not exist cannot be paused
    code, out = run("queues", "pause", "nowhere", *login)
    assert code == 1 and "queue_not_found" in out


def test_a_plane_files_pause_flag_is_the_one_its_servers_read(plane: str) -> None:
    # Given a queue on a plane file, paused from the command line
    with dls.Dispatch(plane) as dp:
        dls.SyncQueue("filed", dispatch=dp).submit(slow_square, 1, 0)
    assert run("queues", "pause", "filed", "--plane", plane)[0] == 0
    # Then its listing shows it paused (and a cancelled column), as a server on the file
    # reads it
    head, row = (
        line
        for line in run("queues", "ls", "--plane", plane)[1].splitlines()
        if "│" in line or "┃" in line
    )
    assert "cancelled" in head and "paused" in row
    server = LocalServer(Path(plane))
    server.start()
    try:
        with dls.Dispatch(server.url, token=server.admin_token) as dp:
            (row,) = [q for q in dp.queues() if q["spec"].name == "filed"]
            assert row["paused"] is True
    finally:
        server.stop()
    assert run("queues", "resume", "filed", "--plane", plane)[0] == 0
    (row,) = json.loads(run("queues", "ls", "--plane", plane, "--json")[1])
    assert row["paused"] is False


def test_daemon_rm_forgets_a_daemon_and_says_when_there_is_none(plane: str) -> None:
    # Given a daemon record left by a daemon gone for good
    with dls.Dispatch(plane) as dp:
        gone = dp.transport.register_daemon("gone", queues=["q"]).id
    # When it is removed, then it is gone from the list
    assert run("daemon", "rm", gone, "--plane", plane) == (0, f"removed daemon {gone}\n")
    assert json.loads(run("daemon", "ls", "--plane", plane, "--json")[1]) == []
    # and removing it again says there is none
    code, out = run("daemon", "rm", gone, "--plane", plane)
    assert code == 1 and "no daemon" in out


def test_daemon_ls_tells_a_daemon_that_stopped_from_one_that_fell_silent(plane: str) -> None:
    # Given a daemon that drained and said so as it exited, and one that just went quiet
    with dls.Dispatch(plane) as dp:
        done = dp.transport.register_daemon("done", queues=["q"]).id
        quiet = dp.transport.register_daemon("quiet", queues=["q"]).id
        dp.transport.drain_daemon(done)
        dp.transport.daemon_heartbeat(done, 0, stopped=True)
    # When the daemons are listed a while later
    later = time.time() + 600
    with dls.Dispatch(plane) as dp:
        rows = {d.id: d for d in dp.transport.list_daemons()}
    from dreamlake.lakeshore.cli.workers import _print_daemons

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_daemons([rows[done], rows[quiet]], as_json=False, now=later)
    # Then one is stopped, the other silent
    lines = out.getvalue().splitlines()
    assert "stopped (drained)" in next(line for line in lines if done in line)
    assert "silent" in next(line for line in lines if quiet in line)
    (listed,) = [
        d for d in json.loads(run("daemon", "ls", "--plane", plane, "--json")[1]) if d["id"] == done
    ]
    assert listed["stopped_at"] is not None


def test_tables_never_cut_what_other_commands_take(plane: str) -> None:
    # Given daemons and a queue with long names and many queues (a table wider than 80)
    long_queue = "fan-out-demo-with-a-name-longer-than-a-column-" + "x" * 20
    assert run("queues", "add", long_queue, "--plane", plane)[0] == 0
    with dls.Dispatch(plane) as dp:
        queues = [f"queue-number-{k}" for k in range(8)]
        ids = [
            dp.transport.register_daemon(
                f"[/gpu] box-{k}",  # (text, not rich markup)
                queues=queues,
                concurrency=4,
                python="3.11",
                pickle_protocols=[5],
                host="host-with-a-long-name.example.internal",
            ).id
            for k in range(2)
        ]
    # When they are listed as tables (not a terminal: the test's captured output)
    _, daemons = run("daemon", "ls", "--plane", plane)
    _, listed = run("queues", "ls", "--plane", plane)
    # Then every id and name is there whole, to copy into the next command
    for daemon_id in ids:
        assert daemon_id in daemons
    assert "[/gpu] box-0" in daemons
    assert long_queue in listed
    assert "…" not in daemons + listed


# --- exec and invocations --------------------------------------------------------------------


def test_exec_streams_output_and_exits_with_the_remote_code(plane: str) -> None:
    with thread_worker(plane, "sh"):
        code, out = run(
            "exec", "--plane", plane, "--queue", "sh", "echo hello; echo oops >&2; exit 3"
        )
    assert code == 3
    assert "hello\n" in out and "oops\n" in out


def test_exec_passes_env_and_cwd_and_detach_prints_the_id(plane: str, tmp_path: Path) -> None:
    with thread_worker(plane, "sh"):
        code, out = run(
            "exec",
            "--plane",
            plane,
            "-q",
            "sh",
            "-e",
            "GREETING=hi",
            "--cwd",
            str(tmp_path),
            'echo "$GREETING from $(pwd)"',
        )
        assert code == 0 and f"hi from {tmp_path}" in out
        code, out = run("exec", "--plane", plane, "-q", "sh", "--detach", "echo later")
        inv = out.strip()
        assert code == 0 and len(inv) == 26
        code, out = run("invocations", "wait", inv, "--plane", plane, "--timeout", "30")
        assert code == 0 and "1 succeeded, 0 did not" in out
        assert run("invocations", "logs", inv, "--plane", plane) == (0, "later\n")


def test_exec_with_no_worker_says_what_it_waits_for_and_ctrl_c_cancels(
    plane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (should it not end, SIGABRT has it print where each of its threads is)
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    # Given no worker on queue "lonely", an exec of a command on it, started as from a
    # terminal: SIGINT not ignored (a test run started in the background, with '&',
    # ignores it, and its processes would inherit that; Python then keeps it ignored)
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = spawn(
            "exec", "--plane", plane, "-q", "lonely", "echo never",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert proc.stderr is not None
    try:
        # When it has waited a while, then it says why, and how to start a worker
        line = next(li.decode() for li in proc.stderr if b"waiting for a worker" in li)
        assert "no worker process is registered for queue 'lonely'" in line
        assert "lakeshore worker start -q lonely" in line
        # and Ctrl-C (no terminal to ask on) cancels the call
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"exec did not end after SIGINT; its threads:\n{err.decode()}")
        assert proc.returncode == 130 and "cancelled" in err.decode()
    finally:
        proc.kill()
        proc.communicate()
    with dls.Dispatch(plane) as dp:
        (rec,) = dp.transport.list_invocations("lonely")
        assert rec.state == "cancelled"


@pytest.mark.parametrize("delay", [0, 3600], ids=["due", "scheduled"])
def test_following_a_call_tells_of_waiting_for_a_worker_only_once_it_is_due(
    plane: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], delay: int
) -> None:
    from dreamlake.lakeshore.cli import invocations

    # Given a call on a queue no worker serves, due now or in an hour, cancelled after a
    # few looks (so that following it ends)
    monkeypatch.setattr(invocations, "PENDING_HINT", 0.0)
    with dls.Dispatch(plane) as dp:
        inv = dls.SyncQueue("idle", dispatch=dp).exec("echo hi", delay=delay)
        timer = threading.Timer(1.0, dp.transport.cancel, (inv,))
        timer.start()
        # When it is followed until it ends
        invocations._follow(dp, inv, follow=True)
        timer.join()
    # Then only the call that is due is said to wait for a worker (once), not the
    # scheduled one: it waits for its time
    told = capsys.readouterr().err.count("waiting for a worker")
    assert told == (1 if delay == 0 else 0)


def test_the_pending_hint_counts_the_registered_workers_of_the_queue(plane: str) -> None:
    from dreamlake.lakeshore.cli.invocations import _pending_hint

    # Given a call on a queue two registered worker processes serve, one of them draining
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("busy", dispatch=dp)
        rec = dp.transport.get(q.exec("echo hi"))
        for name in ("a", "b"):
            dp.transport.register_daemon(name, queues=["busy"], concurrency=3)
        dp.transport.drain_daemon(dp.transport.list_daemons()[1].id)
        # When the hint is made, then it counts the one serving, with its slots
        hint = _pending_hint(dp, rec, 5.0)
    assert "waiting for a worker for 5s: 1 worker process(es) with 3 slot(s)" in hint
    assert "serve queue 'busy'; none has taken it yet" in hint


def test_invocation_verbs(plane: str) -> None:
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("jobs", dispatch=dp)
        pending = q.submit(slow_square, 2, 0)
        boom = q.exec("echo failing; exit 4")
    code, out = run("invocations", "ls", "--queue", "jobs", "--plane", plane, "--json")
    assert code == 0 and [r["state"] for r in json.loads(out)] == ["pending", "pending"]
    assert run("invocations", "cancel", pending, "--plane", plane) == (0, f"{pending}: cancelled\n")
    with thread_worker(plane, "jobs"):
        assert run("invocations", "wait", boom, "--plane", plane, "--timeout", "30")[0] == 1
    done = f"{boom}: already failed; nothing to cancel\n"
    assert run("invocations", "cancel", boom, "--plane", plane) == (0, done)
    code, out = run("invocations", "show", boom, "--plane", plane)
    assert code == 0 and "state: failed" in out and "CalledProcessError" in out
    assert run("invocations", "logs", boom, "--plane", plane) == (0, "failing\n")
    assert run("invocations", "retry", boom, "--plane", plane) == (0, f"{boom}: pending\n")
    code, out = run("invocations", "show", "nope", "--plane", plane)
    assert code == 1 and "unknown_invocation" in out


def test_invocations_ls_says_when_there_is_another_page(plane: str) -> None:
    # Given a queue of five invocations
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("many", dispatch=dp)
        ids = sorted(q.submit(slow_square, k, 0) for k in range(5))  # (listed by id)
    # When a page of two is listed, then the output says how to ask for the next
    code, out = run("invocations", "ls", "-q", "many", "--limit", "2", "--plane", plane)
    assert code == 0 and f"the next page: --after {ids[1]}" in out
    # and that page is the next two
    page = run(
        "invocations",
        "ls",
        "-q",
        "many",
        "--limit",
        "2",
        "--after",
        ids[1],
        "--plane",
        plane,
        "--json",
    )[1]
    assert [r["id"] for r in json.loads(page)] == ids[2:4]
    # and a last page that is not full says nothing more
    code, out = run("invocations", "ls", "-q", "many", "--limit", "9", "--plane", plane)
    assert code == 0 and "next page" not in out
    # the queue may be named as an argument too (as queues show takes it), not both
    named = run("invocations", "ls", "many", "--plane", plane, "--json")
    assert named[0] == 0 and [r["id"] for r in json.loads(named[1])] == ids
    code, out = run("invocations", "ls", "many", "-q", "many", "--plane", plane)
    assert code == 2 and "one of them" in out
    assert run("invocations", "ls", "--plane", plane)[0] == 2


# --- workers and daemons as processes ----------------------------------------------------------


def marked_square(x: int, seconds: float, mark: str) -> int:
    Path(mark).touch()
    return slow_square(x, seconds)


def test_sigterm_drains_a_worker_and_exits_0(plane: str, tmp_path: Path) -> None:
    started = tmp_path / "started"
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("drain", dispatch=dp)
        inv = q.submit(marked_square, 7, 1.5, str(started))
        worker = spawn("worker", "start", "-q", "drain", "--plane", plane, stderr=subprocess.PIPE)
        try:
            # the job itself has begun ("running" on the plane is already true of a
            # claim still in the worker's buffer, which a stop hands back untried)
            wait_for(started.exists, timeout=30)
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=30)
            assert worker.returncode == 0
        finally:
            worker.kill()
        # the job in flight was finished, not abandoned
        assert q.result(inv, timeout=1) == 49
        # and the worker said so as it began to stop
        assert b"stopping once 1 running job(s) finish" in err
        # and it is gone from the plane's daemons (a fresh identity each start)
        assert dp.transport.list_daemons() == []


SIGNALLED_AS_IT_REGISTERS = """
import os, signal, sys
from dreamlake.lakeshore.cli import main
from dreamlake.lakeshore.worker.daemon import Daemon

register = Daemon.register

def signalled(self):
    rec = register(self)
    os.kill(os.getpid(), signal.SIGTERM)
    return rec

Daemon.register = signalled
sys.argv = ["lakeshore", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("kind", ["worker", "daemon"])
def test_a_sigterm_just_after_registering_stops_a_worker_cleanly(plane: str, kind: str) -> None:
    # Given `lakeshore worker|daemon start` sent SIGTERM the moment the plane has its record
    # (a supervisor stopping it as it comes up)
    name = ["-q", "q"] if kind == "worker" else ["--name", "d"]
    args = [kind, "start", *name, "--plane", plane]
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED_AS_IT_REGISTERS, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Then it stops having run nothing and exits 0, instead of dying of the signal
    assert proc.returncode == 0, proc.stderr
    assert "stopped after 0 job(s)" in proc.stderr


def test_a_killed_worker_s_job_is_redelivered_and_recorded_once(plane: str) -> None:
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("crashy", dispatch=dp)
        inv = q.submit(slow_square, 8, 2)
        first = spawn("worker", "start", "-q", "crashy", "--plane", plane, "--lease", "2")
        try:
            wait_for(lambda: q.status(inv) == "running", timeout=30)
            first.kill()  # kill -9: no goodbye, the lease just runs out
            first.wait(timeout=10)
            second = spawn("worker", "start", "-q", "crashy", "--plane", plane, "--lease", "2")
            try:
                assert q.result(inv, timeout=60) == 64
            finally:
                second.send_signal(signal.SIGTERM)
                second.wait(timeout=30)
        finally:
            first.kill()
        rec = dp.transport.get(inv)
        assert (rec.state.value, rec.attempt) == ("succeeded", 2)


def test_daemon_update_adds_a_queue_to_a_running_daemon(plane: str, tmp_path: Path) -> None:
    env_home = {"LAKESHORE_HOME": str(tmp_path / "home")}
    os.environ.update(env_home)
    try:
        start = ["daemon", "start", "--name", "box", "--plane", plane, "--heartbeat", "0.2"]
        daemon = spawn(*start, stderr=subprocess.PIPE)
        try:
            with dls.Dispatch(plane) as dp:
                wait_for(lambda: len(dp.transport.list_daemons()) == 1, timeout=30)
                (rec,) = dp.transport.list_daemons()
                q = dls.SyncQueue("new-work", dispatch=dp)
                inv = q.submit(slow_square, 3, 0)
                code, out = run(
                    "daemon", "update", rec.id, "--add-queue", "new-work", "--plane", plane
                )
                assert code == 0 and "new-work" in out
                assert q.result(inv, timeout=30) == 9
                code, out = run("daemon", "ls", "--plane", plane, "--json")
                assert json.loads(out)[0]["queues"] == ["new-work"]
                assert run("daemon", "drain", rec.id, "--plane", plane)[0] == 0
                _, said = daemon.communicate(timeout=30)
                assert daemon.returncode == 0
                # it said what it followed: the new queue, then the drain
                assert f"daemon {rec.id}: now serving new-work with 1 slot(s)" in said.decode()
                assert f"daemon {rec.id}: draining: no more claims" in said.decode()
                # a named daemon keeps its record (its identity) after it exits
                assert [d.id for d in dp.transport.list_daemons()] == [rec.id]
                # and started again with other options, it says the plane's record wins
                again = spawn(*start, "-q", "other", "--concurrency", "2", stderr=subprocess.PIPE)
                try:
                    assert again.stderr is not None
                    first = again.stderr.readline().decode()
                    assert "serving new-work with 1 slot(s) (the plane's record" in first
                finally:
                    again.terminate()
                    again.communicate(timeout=30)
        finally:
            daemon.kill()
            daemon.communicate()
    finally:
        for key in env_home:
            os.environ.pop(key, None)


# --- tokens and login ---------------------------------------------------------------------------


def test_tokens_and_login_against_serve(tmp_path: Path) -> None:
    from dreamlake.lakeshore import authfile
    from dreamlake.lakeshore.server import serve_in_thread

    with serve_in_thread(tmp_path / "served.db") as (url, admin):
        assert admin is not None
        # An admin makes a scoped producer token; only its secret is printed
        code, out = run(
            "tokens",
            "create",
            "--role",
            "producer",
            "-q",
            "team-a-*",
            "--url",
            url,
            "--token",
            admin,
        )
        assert code == 0 and out.startswith("lks_")
        producer = out.strip()
        code, out = run("tokens", "ls", "--url", url, "--token", admin, "--json")
        listed = json.loads(out)
        assert {t["role"] for t in listed} == {"admin", "producer"}
        assert producer not in out
        # login checks the token and saves it to auth.yml, 0600
        code, out = run("login", "--url", url, "--token", producer, "--profile", "team-a")
        assert code == 0 and "as a producer token" in out
        saved = authfile.load()
        assert saved["profiles"]["team-a"]["token"] == producer
        assert oct(Path(os.environ["LAKESHORE_AUTH_FILE"]).stat().st_mode & 0o777) == "0o600"
        # a revoked token is refused from then on
        (made,) = [t for t in listed if t["role"] == "producer"]
        assert run("tokens", "revoke", made["id"], "--url", url, "--token", admin)[0] == 0
        code, out = run("login", "--url", url, "--token", producer)
        assert code == 1 and "revoked" in out
        code, out = run("tokens", "ls", "--url", url, "--token", producer)
        assert code == 1 and "unauthorized" in out
    # And the plane file itself can mint an admin token (the way back in)
    code, out = run("tokens", "create", "--role", "admin", "--plane", str(tmp_path / "served.db"))
    assert code == 0 and out.startswith("lks_")
