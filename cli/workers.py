"""``lakeshore worker start`` and ``lakeshore daemon start|update|ls|drain``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Annotated

import typer

from ..heap import keep_freed_memory
from ..plane.daemons import MAX_CONCURRENCY
from ..plane.model import DaemonRecord
from .common import JsonOpt, PlaneOpt, TokenOpt, UrlOpt, emit, fail, open_plane, when

__all__ = ["daemon_app", "worker_app"]

worker_app = typer.Typer(help="Run workers.", no_args_is_help=True)
daemon_app = typer.Typer(
    help="Fleet daemons: workers whose queues live on the plane.", no_args_is_help=True
)

QueuesOpt = Annotated[list[str], typer.Option("--queue", "-q", help="A queue to serve (repeat).")]
ImportOpt = Annotated[
    list[str] | None,
    typer.Option("--import", help="A module each job process imports first (repeat)."),
]
ConcurrencyOpt = Annotated[
    int,
    typer.Option(min=1, max=MAX_CONCURRENCY, help="Jobs run at once (one process each)."),
]
LeaseOpt = Annotated[float, typer.Option(min=1.0, help="Lease seconds (heartbeats every third).")]


@worker_app.command("start")
def worker_start(
    queue: QueuesOpt,
    concurrency: ConcurrencyOpt = 1,
    imports: ImportOpt = None,
    lease: LeaseOpt = 60.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Claim and run invocations of the queues until stopped.

    The first Ctrl-C or SIGTERM stops claiming and lets running jobs finish; the
    second stops at once and hands their leases back.
    """
    import os
    import socket

    from ..worker.daemon import Daemon

    keep_freed_memory()
    with open_plane(url, token, plane) as dp:
        worker = Daemon(
            dp,
            f"worker-{socket.gethostname()}-{os.getpid()}",
            queues=queue,
            concurrency=concurrency,
            imports=imports or [],
            lease_seconds=lease,
            persist=False,
        )

        def announce(rec: DaemonRecord) -> None:
            typer.echo(
                f"lakeshore worker {rec.id}: serving {', '.join(queue)} "
                f"on {dp.target} with {concurrency} slot(s)",
                err=True,
            )

        done = worker.run(announce)  # (registers with a signal's stop in place)
        typer.echo(f"lakeshore worker: stopped after {done} job(s)", err=True)


@daemon_app.command("start")
def daemon_start(
    name: Annotated[str, typer.Option(help="The daemon's name; its identity survives restarts.")],
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="Queues for a first start.")
    ] = None,
    concurrency: ConcurrencyOpt = 1,
    imports: ImportOpt = None,
    lease: LeaseOpt = 60.0,
    heartbeat: Annotated[float, typer.Option(min=0.1, help="Seconds between heartbeats.")] = 15.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Run a fleet daemon: its queues and concurrency follow the plane's record."""
    from ..worker.daemon import Daemon

    keep_freed_memory()
    with open_plane(url, token, plane) as dp:
        daemon = Daemon(
            dp,
            name,
            queues=queue or [],
            concurrency=concurrency,
            imports=imports or [],
            lease_seconds=lease,
            heartbeat_every=heartbeat,
        )

        def announce(rec: DaemonRecord) -> None:
            serving = ", ".join(rec.queues) or "no queue yet"
            line = f"lakeshore daemon {rec.id} ({name}): serving {serving}"
            line += f" with {rec.concurrency} slot(s)"
            given = (list(queue or rec.queues), concurrency)
            if given != (rec.queues, rec.concurrency):  # (a restart: the plane's say)
                line += (
                    " (the plane's record: -q and --concurrency count at a first start;"
                    " daemon update moves it)"
                )
            typer.echo(line, err=True)

        def changed(rec: DaemonRecord) -> None:
            if rec.draining:
                line = "draining: no more claims, exiting once running jobs finish"
            else:
                serving = ", ".join(rec.queues) or "no queue"
                line = f"now serving {serving} with {rec.concurrency} slot(s)"
            typer.echo(f"lakeshore daemon {rec.id}: {line}", err=True)

        done = daemon.run(announce, changed)  # (registers with a signal's stop in place)
        assert daemon.record is not None
        typer.echo(f"lakeshore daemon {daemon.record.id}: stopped after {done} job(s)", err=True)


@daemon_app.command("update")
def daemon_update(
    daemon_id: Annotated[str, typer.Argument(help="The daemon's id (see daemon ls).")],
    add_queue: Annotated[list[str] | None, typer.Option("--add-queue")] = None,
    remove_queue: Annotated[list[str] | None, typer.Option("--remove-queue")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, max=MAX_CONCURRENCY)] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a running daemon's queues or concurrency (it follows within a heartbeat)."""
    with open_plane(url, token, plane) as dp:
        rec = dp.transport.update_daemon(
            daemon_id,
            add_queues=add_queue or [],
            remove_queues=remove_queue or [],
            concurrency=concurrency,
        )
        _print_daemons([rec], as_json)


@daemon_app.command("ls")
def daemon_ls(
    url: UrlOpt = None, token: TokenOpt = None, plane: PlaneOpt = None, as_json: JsonOpt = False
) -> None:
    """Daemons with their health, queues, concurrency and running jobs."""
    with open_plane(url, token, plane) as dp:
        _print_daemons(dp.transport.list_daemons(), as_json, now=dp.transport.now())


@daemon_app.command("drain")
def daemon_drain(
    daemon_id: Annotated[str, typer.Argument()],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask a daemon to finish its running jobs, claim no more, and exit."""
    with open_plane(url, token, plane) as dp:
        _print_daemons([dp.transport.drain_daemon(daemon_id)], as_json)


@daemon_app.command("rm")
def daemon_rm(
    daemon_id: Annotated[str, typer.Argument()],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Forget a daemon that is gone for good (one shown as silent). A daemon still
    running registers again at its next heartbeat: drain it first."""
    with open_plane(url, token, plane) as dp:
        if not dp.transport.remove_daemon(daemon_id):
            raise fail(f"no daemon {daemon_id!r}")
    typer.echo(f"removed daemon {daemon_id}")


def _print_daemons(rows: Sequence[DaemonRecord], as_json: bool, now: float | None = None) -> None:
    at = now or time.time()

    def health(d: DaemonRecord) -> str:
        age = at - d.last_heartbeat
        if d.stopped_at is not None:
            return "stopped (drained)" if d.draining else "stopped"
        if d.draining:
            return "draining"
        return "ok" if age < 60 else f"silent {age:.0f}s"

    emit(
        rows,
        [
            ("id", lambda d: d.id),
            ("name", lambda d: d.name),
            ("host", lambda d: d.host),
            ("health", health),
            ("queues", lambda d: ", ".join(d.queues) or "-"),
            ("concurrency", lambda d: d.concurrency),
            ("running", lambda d: d.running),
            ("last heartbeat", lambda d: when(d.last_heartbeat)),
        ],
        as_json=as_json,
    )
