"""What every command shares: where the plane is, and how answers are printed."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, Protocol

import typer

from ..dispatch import Dispatch
from ..errors import LakeshoreError

__all__ = [
    "JsonOpt",
    "PlaneOpt",
    "TokenOpt",
    "UrlOpt",
    "duration",
    "emit",
    "fail",
    "open_plane",
    "run_server",
    "when",
]

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="LAKESHORE_URL", help="A remote plane's URL (else auth.yml)."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="LAKESHORE_TOKEN", help="The bearer token for --url."),
]
PlaneOpt = Annotated[
    Path | None,
    typer.Option("--plane", help="An embedded plane file on this machine instead of a URL."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"lakeshore: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def open_plane(url: str | None, token: str | None, plane: Path | None) -> Iterator[Dispatch]:
    """The Dispatch a command talks to; LakeshoreErrors become one-line messages."""
    if url and plane:
        raise fail("give --url or --plane, not both", 2)
    try:
        if plane is not None:
            dp = Dispatch(str(plane))
        elif url:
            dp = Dispatch(url, token=token)
        else:
            dp = Dispatch()
    except (LakeshoreError, ValueError) as exc:
        raise fail(str(exc)) from None
    try:
        yield dp
    except LakeshoreError as exc:
        raise fail(f"{exc} ({exc.code})") from None
    finally:
        dp.close()


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not isinstance(v, bytes)}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def when(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def emit(
    rows: Sequence[Any],
    columns: Sequence[tuple[str, Callable[[Any], Any]]],
    *,
    as_json: bool,
    title: str | None = None,
) -> None:
    """Print ``rows`` as a rich table for people, or as JSON for scripts.

    Cells are text, never rich markup. Output that is not a terminal is as wide as the
    table needs, so nothing in it is cut; on a terminal the first column (the id or
    name other commands take) wraps whole instead of being cut short."""
    if as_json:
        json.dump(_plain(list(rows)), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    cells = [[str(get(row)) for _, get in columns] for row in rows]
    table = Table(title=title)
    for k, (name, _) in enumerate(columns):
        table.add_column(name, overflow="fold" if k == 0 else "ellipsis")
    for r in cells:
        table.add_row(*(Text(c) for c in r))
    width = None  # (a terminal's own)
    if not sys.stdout.isatty():
        widest = [
            max([cell_len(name), *(cell_len(line) for r in cells for line in r[k].splitlines())])
            for k, (name, _) in enumerate(columns)
        ]
        width = max(80, sum(widest) + 3 * len(widest) + 1)  # (with borders and padding)
    Console(width=width).print(table)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w`` → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if m is None:
        raise typer.BadParameter(f"{text!r} is not a duration like 90s, 15m, 12h or 7d")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


class _Server(Protocol):
    @property
    def stopping(self) -> bool: ...

    def start(self) -> None: ...

    def wait(self) -> None: ...

    def stop(self) -> bool: ...

    def request_stop(self, *, force: bool = False) -> None: ...


def run_server(
    server: _Server,
    name: str,
    *,
    cannot_listen: Callable[[OSError], str],
    announce: Callable[[], None],
) -> None:
    """Start ``server``, announce it, serve until Ctrl-C or SIGTERM, stop cleanly.

    Signal handlers only set flags; a second signal skips the grace period.
    """

    def on_signal(sig: int, frame: FrameType | None) -> None:
        server.request_stop(force=server.stopping)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start()
        except OSError as exc:
            typer.echo(f"{name}: {cannot_listen(exc)}", err=True)
            raise typer.Exit(1) from None
        announce()
        server.wait()
    finally:
        idle = server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    typer.echo(f"{name}: stopped")
    if not idle:
        # A request thread still sits in a plane wait (its client has had its 503). The
        # pool's exit hook would join it for up to limits.max_wait seconds: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
