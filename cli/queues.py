"""``lakeshore queues add|ls|show|pause|resume|rm|prune``."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..dashboard.flags import PauseFlags
from ..dispatch import Dispatch
from ..plane import Plane
from ..plane.model import QueueSpec
from .common import JsonOpt, PlaneOpt, TokenOpt, UrlOpt, duration, emit, fail, open_plane, when

__all__ = ["queues_app"]

queues_app = typer.Typer(help="Create, inspect and remove queues.", no_args_is_help=True)

KINDS = ("fifo", "filo", "priority", "boltzmann")


@queues_app.command("add")
def add(
    name: Annotated[str, typer.Argument()],
    kind: Annotated[str, typer.Option(help=f"One of {', '.join(KINDS)}.")] = "fifo",
    priority_field: Annotated[
        str | None, typer.Option(help="priority/boltzmann: the keyword holding the priority.")
    ] = None,
    temperature: Annotated[float | None, typer.Option(help="boltzmann: T > 0.")] = None,
    anneal: Annotated[
        str | None,
        typer.Option(help='boltzmann: JSON, e.g. \'{"rate": 0.01, "min_temperature": 0.05}\'.'),
    ] = None,
    max_running: Annotated[
        int | None, typer.Option(min=1, help="Cap on running invocations across all workers.")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a queue (or check that it exists with these settings)."""
    if kind not in KINDS:
        raise fail(f"unknown kind {kind!r}; one of {', '.join(KINDS)}", 2)
    settings: dict[str, Any] = {"kind": kind}
    if priority_field is not None:
        settings["priority_field"] = priority_field
    if temperature is not None:
        settings["temperature"] = temperature
    if anneal is not None:
        try:
            settings["anneal"] = json.loads(anneal)
        except ValueError:
            raise fail("--anneal must be JSON", 2) from None
    if max_running is not None:
        settings["elasticity"] = {"kind": "fixed", "max": max_running}
    with open_plane(url, token, plane) as dp:
        spec = dp.transport.ensure_queue(QueueSpec(name, **settings), check=list(settings))
        _print([{"spec": spec, "last_activity": None, "counts": {}}], as_json)


@queues_app.command("ls")
def ls(
    url: UrlOpt = None, token: TokenOpt = None, plane: PlaneOpt = None, as_json: JsonOpt = False
) -> None:
    """Queues with their kind, counts by state and last activity."""
    with open_plane(url, token, plane) as dp:
        _print(_with_pauses(dp, dp.queues()), as_json)


@queues_app.command("show")
def show(
    name: Annotated[str, typer.Argument()],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One queue: its settings and counts by state."""
    with open_plane(url, token, plane) as dp:
        found = [q for q in dp.queues() if q["spec"].name == name]
        if not found:
            raise fail(f"no queue {name!r}")
        (q,) = _with_pauses(dp, found)
        if as_json:
            emit([{**q, "spec": q["spec"]}], [], as_json=True)
            return
        for key, value in {"name": name, **q["spec"].settings()}.items():
            if value is not None:
                typer.echo(f"{key:>16}: {value}")
        typer.echo(f"{'paused':>16}: {'yes' if q['paused'] else 'no'}")
        typer.echo(f"{'last activity':>16}: {when(q['last_activity'])}")
        for state, n in q["counts"].items():
            typer.echo(f"{state:>16}: {n}")


def _pause(name: str, paused: bool, url: str | None, token: str | None, plane: Any) -> None:
    with open_plane(url, token, plane) as dp:
        if isinstance(dp.transport, Plane):  # (a plane file: the flag its servers read)
            dp.transport.get_queue(name)  # (no such queue: QueueNotFound)
            PauseFlags(dp.transport).set_paused(name, paused)
        else:
            dp.transport.update_queue(name, paused=paused)
    typer.echo(f"{'paused' if paused else 'resumed'} queue {name}")


@queues_app.command("pause")
def pause(
    name: Annotated[str, typer.Argument()],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Hold back a queue's work from workers (it still takes submits) until resumed."""
    _pause(name, True, url, token, plane)


@queues_app.command("resume")
def resume(
    name: Annotated[str, typer.Argument()],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Hand a paused queue's work to workers again."""
    _pause(name, False, url, token, plane)


@queues_app.command("rm")
def rm(
    name: Annotated[str, typer.Argument()],
    force: Annotated[
        bool, typer.Option("--force", help="Even with work pending or running.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Remove a queue and its invocations."""
    with open_plane(url, token, plane) as dp:
        gone = dp.delete_queue(name, force=force)
        typer.echo(f"removed queue {name} ({gone} invocation(s))")


@queues_app.command("prune")
def prune(
    older_than: Annotated[str, typer.Option(help="Idle for this long: 90s, 15m, 12h, 7d.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Remove queues idle that long with nothing pending or running."""
    seconds = duration(older_than)
    with open_plane(url, token, plane) as dp:
        removed = dp.prune_queues(seconds)
        typer.echo(f"pruned {len(removed)} queue(s){': ' + ', '.join(removed) if removed else ''}")


def _with_pauses(dp: Dispatch, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with ``paused`` (as a plane served over HTTP answers it; read from the
    flags on a plane file)."""
    if isinstance(dp.transport, Plane):
        held = PauseFlags(dp.transport).paused(q["spec"].name for q in rows)
        return [{**q, "paused": q["spec"].name in held} for q in rows]
    return [{**q, "paused": bool(q.get("paused"))} for q in rows]


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    def count(state: str) -> Any:
        return lambda q: q["counts"].get(state, 0)

    emit(
        rows,
        [
            ("queue", lambda q: q["spec"].name),
            ("kind", lambda q: q["spec"].kind),
            ("paused", lambda q: "paused" if q.get("paused") else ""),
            ("pending", count("pending")),
            ("scheduled", count("scheduled")),
            ("running", count("running")),
            ("succeeded", count("succeeded")),
            ("failed", count("failed")),
            ("dead", count("dead")),
            ("cancelled", count("cancelled")),
            ("last activity", lambda q: when(q["last_activity"])),
        ],
        as_json=as_json,
    )
