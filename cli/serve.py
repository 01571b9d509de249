"""``lakeshore serve``: the plane over HTTP on one machine (a SQLite file, tokens on)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from .. import config
from ..heap import keep_freed_memory
from .common import run_server

__all__ = ["serve"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8787,
    plane: Annotated[
        Path | None,
        typer.Option(
            help="The plane file (SQLite). Default: the local plane file "
            "($LAKESHORE_HOME/plane.db, else ~/.local/share/lakeshore/plane.db)."
        ),
    ] = None,
    new_admin_token: Annotated[
        bool,
        typer.Option("--new-admin-token", help="Make a new admin token and print it (once)."),
    ] = False,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request.")] = False,
    max_blob_mib: Annotated[
        int | None,
        typer.Option(
            "--max-blob-mib",
            min=1,
            help="Largest blob (a big argument or result) the plane takes, in MiB. "
            "Default: 5120 (5 GiB).",
        ),
    ] = None,
) -> None:
    """Serve a plane over HTTP: producers and workers reach it with LAKESHORE_URL and a token."""
    try:
        from ..server import LocalServer
    except ImportError as exc:  # uvicorn and powertools are the serve extra
        typer.echo(
            f"lakeshore serve needs the serve extra ({exc.name} is missing): "
            "pip install 'dreamlake-lakeshore[serve]'",
            err=True,
        )
        raise typer.Exit(2) from None

    logging.basicConfig(level=logging.WARNING, format="lakeshore serve: %(levelname)s %(message)s")
    keep_freed_memory()
    if access_log:
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    path = (plane or config.settings().default_plane_path).expanduser()
    server = LocalServer(
        path,
        host=host,
        port=port,
        new_admin_token=new_admin_token,
        access_log=access_log,
        max_blob=None if max_blob_mib is None else max_blob_mib * 1024 * 1024,
    )

    def announce() -> None:
        _announce(server.url, path, server.admin_token, bootstrapped=server.bootstrapped)
        if host not in _LOOPBACK:
            typer.echo(
                f"warning: serving plain HTTP on {host}: tokens travel in clear; "
                "put TLS in front for other machines",
                err=True,
            )

    run_server(
        server,
        "lakeshore serve",
        cannot_listen=lambda exc: f"cannot listen on {host}:{port}: {exc.strerror}",
        announce=announce,
    )


def _announce(url: str, path: Path, token: str | None, *, bootstrapped: bool) -> None:
    echo = typer.echo
    echo(f"Lakeshore plane {path}")
    echo(f"serving at {url}  (Ctrl-C to stop)")
    if token is not None:
        why = "this plane's first admin token" if bootstrapped else "a new admin token"
        echo(f"admin token: {token}")
        echo(f"  {why}, shown only now: the plane keeps only its hash. Keep it safe.")
        echo(f"  export LAKESHORE_URL={url} LAKESHORE_TOKEN={token}")
    else:
        echo(
            "admin token: not shown (the plane has tokens). For a new one, restart with "
            "`lakeshore serve --new-admin-token`, or POST /v1/tokens with an admin token."
        )
    sys.stdout.flush()
