"""A one-line account of what an invocation calls, for the dashboard."""

from __future__ import annotations

from typing import Any

from ..errors import LakeshoreError
from ..wire import decode_payload

__all__ = ["call_summary"]

#: the characters of a call's arguments a summary shows
_SUMMARY = 200


def call_summary(payload: bytes | None) -> dict[str, Any] | None:
    """What an invocation calls, for people: the function (a pickled one by its name,
    never unpickled here), the arguments of a ``ref`` call shortened, a command's argv
    and the names (not values) of its environment."""
    if payload is None:
        return None
    try:
        env = decode_payload(payload)
    except LakeshoreError:
        return None
    kind = env["kind"]
    if kind == "pickle":
        args = env.get("args")
        size = len(args) if isinstance(args, bytes) else None
        return {"kind": kind, "name": str(env.get("name") or "?"), "args_bytes": size}
    if kind == "ref":
        shown = ", ".join(
            [repr(a) for a in env["args"]] + [f"{k}={v!r}" for k, v in env["kwargs"].items()]
        )
        if len(shown) > _SUMMARY:
            shown = shown[: _SUMMARY - 1] + "…"
        return {"kind": kind, "name": env["target"], "args": shown}
    cmd = env["cmd"]
    return {
        "kind": kind,
        "name": cmd if isinstance(cmd, str) else " ".join(map(str, cmd)),
        "env": sorted(env["env"]),
        "cwd": env.get("cwd"),
    }
