"""The dashboard's static files, read from the installed package."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

__all__ = ["TYPES", "asset"]

#: the media type of each kind of file the dashboard ships (all text)
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\.(html|js|css|svg)")


@cache
def asset(name: str) -> tuple[str, str] | None:
    """``(media type, text)`` of the static file ``name``, or None when there is no such
    file. Only plain names of known kinds are looked up (no paths)."""
    if not _NAME.fullmatch(name):
        return None
    path = resources.files(__name__.rpartition(".")[0]).joinpath("static", name)
    if not path.is_file():
        return None
    return TYPES[name[name.rindex(".") :]], path.read_text(encoding="utf-8")
