"""``Dispatch``: where a queue's work goes — an embedded plane or a remote one.

::

    Dispatch(":memory:")         a plane inside this process (SQLite in memory)
    Dispatch("./plane.db")       a plane in a file, shared by processes on this machine
    Dispatch()                   LAKESHORE_URL if set, else the default local plane file

The embedded plane has the remote semantics: calls and results are serialised exactly
as they would be over HTTP, so code that passes here behaves the same on a deployed
plane.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import config
from .clock import Clock
from .errors import QueueNotFound
from .plane import Plane, QueueSpec, Submission
from .plane.kinds import check_settings
from .stores import SqliteStore
from .transport import Transport

__all__ = ["Dispatch", "QueueCreatedWarning"]


class QueueCreatedWarning(UserWarning):
    """A lazily named queue did not exist on the plane and was created."""


_announced = False


def _announce_default(path: Path) -> None:
    global _announced
    if not _announced:
        _announced = True
        print(
            f"lakeshore: no LAKESHORE_URL set; using the local plane file {path}",
            file=sys.stderr,
        )


def open_transport(
    target: str, *, token: str | None, clock: Clock | None, options: Mapping[str, Any]
) -> Transport:
    """The explicit factory: a target string → one :class:`Transport` implementation."""
    if target.startswith(("http://", "https://")):
        raise ValueError(
            f"{target!r}: this build of Lakeshore has no HTTP client yet; "
            "use an embedded plane (':memory:' or a file path)"
        )
    if "://" in target:
        raise ValueError(f"unsupported plane address {target!r}")
    store_options = {k: options[k] for k in ("durability",) if k in options}
    plane_options = {k: v for k, v in options.items() if k not in store_options}
    return Plane(SqliteStore(target, **store_options), clock=clock, **plane_options)


class Dispatch:
    """A handle on one plane. Thread-safe; share one per process and plane.

    ``plane_options`` go to the embedded :class:`~dreamlake.lakeshore.plane.Plane`
    (``lease_seconds``, ``max_attempts``, ``retention``, ``durability``, ...).
    """

    def __init__(
        self,
        target: str | Path | None = None,
        *,
        token: str | None = None,
        clock: Clock | None = None,
        **plane_options: Any,
    ) -> None:
        if target is None:
            cfg = config.settings()
            if cfg.url:
                target, token = cfg.url, token or cfg.token
            else:
                target = cfg.default_plane_path
                _announce_default(target)
        self.target = str(target)
        self.transport: Transport = open_transport(
            self.target, token=token, clock=clock, options=plane_options
        )
        self._lock = threading.Lock()
        self._queues: dict[str, QueueSpec] = {}
        self._blobs: set[str] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"Dispatch({self.target!r})"

    # --- used by queue handles -------------------------------------------------------
    def ensure_queue(
        self, spec: QueueSpec, *, strict: bool, check: Iterable[str], warn_missing: bool = False
    ) -> QueueSpec:
        """The plane's spec for this queue, created on first use unless ``strict``.

        With ``warn_missing``, creating it warns once (a lazy handle's typo guard).
        """
        with self._lock:
            known = self._queues.get(spec.name)
        if known is not None:
            check_settings(spec, known, check)
            return known
        if warn_missing and not strict:
            try:
                self.transport.ensure_queue(spec, create=False, check=tuple(check))
            except QueueNotFound:
                warnings.warn(
                    f"queue {spec.name!r} did not exist on {self.target}; created it "
                    "(a typo? pass strict=True to make this an error)",
                    QueueCreatedWarning,
                    stacklevel=5,
                )
        stored = self.transport.ensure_queue(spec, create=not strict, check=tuple(check))
        with self._lock:
            self._queues[spec.name] = stored
        return stored

    def forget_queue(self, name: str) -> None:
        with self._lock:
            self._queues.pop(name, None)

    def upload(self, blobs: Mapping[str, bytes]) -> None:
        """Make sure the plane holds these content-addressed blobs (each sent once)."""
        with self._lock:
            new = [d for d in blobs if d not in self._blobs]
        if not new:
            return
        for d in self.transport.missing_blobs(new):
            self.transport.put_blob(d, blobs[d])
        with self._lock:
            self._blobs.update(new)

    def submit(
        self, subs: list[Submission], *, spec: QueueSpec, strict: bool, check: Iterable[str]
    ) -> list[str]:
        """Submit, creating the queue first if needed (and again if it was removed)."""
        self.ensure_queue(spec, strict=strict, check=check)
        try:
            return self.transport.submit(subs)
        except QueueNotFound:
            if strict:
                raise
            self.forget_queue(spec.name)
            self.ensure_queue(spec, strict=strict, check=check)
            return self.transport.submit(subs)

    # --- queue administration -------------------------------------------------------------
    def queues(self) -> list[dict[str, Any]]:
        """Every queue: ``spec``, ``last_activity`` (submit or claim) and ``counts``."""
        return self.transport.list_queues()

    def delete_queue(self, name: str, *, force: bool = False) -> int:
        """Remove a queue (with ``force`` even when work is pending or running)."""
        self.forget_queue(name)
        return self.transport.delete_queue(name, force=force)

    def prune_queues(self, older_than: float) -> list[str]:
        """Remove queues idle for ``older_than`` seconds with nothing pending or running."""
        with self._lock:
            self._queues.clear()
        return self.transport.prune_queues(older_than)

    # --- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.transport.close()

    def __enter__(self) -> Dispatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
