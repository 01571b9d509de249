"""The typer application behind ``lakeshore``."""

from __future__ import annotations

import typer

from .. import __version__
from .deploy import bootstrap, deploy
from .dev import dev
from .invocations import exec_command, invocations_app
from .queues import queues_app
from .serve import serve
from .tokens import login, tokens_app
from .workers import daemon_app, worker_app

app = typer.Typer(
    name="lakeshore",
    help="Lakeshore: a broker-mediated task queue for Python functions and shell commands.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lakeshore {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Submit work, run workers and operate a Lakeshore plane."""


app.command()(serve)
app.command()(dev)
app.command("exec")(exec_command)
app.add_typer(worker_app, name="worker")
app.add_typer(daemon_app, name="daemon")
app.add_typer(queues_app, name="queues")
app.add_typer(invocations_app, name="invocations")
app.add_typer(tokens_app, name="tokens")
app.command()(login)
app.command()(deploy)
app.command()(bootstrap)
