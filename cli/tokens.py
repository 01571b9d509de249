"""``lakeshore tokens create|ls|revoke`` and ``lakeshore login``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer

from .. import authfile
from ..api import auth
from ..plane import Plane
from ..stores import SqliteStore
from .common import JsonOpt, PlaneOpt, TokenOpt, UrlOpt, emit, fail, open_plane, when

__all__ = ["login", "tokens_app"]

tokens_app = typer.Typer(help="Bearer tokens of a plane (admin).", no_args_is_help=True)


class _Tokens(Protocol):
    def create_token(self, role: str, queues: list[str], name: str) -> dict[str, Any]: ...

    def list_tokens(self) -> list[dict[str, Any]]: ...

    def revoke_token(self, token_id: str) -> None: ...


class _PlaneFile:
    """Tokens straight in a plane file: owning the file is the credential."""

    def __init__(self, path: Path) -> None:
        self.plane = Plane(SqliteStore(path))

    def create_token(self, role: str, queues: list[str], name: str) -> dict[str, Any]:
        secret, rec = auth.create_token(self.plane, role, queues, name)
        view = asdict(rec)
        del view["secret_hash"]
        return {"token": secret, **view}

    def list_tokens(self) -> list[dict[str, Any]]:
        views = [asdict(t) for t in self.plane.store.list_tokens()]
        for v in views:
            del v["secret_hash"]
        return views

    def revoke_token(self, token_id: str) -> None:
        if not auth.revoke(self.plane, token_id):
            raise fail(f"no token {token_id!r}")


@contextlib.contextmanager
def _tokens(url: str | None, token: str | None, plane: Path | None) -> Iterator[_Tokens]:
    if plane is not None:
        local = _PlaneFile(plane)
        try:
            yield local
        finally:
            local.plane.close()
        return
    with open_plane(url, token, None) as dp:
        if not hasattr(dp.transport, "create_token"):
            raise fail("tokens live on a served plane: give --url (or --plane for its file)", 2)
        yield dp.transport  # type: ignore[misc]


@tokens_app.command("create")
def create(
    role: Annotated[str, typer.Option(help="admin, producer or worker.")],
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="A queue glob in scope (repeat).")
    ] = None,
    name: Annotated[str, typer.Option(help="A note on what it is for.")] = "",
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a token. Its secret is printed this once; the plane keeps only a hash."""
    with _tokens(url, token, plane) as tokens:
        made = tokens.create_token(role, queue or ["*"], name)
    if as_json:
        emit([made], [], as_json=True)
    else:
        typer.echo(made["token"])


@tokens_app.command("ls")
def ls(
    url: UrlOpt = None, token: TokenOpt = None, plane: PlaneOpt = None, as_json: JsonOpt = False
) -> None:
    """Tokens (never their secrets)."""
    with _tokens(url, token, plane) as tokens:
        rows = tokens.list_tokens()
    emit(
        rows,
        [
            ("id", lambda t: t["id"]),
            ("role", lambda t: t["role"]),
            ("queues", lambda t: ", ".join(t["queues"])),
            ("name", lambda t: t["name"] or "-"),
            ("created", lambda t: when(t["created_at"])),
            ("revoked", lambda t: when(t["revoked_at"])),
        ],
        as_json=as_json,
    )


@tokens_app.command("revoke")
def revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (see tokens ls).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    plane: PlaneOpt = None,
) -> None:
    """Revoke a token: every later request with it is 401."""
    with _tokens(url, token, plane) as tokens:
        tokens.revoke_token(token_id)
    typer.echo(f"revoked {token_id}")


def login(
    url: Annotated[str, typer.Option(help="The plane's URL.")],
    token: Annotated[str, typer.Option(help="Your token (lks_...).")],
    profile: Annotated[str, typer.Option(help="The profile to save it as.")] = "default",
) -> None:
    """Check a URL and token against the plane, then save them to auth.yml (mode 0600)."""
    with open_plane(url, token, None) as dp:
        hello = dp.transport.hello()  # type: ignore[attr-defined]
    path = authfile.save_profile(profile, url, token)
    who = hello["identity"]
    typer.echo(f"logged in to {url} as a {who['role']} token ({who['token_id']}); saved to {path}")
