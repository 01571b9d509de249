"""``auth.yml``: saved planes and their tokens, one profile each.

::

    default: prod
    profiles:
      prod:
        url: https://abc.execute-api.us-east-1.amazonaws.com
        token: lks_...

The file is ``~/.config/lakeshore/auth.yml`` (``$XDG_CONFIG_HOME/lakeshore/auth.yml``);
``LAKESHORE_AUTH_FILE`` names another. ``Dispatch()`` uses it when ``LAKESHORE_URL`` is
not set: the profile ``LAKESHORE_PROFILE`` names, else the file's ``default``.

It holds secrets: it is written with mode 0600 (its folder 0700), and reading one that
others may read warns with a :class:`UserWarning`. Only this fixed shape is read and
written, by hand — no YAML library, so the core install stays light. Comments and blank
lines are allowed; values may be quoted (``"..."`` or ``'...'``).
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import config

__all__ = [
    "AuthFileError",
    "default_path",
    "load",
    "remove_profile",
    "resolve",
    "save_profile",
    "token_for",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: values written without quotes (anything else is double-quoted)
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./:@%+=~,-]*")
#: words a YAML reader would not take as strings
_YAML_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "null", "none", "~"})
_HEADER = "# Lakeshore planes and tokens. Keep this file private (mode 0600).\n"


class AuthFileError(ValueError):
    """The auth file is malformed, or names a profile it does not have."""


def default_path() -> Path:
    """Where the auth file is: ``LAKESHORE_AUTH_FILE``, else the XDG config folder."""
    return config.settings().auth_file.expanduser()


def _path(path: str | Path | None) -> Path:
    return Path(path).expanduser() if path is not None else default_path()


def load(path: str | Path | None = None) -> dict[str, Any]:
    """The file as ``{"default": name | None, "profiles": {name: {"url", "token"}}}``.

    A missing file is an empty one. Raises :class:`AuthFileError` when malformed.
    """
    file = _path(path)
    try:
        text = file.read_text(encoding="utf-8")
        mode = file.stat().st_mode
    except FileNotFoundError:
        return {"default": None, "profiles": {}}
    if os.name == "posix" and mode & 0o077:
        warnings.warn(
            f"{file} holds tokens but others may read it (mode {mode & 0o777:o}); "
            f"run: chmod 600 {file}",
            UserWarning,
            stacklevel=2,
        )
    return _parse(text, file)


def save_profile(
    name: str,
    url: str,
    token: str,
    *,
    make_default: bool = True,
    path: str | Path | None = None,
) -> Path:
    """Add or replace profile ``name`` (the default one unless ``make_default=False``).

    Writes the whole file anew with mode 0600, atomically. Returns its path.
    """
    if not _NAME.fullmatch(name):
        raise AuthFileError(f"a profile name is letters, digits, '_', '.', '-'; not {name!r}")
    if not url.startswith(("http://", "https://")):
        raise AuthFileError(f"a plane URL starts with https:// (or http://), not {url!r}")
    file = _path(path)
    data = load(file)
    data["profiles"][name] = {"url": url.rstrip("/"), "token": token}
    if make_default or not data["default"]:
        data["default"] = name
    _write(file, data)
    return file


def remove_profile(name: str, *, path: str | Path | None = None) -> bool:
    """Remove a profile (and the default naming it); False when there was none."""
    file = _path(path)
    data = load(file)
    if data["profiles"].pop(name, None) is None:
        return False
    if data["default"] == name:
        data["default"] = None
    _write(file, data)
    return True


def resolve(
    profile: str | None = None, *, path: str | Path | None = None
) -> tuple[str, str | None] | None:
    """``(url, token)`` of ``profile``, else of ``LAKESHORE_PROFILE``, else the default.

    None when no profile is asked for and the file names no default (or does not
    exist). Raises :class:`AuthFileError` when the profile asked for is not there.
    """
    file = _path(path)
    data = load(file)
    name = profile or config.settings().profile or data["default"]
    if name is None:
        return None
    found = data["profiles"].get(name)
    if found is None:
        if not file.exists():
            raise AuthFileError(f"profile {name!r} asked for, but {file} does not exist")
        raise AuthFileError(f"no profile {name!r} in {file}")
    url = found.get("url")
    if not url:
        raise AuthFileError(f"profile {name!r} in {file} has no url")
    return str(url), found.get("token") or None


def token_for(url: str, *, path: str | Path | None = None) -> str | None:
    """The token saved for the plane at ``url`` (the first profile with that URL)."""
    want = url.rstrip("/")
    for found in load(path)["profiles"].values():
        if str(found.get("url", "")).rstrip("/") == want and found.get("token"):
            return str(found["token"])
    return None


# ---------------------------------------------------------------------- the format
def _parse(text: str, file: Path) -> dict[str, Any]:
    default: str | None = None
    profiles: dict[str, dict[str, str]] = {}
    in_profiles = False
    current: dict[str, str] | None = None
    name_indent: int | None = None
    field_indent: int | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        body = raw.rstrip()
        stripped = body.lstrip(" ")
        if not stripped or stripped.startswith("#"):
            continue

        def bad(why: str, number: int = number) -> AuthFileError:
            return AuthFileError(f"{file}:{number}: {why}")

        indent = len(body) - len(stripped)
        if stripped.startswith("\t") or "\t" in body[:indent]:
            raise bad("indent with spaces, not tabs")
        key, sep, rest = stripped.partition(":")
        key = key.strip()
        if not sep or not key:
            raise bad("expected 'key: value'")
        value = _scalar(rest.strip(), bad)
        if indent == 0:
            current = None
            if key == "default":
                default, in_profiles = value or None, False
            elif key == "profiles":
                if value not in ("", "{}"):
                    raise bad("profiles: takes an indented map of profiles")
                in_profiles, name_indent = True, None
            else:
                raise bad(f"unknown key {key!r} (expected default or profiles)")
        elif in_profiles and (name_indent is None or indent == name_indent):
            if value:
                raise bad(f"profile {key!r} takes an indented map (url, token)")
            if not _NAME.fullmatch(key):
                raise bad(f"bad profile name {key!r}")
            name_indent, field_indent = indent, None
            current = profiles.setdefault(key, {})
        elif current is not None and name_indent is not None and indent > name_indent:
            if field_indent is None:
                field_indent = indent
            if indent != field_indent:
                raise bad("inconsistent indentation")
            current[key] = value
        else:
            raise bad("unexpected indentation")
    return {"default": default, "profiles": profiles}


def _scalar(value: str, bad: Callable[[str], AuthFileError]) -> str:
    """A value: quoted (``"..."`` with ``\\`` escapes, or ``'...'``) or plain up to a
    `` #`` comment."""
    if value.startswith('"'):
        out, i = [], 1
        while i < len(value):
            c = value[i]
            if c == "\\" and i + 1 < len(value):
                out.append(value[i + 1])
                i += 2
                continue
            if c == '"':
                tail = value[i + 1 :].strip()
                if tail and not tail.startswith("#"):
                    raise bad("text after a quoted value")
                return "".join(out)
            out.append(c)
            i += 1
        raise bad("unterminated quoted value")
    if value.startswith("'"):
        end = value.find("'", 1)
        while end != -1 and value[end + 1 : end + 2] == "'":
            end = value.find("'", end + 2)
        if end == -1:
            raise bad("unterminated quoted value")
        tail = value[end + 1 :].strip()
        if tail and not tail.startswith("#"):
            raise bad("text after a quoted value")
        return value[1:end].replace("''", "'")
    if value.startswith("#"):
        return ""
    comment = value.find(" #")
    return (value[:comment] if comment != -1 else value).strip()


def _quote(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise AuthFileError("values in the auth file are one line")
    if _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS and not _number(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _render(data: dict[str, Any]) -> str:
    lines = [_HEADER.rstrip("\n")]
    if data.get("default"):
        lines.append(f"default: {_quote(str(data['default']))}")
    profiles: dict[str, dict[str, str]] = data.get("profiles") or {}
    if not profiles:
        lines.append("profiles: {}")
    else:
        lines.append("profiles:")
        for name, found in profiles.items():
            lines.append(f"  {name}:")
            for key, value in found.items():
                lines.append(f"    {key}: {_quote(str(value))}")
    return "\n".join(lines) + "\n"


def _write(file: Path, data: dict[str, Any]) -> None:
    """Write atomically: a 0600 temporary file in the same folder, then a rename."""
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".auth-", suffix=".tmp", dir=file.parent)
    try:
        if os.name == "posix":
            os.fchmod(fd, 0o600)  # mkstemp's mode already; said here as the contract
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(_render(data))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
