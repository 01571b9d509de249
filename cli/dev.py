"""``lakeshore dev``: the AWS path on one machine (moto for DynamoDB and S3, the real
Lambda handlers behind the local HTTP front of ``lakeshore serve``)."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from ..heap import keep_freed_memory
from .common import run_server

__all__ = ["dev"]


def dev(
    port: Annotated[int, typer.Option(help="Port of the HTTP API (0: any free port).")] = 8787,
    sweep_every: Annotated[
        float,
        typer.Option(
            help="Seconds between sweeps (expired leases, retention), as the stack's "
            "scheduled sweeper runs.",
            min=0.001,
        ),
    ] = 60.0,
    moto_port: Annotated[int, typer.Option(help="Port of the moto server (0: any free port).")] = 0,
    region: Annotated[str, typer.Option(help="Region of the in-memory AWS account.")] = (
        "us-east-1"
    ),
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request.")] = False,
) -> None:
    """Run the AWS plane on this machine: DynamoDB and S3 in moto (tables from
    template.yaml), the Lambda handlers over HTTP, the sweeper on its schedule.
    Everything is in memory and goes away on Ctrl-C."""
    try:
        from ..devstack import DevStack
    except ImportError as exc:  # moto, boto3, uvicorn, powertools: the dev extra
        typer.echo(
            f"lakeshore dev needs moto[server], boto3, uvicorn and aws-lambda-powertools "
            f"({exc.name} is missing): pip install 'dreamlake-lakeshore[dev]'",
            err=True,
        )
        raise typer.Exit(2) from None

    logging.basicConfig(level=logging.WARNING, format="lakeshore dev: %(levelname)s %(message)s")
    keep_freed_memory()
    if access_log:
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    stack = DevStack(
        port=port,
        moto_port=moto_port,
        region=region,
        sweep_every=sweep_every,
        access_log=access_log,
    )

    run_server(
        stack,
        "lakeshore dev",
        cannot_listen=lambda exc: f"cannot listen: {exc.strerror or exc}",
        announce=lambda: _announce(
            stack.url, stack.admin_token, stack.moto_endpoint, stack.aws_target, sweep_every
        ),
    )


def _announce(url: str, token: str, moto: str, aws_target: str, sweep_every: float) -> None:
    echo = typer.echo
    echo(f"Lakeshore dev stack: DynamoDB and S3 in moto at {moto} (in memory)")
    echo(f"serving the Lambda handlers at {url}  (Ctrl-C to stop)")
    echo(f"sweeping every {sweep_every:g}s")
    echo(f"admin token: {token}")
    echo("  the account's first admin token, shown only now: the plane keeps only its hash.")
    echo(f"  export LAKESHORE_URL={url} LAKESHORE_TOKEN={token}")
    echo(f'direct (IAM-style, no token): Dispatch("{aws_target}")')
    sys.stdout.flush()
