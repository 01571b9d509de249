"""Settings, each a typed field here, and the lazily built default Dispatch.

Nothing is read from the environment at import; :func:`settings` reads it on first use.

=======================  =======================================================
``LAKESHORE_URL``        a remote plane's URL (``Dispatch()`` connects to it)
``LAKESHORE_TOKEN``      the bearer token for that plane
``LAKESHORE_AUTH_FILE``  saved planes and tokens (default ``$XDG_CONFIG_HOME/lakeshore/
                         auth.yml``, i.e. ``~/.config/lakeshore/auth.yml``); used by
                         ``Dispatch()`` when ``LAKESHORE_URL`` is not set
``LAKESHORE_PROFILE``    the profile of that file to use (else its ``default``)
``LAKESHORE_HOME``       where the default local plane file lives
                         (default ``$XDG_DATA_HOME/lakeshore``, i.e.
                         ``~/.local/share/lakeshore``)
=======================  =======================================================
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dispatch import Dispatch

__all__ = ["Settings", "configure", "default_dispatch", "settings"]


@dataclass(frozen=True)
class Settings:
    #: submitting to a queue the plane does not know is an error (else it is created)
    strict: bool = False
    #: URL of a remote plane; None means the local plane file
    url: str | None = None
    #: bearer token for ``url``
    token: str | None = None
    #: folder of the default local plane file
    home: Path = Path("~/.local/share/lakeshore")
    #: saved planes and tokens (see :mod:`~dreamlake.lakeshore.authfile`)
    auth_file: Path = Path("~/.config/lakeshore/auth.yml")
    #: the profile of ``auth_file`` to use; None means the file's ``default``
    profile: str | None = None

    @property
    def default_plane_path(self) -> Path:
        return self.home.expanduser() / "plane.db"


_lock = threading.RLock()
_settings: Settings | None = None
_default: Dispatch | None = None


def _from_env() -> Settings:
    xdg = os.environ.get("XDG_DATA_HOME")
    home = os.environ.get("LAKESHORE_HOME") or (
        str(Path(xdg) / "lakeshore") if xdg else "~/.local/share/lakeshore"
    )
    xdg_config = os.environ.get("XDG_CONFIG_HOME")
    auth_file = os.environ.get("LAKESHORE_AUTH_FILE") or (
        str(Path(xdg_config) / "lakeshore" / "auth.yml")
        if xdg_config
        else "~/.config/lakeshore/auth.yml"
    )
    return Settings(
        url=os.environ.get("LAKESHORE_URL") or None,
        token=os.environ.get("LAKESHORE_TOKEN") or None,
        home=Path(home),
        auth_file=Path(auth_file),
        profile=os.environ.get("LAKESHORE_PROFILE") or None,
    )


def settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = _from_env()
        return _settings


def configure(*, dispatch: Dispatch | None = None, **changes: Any) -> Settings:
    """Change settings for this process (``strict=True``, ``url=...``, ...).

    ``dispatch=`` sets the Dispatch used where none is given. Changing ``url``,
    ``token``, ``home``, ``auth_file`` or ``profile`` drops a default Dispatch built
    from the old values.
    """
    global _settings, _default
    current = settings()
    unknown = set(changes) - set(Settings.__dataclass_fields__)
    if unknown:
        raise TypeError(f"configure() got unknown settings: {', '.join(sorted(unknown))}")
    for key in ("home", "auth_file"):
        if key in changes:
            changes[key] = Path(changes[key])
    with _lock:
        _settings = replace(current, **changes)
        if dispatch is not None:
            _default = dispatch
        elif {"url", "token", "home", "auth_file", "profile"} & set(changes):
            _default = None
        return _settings


def default_dispatch() -> Dispatch:
    """The Dispatch used when code names none: built from settings on first use."""
    global _default
    with _lock:
        if _default is None:
            from .dispatch import Dispatch

            _default = Dispatch()
        return _default
