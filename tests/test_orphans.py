"""A worker killed outright (``kill -9``) takes its jobs with it: its job processes and
the shell commands they run die too, instead of running on (adopted by init) while the
plane hands the same jobs to another worker once their leases run out. Real processes:
a ``lakeshore worker start`` and its job processes (Linux only: the parent-death signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

import dreamlake.lakeshore as dls

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

HERE = Path(__file__).resolve().parent


def spawn(*args: str, **popen: Any) -> subprocess.Popen[bytes]:
    """``lakeshore ARGS`` as a process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    cmd = [sys.executable, "-m", "dreamlake.lakeshore.cli", *args]
    return subprocess.Popen(cmd, env=env, **popen)


def sleep_marked(mark: str, seconds: float) -> None:
    """A long job that says which process runs it (written whole: a reader never sees
    half of it)."""
    Path(mark + ".tmp").write_text(f"{os.getpid()}\n")
    os.replace(mark + ".tmp", mark)
    time.sleep(seconds)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def pids(mark: Path) -> list[int]:
    return [int(p) for p in mark.read_text().split()]


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids the test saw; whatever of them still runs at the end is killed (a failing
    test leaves no sleeper behind on the machine)."""
    seen: list[int] = []
    yield seen
    for pid in seen:
        try:
            if os.getpgid(pid) == pid:  # a command's group (never this test's own)
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_a_worker_killed_outright_takes_its_jobs_and_their_commands_with_it(
    tmp_path: Path, leftovers: list[int]
) -> None:
    plane = str(tmp_path / "plane.db")
    py_mark, sh_mark = tmp_path / "python.pid", tmp_path / "shell.pid"
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("q", dispatch=dp)
        # Given a worker running a long Python job and a long shell command (a shell
        # whose sleep runs in the background: a process of its group, not the shell)
        q.submit(sleep_marked, str(py_mark), 600)
        script = f'sleep 600 & echo "$$ $!" > {sh_mark}.tmp && mv {sh_mark}.tmp {sh_mark}; wait'
        q.exec(script)
        worker = spawn("worker", "start", "--plane", plane, "-q", "q", "--concurrency", "2")
        try:
            wait_for(lambda: py_mark.exists() and sh_mark.exists(), timeout=60)
            running = [*pids(py_mark), *pids(sh_mark)]
            leftovers.extend(running)
            assert all(alive(pid) for pid in running)
            # When the worker is killed outright
            worker.kill()
            worker.wait(timeout=10)
        finally:
            worker.kill()
            worker.wait(timeout=10)
        # Then its job process, the shell and the shell's sleep are all gone soon
        wait_for(
            lambda: not any(alive(pid) for pid in running),
            timeout=10,
            message=f"still running: {[pid for pid in running if alive(pid)]}",
        )


def test_a_job_process_killed_mid_command_takes_the_command_s_group_with_it(
    tmp_path: Path, leftovers: list[int]
) -> None:
    # Given a worker on a thread here running a shell command whose job process then dies
    # (a crash), so the worker sees the slot die
    plane = str(tmp_path / "plane.db")
    sh_mark = tmp_path / "shell.pid"
    with dls.Dispatch(plane) as dp:
        q = dls.SyncQueue("q", dispatch=dp)
        script = f'sleep 600 & echo "$$ $!" > {sh_mark}.tmp && mv {sh_mark}.tmp {sh_mark}; wait'
        inv = q.exec(script, max_attempts=1)  # (no retry: it would run the sleep again)
        worker = spawn("worker", "start", "--plane", plane, "-q", "q")
        try:
            wait_for(sh_mark.exists, timeout=60)
            shell, sleep = pids(sh_mark)
            leftovers.extend([shell, sleep])
            job_process = int(Path(f"/proc/{shell}/stat").read_text().rpartition(")")[2].split()[1])
            leftovers.append(job_process)
            # When the job process is killed (not the worker)
            os.kill(job_process, signal.SIGKILL)
            # Then the shell and its sleep go with it
            wait_for(
                lambda: not alive(shell) and not alive(sleep),
                timeout=10,
                message="the command outlived its job process",
            )
            # and the worker, alive, reports the crash
            wait_for(lambda: q.finished(inv), timeout=30)
            assert dp.transport.get(inv).state.value == "failed"
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)


ADOPTED = """
import os, sys
from dreamlake.lakeshore.worker.lifeline import die_with_parent
die_with_parent(int(sys.argv[1]))
print("ran on", flush=True)
"""


def test_a_job_process_whose_worker_went_before_it_asked_ends_itself() -> None:
    # Given a pid that ran and has ended (a worker killed while its job process started)
    gone = subprocess.Popen(["true"])
    gone.wait()
    # When a process asks to die with it, as if it were its parent
    proc = subprocess.run(
        [sys.executable, "-c", ADOPTED, str(gone.pid)], capture_output=True, timeout=60
    )
    # Then it ends itself at once (its parent is not the one it was started by)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == b""
    # while one whose named parent runs on, not as its parent (a launcher between the
    # two: the signal then follows the launcher), goes on
    proc = subprocess.run(
        [sys.executable, "-c", ADOPTED, str(os.getppid())], capture_output=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (0, b"ran on\n")
