"""The request machinery of one remote plane: URLs, headers, connections, retries.

Contract:

- :meth:`Session._call` is one API call: msgpack both ways, ``Authorization: Bearer``
  on the plane's own origin only (never to S3 or another host a URL points at), and the
  answer's error raised as its class of the one exception tree.
- :meth:`Session._exchange` repeats a request after a connection error, a ``429`` or a
  ``5xx``, at most ``retries`` times, with capped exponential backoff and jitter (and at
  least a ``429``'s ``Retry-After``); every route is safe to repeat (see the package
  docstring). A certificate that fails verification is raised at once; a connection
  error that outlasts the retries becomes :class:`Unavailable`, and an answer that
  does is returned as it is (``_call`` raises its error). Once ``_closed`` is set,
  every call fails.
- Each thread has its own keep-alive connection per origin, closed when the thread's
  holder is collected or by :meth:`Session._close_connections`.
"""

from __future__ import annotations

import http.client
import random
import ssl
import threading
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from ..errors import LakeshoreError, Unavailable
from ..wire import pack
from .answers import decode_map, expect_ok, retry_after
from .connections import (
    Answer,
    Body,
    Origin,
    Target,
    ThreadConnections,
    close_all,
    new_connection,
    origin_of,
    request_once,
)

__all__ = ["MSGPACK", "Session", "is_plane_path"]

MSGPACK = "application/msgpack"
_USER_AGENT = "dreamlake-lakeshore (python http.client)"
#: statuses worth another try: throttled, or the plane (or a gateway) failed this time
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


def is_plane_path(url: str) -> bool:
    """Whether a URL the plane handed out is a path on the plane itself (``/v1/...``)."""
    return url.startswith("/") and not url.startswith("//")


class Session:
    """Requests to the plane at ``base_url``; thread-safe.

    The settings and state are set by :class:`~.transport.HttpTransport`'s constructor
    (which documents them); this part only uses them.
    """

    base_url: str
    timeout: float
    retries: int
    backoff: float
    max_backoff: float
    _token: str | None
    _origin: Origin
    #: the base URL's path (a stage), put before every route
    _prefix: str
    #: made on the first https connection
    _ssl: ssl.SSLContext | None
    _lock: threading.Lock
    #: ``conns``: this thread's :class:`ThreadConnections`
    _local: threading.local
    _threads: weakref.WeakSet[ThreadConnections]
    _closed: threading.Event

    # ------------------------------------------------------------------ calls
    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        query: Mapping[str, str] | None = None,
        wait: float = 0.0,
    ) -> dict[str, Any]:
        """One API call: msgpack in and out, retried; raises the answer's error."""
        return decode_map(self._call_raw(method, self._target(path, query), body, wait=wait))

    def _call_raw(
        self, method: str, target: Target, body: dict[str, Any] | None, *, wait: float = 0.0
    ) -> Answer:
        data, headers = self._encode(target, body)
        return expect_ok(self._exchange(method, target, data, headers, self.timeout + wait))

    def _call_parts(self, method: str, path: str, parts: list[bytes]) -> dict[str, Any]:
        """One API call whose msgpack body is already encoded, in parts that go out as
        they are (a large blob among them is not copied into one buffer with the rest)."""
        target = self._target(path)
        headers = self._headers(target, accept=MSGPACK)
        headers["Content-Type"] = MSGPACK
        return decode_map(expect_ok(self._exchange(method, target, parts, headers, self.timeout)))

    def _encode(
        self, target: Target, body: dict[str, Any] | None
    ) -> tuple[bytes | None, dict[str, str]]:
        """The bytes and headers of a msgpack request to ``target`` (no body: none)."""
        headers = self._headers(target, accept=MSGPACK)
        if body is None:
            return None, headers
        headers["Content-Type"] = MSGPACK
        return pack(body), headers

    def _blob(self, method: str, target: Target, data: bytes | None) -> bytes:
        """Raw bytes up or down; a GET follows up to three redirects (to S3, say),
        without the token once it leaves the plane's origin."""
        for _ in range(4):
            headers = self._headers(target, accept="*/*")
            if data is not None:
                headers["Content-Type"] = "application/octet-stream"
            answer = self._exchange(method, target, data, headers, self.timeout)
            location = answer.headers.get("location")
            if method == "GET" and answer.status in (301, 302, 303, 307, 308) and location:
                target = self._resolve(urljoin(self._url_of(target), location))
                continue
            return expect_ok(answer).body
        raise LakeshoreError(f"too many redirects fetching {target.path}")

    def _headers(self, target: Target, *, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": _USER_AGENT}
        if target.own and self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _exchange(
        self,
        method: str,
        target: Target,
        body: Body | None,
        headers: Mapping[str, str],
        timeout: float,
    ) -> Answer:
        """Send with retries: connection errors, 429 and 5xx, backing off in between."""
        attempt = 0
        while True:
            if self._closed.is_set():
                raise LakeshoreError(f"{self!r} is closed")
            try:
                answer = request_once(
                    self._conn(target.origin), method, target, body, headers, timeout
                )
            except ssl.SSLCertVerificationError:
                raise
            except (OSError, http.client.HTTPException) as exc:
                if attempt >= self.retries or self._closed.is_set():
                    raise Unavailable(
                        f"{method} {target.path}: cannot reach the plane at "
                        f"{self._url_of(target)}: {type(exc).__name__}: {exc}"
                    ) from exc
                delay = self._backoff(attempt)
            else:
                if answer.status not in _RETRY_STATUS or attempt >= self.retries:
                    return answer
                delay = max(self._backoff(attempt), retry_after(answer))
            attempt += 1
            self._closed.wait(delay)

    def _backoff(self, attempt: int) -> float:
        """Capped exponential backoff with jitter: half fixed, half random."""
        ceiling = min(self.max_backoff, self.backoff * 2.0**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    # ------------------------------------------------------------------ connections
    def _conn(self, origin: Origin) -> http.client.HTTPConnection:
        """This thread's keep-alive connection to ``origin``."""
        mine: ThreadConnections | None = getattr(self._local, "conns", None)
        if mine is None:
            mine = ThreadConnections()
            self._local.conns = mine
            weakref.finalize(mine, close_all, mine.by_origin)
            with self._lock:
                self._threads.add(mine)
        conn = mine.by_origin.get(origin)
        if conn is None:
            conn = self._new_conn(origin)
            mine.by_origin[origin] = conn
        return conn

    def _new_conn(self, origin: Origin) -> http.client.HTTPConnection:
        """A new connection to ``origin``, not yet open (one TLS context for them all)."""
        context = None
        if origin[0] == "https":
            with self._lock:
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                context = self._ssl
        return new_connection(origin, self.timeout, context)

    def _close_connections(self) -> None:
        """Close every thread's connections (a thread's next call would reopen one)."""
        with self._lock:
            threads = list(self._threads)
        for conns in threads:
            close_all(conns.by_origin)

    # ------------------------------------------------------------------ URLs
    def _target(self, path: str, query: Mapping[str, str] | None = None) -> Target:
        full = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        return Target(self._origin, full, own=True)

    def _resolve(self, url: str) -> Target:
        """A URL the plane handed out: ``/v1/...`` is relative to the plane's base URL."""
        if is_plane_path(url):
            return Target(self._origin, self._prefix + url, own=True)
        parts = urlsplit(urljoin(self.base_url + "/", url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LakeshoreError(f"the plane handed out an unusable URL: {url!r}")
        origin = origin_of(parts.scheme, parts.hostname, parts.port)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return Target(origin, path, own=origin == self._origin)

    def _url_of(self, target: Target) -> str:
        scheme, host, port = target.origin
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{port}{target.path}"
