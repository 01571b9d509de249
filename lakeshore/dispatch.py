"""``Dispatch``: where a queue's work goes — an embedded plane or a remote one.

::

    Dispatch(":memory:")         a plane inside this process (SQLite in memory)
    Dispatch("./plane.db")       a plane in a file, shared by processes on this machine
    Dispatch("https://…", token="…")   a remote plane (HTTP API v1)
    Dispatch("aws://my-stack")   a deployed stack's tables, directly with IAM credentials
    Dispatch()                   LAKESHORE_URL (+ LAKESHORE_TOKEN) if set, else the
                                 auth.yml profile, else the default local plane file

A remote URL given without a token takes LAKESHORE_TOKEN when it is LAKESHORE_URL,
else the token auth.yml saved for that URL.

The embedded plane has the remote semantics: calls and results are serialised exactly
as they would be over HTTP, so code that passes here behaves the same on a deployed
plane.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from . import authfile, config
from . import batching as _batch
from .clock import Clock
from .errors import QueueNotFound
from .plane import Plane, QueueSpec, Submission
from .plane.kinds import check_settings
from .stores import SqliteStore
from .transport import Transport, put_missing

__all__ = ["BlobCarrier", "Dispatch", "QueueCreatedWarning"]


#: invocations per submit call in a batch on an embedded plane (one transaction each)
_EMBEDDED_BATCH = 500


class QueueCreatedWarning(UserWarning):
    """A lazily named queue did not exist on the plane and was created."""


@runtime_checkable
class BlobCarrier(Protocol):
    """A transport whose submit can carry the blobs its submissions name, so they need
    no upload of their own (the HTTP client: ``HttpTransport.submit_with_blobs``)."""

    def submit_with_blobs(
        self, subs: Sequence[Submission], blobs: Mapping[str, bytes]
    ) -> list[str]: ...


_announced = False
#: the options ``Dispatch("https://…", **options)`` passes to the HTTP transport
_HTTP_OPTIONS = frozenset({"timeout", "retries", "backoff", "max_backoff", "wait_timeout"})


def _announce_default(path: Path) -> None:
    global _announced
    if not _announced:
        _announced = True
        print(
            f"lakeshore: no LAKESHORE_URL set and no auth.yml profile; "
            f"using the local plane file {path}",
            file=sys.stderr,
        )


def open_transport(
    target: str, *, token: str | None, clock: Clock | None, options: Mapping[str, Any]
) -> Transport:
    """The explicit factory: a target string → one :class:`Transport` implementation.

    ``http(s)://`` is a remote plane (options: ``timeout``, ``retries``, ``backoff``,
    ``max_backoff``, ``wait_timeout``); ``aws://<stack>`` is the plane core in this
    process over a deployed stack's DynamoDB tables and S3 bucket, reached with the
    caller's IAM credentials (options: the embedded plane's; see
    :mod:`~dreamlake.lakeshore.awsdirect`); anything else is an embedded plane's SQLite
    file.
    """
    if target.startswith("aws://"):
        from .awsdirect import open_aws

        if token is not None:
            raise TypeError("aws:// authenticates with IAM credentials, not a token")
        return open_aws(target, clock=clock, options=options)
    if target.startswith(("http://", "https://")):
        from .http import HttpTransport

        unknown = set(options) - _HTTP_OPTIONS
        if unknown or clock is not None:
            named = ", ".join(sorted(unknown | ({"clock"} if clock is not None else set())))
            raise TypeError(f"{named}: options of an embedded plane, not of a remote one")
        return HttpTransport(target, token, **options)
    if "://" in target:
        raise ValueError(f"unsupported plane address {target!r}")
    store_options = {k: options[k] for k in ("durability",) if k in options}
    plane_options = {k: v for k, v in options.items() if k not in store_options}
    return Plane(SqliteStore(target, **store_options), clock=clock, **plane_options)


def _saved_token(url: str) -> str | None:
    """The token for a plane URL given without one: LAKESHORE_TOKEN when the URL is
    LAKESHORE_URL, else what auth.yml saved for it."""
    cfg = config.settings()
    if cfg.token and cfg.url and cfg.url.rstrip("/") == url.rstrip("/"):
        return cfg.token
    return authfile.token_for(url, path=cfg.auth_file)


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
            saved = None if cfg.url else authfile.resolve(path=cfg.auth_file)
            if cfg.url:
                target = cfg.url
            elif saved is not None:
                target, token = saved[0], token or saved[1]
            else:
                target = cfg.default_plane_path
                _announce_default(target)
        if token is None and str(target).startswith(("http://", "https://")):
            token = _saved_token(str(target))
        self.target = str(target)
        #: the bearer token of a remote plane (None for an embedded one)
        self.token = token
        self.transport: Transport = open_transport(
            self.target, token=token, clock=clock, options=plane_options
        )
        #: the transport, when its submit can carry blobs (asked once: the check is slow)
        self._carrier = self.transport if isinstance(self.transport, BlobCarrier) else None
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

    def transport_batch_size(self) -> int:
        """Invocations one submit request may carry (the plane's ``max_batch``)."""
        limits = getattr(self.transport, "limits", None)
        return int(limits().max_batch) if callable(limits) else _EMBEDDED_BATCH

    def upload(self, blobs: Mapping[str, bytes]) -> None:
        """Make sure the plane holds these content-addressed blobs (each sent once)."""
        new = self._unsent(blobs)
        if not new:
            return
        put_missing(self.transport, new)
        with self._lock:
            self._blobs.update(new)

    def forget_blobs(self, digests: Iterable[str]) -> None:
        """Take these blobs as not sent: the next :meth:`upload` of them asks the plane
        again (one this process sent long ago may have expired from it since)."""
        with self._lock:
            self._blobs.difference_update(digests)

    def _unsent(self, blobs: Mapping[str, bytes]) -> dict[str, bytes]:
        """The blobs this Dispatch has not yet seen the plane take."""
        with self._lock:
            return {d: b for d, b in blobs.items() if d not in self._blobs}

    def submit(
        self,
        subs: list[Submission],
        *,
        spec: QueueSpec,
        strict: bool,
        check: Iterable[str],
        blobs: Mapping[str, bytes] | None = None,
    ) -> list[str]:
        """Submit, creating the queue first if needed (and again if it was removed).

        ``blobs`` are the content-addressed blobs the submissions name (a function body,
        arguments over the inline limit); each goes to the plane once per Dispatch, in
        the submit request itself where the transport can carry it, else uploaded first.
        Inside ``with dls.batch():`` they are uploaded at once and the submissions
        buffered and sent by the batch.
        """
        open_batch = _batch.current()
        if open_batch is not None:
            self.upload(blobs or {})
            return open_batch.add(self, subs, spec=spec, strict=strict, check=check)
        self.ensure_queue(spec, strict=strict, check=check)
        new = self._unsent(blobs or {})
        if new and self._carrier is None:
            self.upload(new)
            new = {}
        try:
            ids = self._send(subs, new)
        except QueueNotFound:
            if strict:
                raise
            self.forget_queue(spec.name)
            self.ensure_queue(spec, strict=strict, check=check)
            ids = self._send(subs, new)
        if new:
            with self._lock:
                self._blobs.update(new)
        return ids

    def _send(self, subs: list[Submission], blobs: dict[str, bytes]) -> list[str]:
        if blobs and self._carrier is not None:
            return self._carrier.submit_with_blobs(subs, blobs)
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
