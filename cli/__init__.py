"""The ``lakeshore`` command (typer). Installed with the ``cli`` extra."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    try:
        from .app import app
    except ImportError as exc:  # typer is an extra: say how to get it
        print(
            f"lakeshore: the command line needs the cli extra ({exc.name} is missing): "
            "pip install 'dreamlake-lakeshore[cli]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    app()
