"""``lakeshore exec`` and ``lakeshore invocations show|logs|ls|cancel|retry|wait``."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Annotated, Any

import typer

from ..dispatch import Dispatch
from ..errors import LakeshoreError
from ..plane.model import FINISHED, Invocation, State
from ..queue import SyncQueue
from ..submit import outcome
from .common import JsonOpt, PlaneOpt, TokenOpt, UrlOpt, emit, fail, open_plane, when

__all__ = ["exec_command", "invocations_app"]

invocations_app = typer.Typer(help="Inspect and steer invocations.", no_args_is_help=True)

#: seconds between polls while following output
_FOLLOW = 0.25
#: seconds a followed call waits for a worker before the command says what it waits for
PENDING_HINT = 5.0
#: a daemon heartbeating within this many seconds counts as running (as ``daemon ls``)
_ALIVE = 60.0


def _pending_hint(dp: Dispatch, rec: Invocation, waited: float) -> str:
    """What a call no worker has taken yet waits for: a registered worker process on its
    queue (``lakeshore worker|daemon start`` register; in-process workers do not)."""
    head = f"lakeshore: {rec.id} waiting for a worker for {waited:.0f}s"
    try:
        now = dp.transport.now()
        serving = [
            d
            for d in dp.transport.list_daemons()
            if rec.queue in d.queues
            and not d.draining
            and d.stopped_at is None
            and now - d.last_heartbeat < _ALIVE
        ]
    except LakeshoreError:
        return f"{head} (Ctrl-C to stop waiting)"
    if not serving:
        return (
            f"{head}: no worker process is registered for queue {rec.queue!r}"
            f" (start one: lakeshore worker start -q {rec.queue})"
        )
    slots = sum(d.concurrency for d in serving)
    return (
        f"{head}: {len(serving)} worker process(es) with {slots} slot(s) serve queue"
        f" {rec.queue!r}; none has taken it yet (all busy, or the queue paused)"
    )


def _follow(dp: Dispatch, inv_id: str, *, follow: bool, after: int = 0) -> tuple[int, Invocation]:
    """Print output (stdout to stdout, stderr to stderr) until finished, if following."""
    transport = dp.transport
    # since when (monotonic) the call has been seen waiting for a worker, due and not
    # taken (a scheduled call, or one waiting out a retry's backoff, is not); told once
    # each time
    waiting: float | None = None
    hinted = False
    while True:
        rec = transport.get(inv_id)
        if rec.public_state(transport.now()) is not State.PENDING:
            waiting, hinted = None, False
        elif waiting is None:
            waiting = time.monotonic()
        elif follow and not hinted and time.monotonic() - waiting >= PENDING_HINT:
            typer.echo(_pending_hint(dp, rec, time.monotonic() - waiting), err=True)
            hinted = True
        for entry in transport.read_logs(inv_id, after):
            (sys.stdout if entry.stream == "stdout" else sys.stderr).write(entry.text)
            after = entry.seq
        sys.stdout.flush()
        if not follow or rec.state in FINISHED:
            # one last read: output flushed just before the result
            for entry in transport.read_logs(inv_id, after):
                (sys.stdout if entry.stream == "stdout" else sys.stderr).write(entry.text)
                after = entry.seq
            return after, transport.get(inv_id)
        time.sleep(_FOLLOW)


def exec_command(
    command: Annotated[str, typer.Argument(help="The shell command, quoted as one argument.")],
    queue: Annotated[str, typer.Option("--queue", "-q", help="The queue to run it on.")],
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V (repeat).")] = None,
    cwd: Annotated[str | None, typer.Option(help="Working directory on the worker.")] = None,
    timeout: Annotated[
        float | None, typer.Option(min=0.001, help="Seconds before it is killed.")
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Print the id and return.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Run a shell command on a worker; stream its output and exit with its exit code.

    Like ``ssh host cmd``. Ctrl-C offers to cancel the remote job.
    """
    variables: dict[str, str] = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--env takes K=V, not {item!r}", 2)
        variables[key] = value
    with open_plane(url, token, plane) as dp:
        q = SyncQueue(queue, dispatch=dp)
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        inv_id = q.exec(command, env=variables, cwd=cwd, **options)
        if detach:
            typer.echo(inv_id)
            return
        try:
            _, rec = _follow(dp, inv_id, follow=True)
        except KeyboardInterrupt:
            if not sys.stdin.isatty() or typer.confirm("\ncancel the remote job?", default=True):
                dp.transport.cancel(inv_id)
                typer.echo(f"lakeshore: cancelled {inv_id}", err=True)
            else:
                typer.echo(f"lakeshore: left running: {inv_id}", err=True)
            raise typer.Exit(130) from None
        try:
            outcome(rec, dp.transport)
        except subprocess.CalledProcessError as exc:
            raise typer.Exit(exc.returncode) from None
        except LakeshoreError as exc:
            raise fail(f"{inv_id}: {exc}", 255) from None


@invocations_app.command("show")
def show(
    inv_id: Annotated[str, typer.Argument()],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """State, attempts, worker, timings, progress, and the error with its traceback."""
    with open_plane(url, token, plane) as dp:
        rec = dp.transport.get(inv_id)
        now = dp.transport.now()
        if as_json:
            emit([_view(rec, now)], [], as_json=True)
            return
        view = _view(rec, now)
        for key in ("id", "queue", "state", "attempt", "worker", "priority"):
            typer.echo(f"{key:>10}: {view[key]}")
        for key in ("created_at", "started_at", "finished_at"):
            typer.echo(f"{key.replace('_at', ''):>10}: {when(view[key])}")
        if rec.progress is not None:
            typer.echo(f"{'progress':>10}: {rec.progress:.0%} {rec.progress_message or ''}")
        if rec.error:
            typer.echo(f"{'error':>10}: {rec.error.get('type')}: {rec.error.get('message')}")
            if rec.error.get("traceback"):
                typer.echo(str(rec.error["traceback"]).rstrip())


def _view(rec: Invocation, now: float) -> dict[str, Any]:
    return {
        "id": rec.id,
        "queue": rec.queue,
        "state": rec.public_state(now).value,
        "attempt": f"{rec.attempt}/{rec.max_attempts}",
        "worker": rec.worker or "-",
        "priority": rec.priority,
        "created_at": rec.created_at,
        "started_at": rec.started_at,
        "finished_at": rec.finished_at,
        "progress": rec.progress,
        "progress_message": rec.progress_message,
        "error": rec.error,
    }


@invocations_app.command("logs")
def logs(
    inv_id: Annotated[str, typer.Argument()],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until it ends.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """The invocation's output, every attempt in order."""
    with open_plane(url, token, plane) as dp:
        _follow(dp, inv_id, follow=follow)


@invocations_app.command("ls")
def ls(
    name: Annotated[str | None, typer.Argument(help="The queue (or --queue).")] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q")] = None,
    state: Annotated[str | None, typer.Option(help="Only this state.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    after: Annotated[
        str | None, typer.Option(help="Start after this id (the last one of a page).")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A queue's invocations by id (submission time, to the millisecond: calls submitted
    in the same millisecond in no set order), a page of --limit at a time."""
    given = [q for q in (name, queue) if q is not None]
    if len(given) != 1 or not given[0]:
        raise fail("name the queue, as an argument or with --queue (one of them)", 2)
    with open_plane(url, token, plane) as dp:
        now = dp.transport.now()
        found = dp.transport.list_invocations(given[0], state, after, limit)
        rows = [_view(r, now) for r in found]
        if len(found) == limit and not as_json:  # (said on stderr: stdout stays the table)
            typer.echo(f"({limit} shown; the next page: --after {found[-1].id})", err=True)
        emit(
            rows,
            [
                ("id", lambda v: v["id"]),
                ("state", lambda v: v["state"]),
                ("attempt", lambda v: v["attempt"]),
                ("worker", lambda v: v["worker"]),
                ("created", lambda v: when(v["created_at"])),
                ("finished", lambda v: when(v["finished_at"])),
            ],
            as_json=as_json,
        )


@invocations_app.command("cancel")
def cancel(
    inv_id: Annotated[str, typer.Argument()],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Cancel a pending or running invocation (a running job is killed); one that has
    finished is left as it is (exit 0, and the output says so)."""
    with open_plane(url, token, plane) as dp:
        state = dp.transport.cancel(inv_id)
    if state is State.CANCELLED:
        typer.echo(f"{inv_id}: cancelled")
    else:
        typer.echo(f"{inv_id}: already {state.value}; nothing to cancel")


@invocations_app.command("retry")
def retry(
    inv_id: Annotated[str, typer.Argument()],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Run a failed or dead invocation again, as a new attempt."""
    with open_plane(url, token, plane) as dp:
        rec = dp.transport.retry(inv_id)
        typer.echo(f"{inv_id}: {rec.public_state(dp.transport.now()).value}")


@invocations_app.command("wait")
def wait(
    ids: Annotated[list[str], typer.Argument(help="Invocation ids.")],
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Wait for invocations to finish, with a progress bar; exit 1 if any did not succeed."""
    from rich.progress import Progress

    with open_plane(url, token, plane) as dp:
        pending = set(ids)
        bad = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        with Progress(transient=True) as bar:
            task = bar.add_task("waiting", total=len(pending))
            while pending:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if left == 0.0:
                    raise fail(f"{len(pending)} invocation(s) still running", 124)
                for rec in dp.transport.get_many(sorted(pending)):
                    if rec.state in FINISHED:
                        pending.discard(rec.id)
                        bad += rec.state.value != "succeeded"
                        bar.advance(task)
                if pending:
                    time.sleep(_FOLLOW)
        typer.echo(f"{len(ids) - bad} succeeded, {bad} did not")
        if bad:
            raise typer.Exit(1)
