"""``HttpTransport``: the :class:`~.transport.Transport` of a remote plane (HTTP API v1).

::

    dp = Dispatch("https://abc.execute-api.us-east-1.amazonaws.com", token="lks_…")

Every call is msgpack both ways with ``Authorization: Bearer <token>``, over the stdlib
``http.client``: one keep-alive connection per thread and origin, TCP_NODELAY, reopened
when the server has dropped it. Connection errors, ``429`` (after its ``Retry-After``)
and ``5xx`` answers are retried with capped exponential backoff and jitter. Repeating is
safe on every route: submit is idempotent on the id the SDK always chooses; heartbeat,
cancel, priority and queue settings are idempotent; complete and fail are guarded by the
lease token, so a repeat after a lost answer is refused (``LeaseLost``), never recorded
twice. A claim whose answer is lost leaves a lease nobody holds: it runs out and the
invocation is handed on, as for a crashed worker (execution is at-least-once anyway).

Result watches are coalesced: all ids watched through one transport are awaited by one
background long-poll, ``POST /v1/invocations/wait`` over the whole set (:class:`_Watches`).

The plane's clock is the one that counts (expiry, ``scheduled``): :meth:`HttpTransport.now`
is this machine's clock corrected by the offset measured at ``GET /v1/hello``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import random
import select
import socket
import ssl
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urljoin, urlsplit

import msgpack

from .errors import (
    Conflict,
    ExpiredInvocation,
    Forbidden,
    InvalidRequest,
    LakeshoreError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    QueueNotFound,
    Throttled,
    Unauthorized,
    Unavailable,
    UnknownInvocation,
    UnsupportedMediaType,
    from_wire,
)
from .plane.model import (
    FINISHED,
    Claim,
    DaemonRecord,
    HeartbeatAnswer,
    Invocation,
    LogEntry,
    QueueSpec,
    State,
    Submission,
)
from .wire import pack

__all__ = ["HttpTransport", "Limits"]

log = logging.getLogger(__name__)

MSGPACK = "application/msgpack"
_USER_AGENT = "dreamlake-lakeshore (python http.client)"
#: statuses worth another try: throttled, or the plane (or a gateway) failed this time
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
#: the longest ``Retry-After`` obeyed (seconds); a longer one is cut to this
_MAX_RETRY_AFTER = 60.0
#: status → class for error answers that carry no ``{"error": {...}}`` body (a proxy's)
_BY_STATUS: dict[int, type[LakeshoreError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: ExpiredInvocation,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: Throttled,
}
#: ids remembered as existing (submitted or read here): watching them needs no check
_KNOWN_IDS = 100_000
#: after a kick, let a burst of new watches gather before the next long-poll (seconds)
_COALESCE = 0.01
#: after a poll that returned results, give other finishing ids a moment (seconds)
_LINGER = 0.005
#: a poller thread with nothing to watch for this long ends (and closes its connection)
_IDLE_EXIT = 10.0
#: room left for the pickle envelope around arguments kept inline (the plane's
#: ``inline_payload`` bounds the whole payload; the SDK compares the arguments alone)
_ENVELOPE_ROOM = 1024
_QUEUE_FIELDS = frozenset(f.name for f in fields(QueueSpec))
_DAEMON_FIELDS = frozenset(f.name for f in fields(DaemonRecord))

_T = TypeVar("_T")
_Origin = tuple[str, str, int]


@dataclass(frozen=True)
class Limits:
    """The plane's limits, from ``GET /v1/hello`` (these defaults until it answers)."""

    #: bytes of one request body
    max_body: int = 4 * 1024 * 1024
    #: bytes a payload or result may have inline; larger ones travel as blobs
    inline_payload: int = 256 * 1024
    #: items in one batch call
    max_batch: int = 500
    #: seconds one claim or wait may block on the server
    max_wait: float = 20.0
    #: ids in one wait (``max_wait_ids`` if hello names it, else ``max_batch``)
    max_wait_ids: int = 500

    @classmethod
    def from_hello(cls, raw: Any) -> Limits:
        got = raw if isinstance(raw, dict) else {}
        base = cls()
        batch = int(got.get("max_batch") or base.max_batch)
        return cls(
            max_body=int(got.get("max_body") or base.max_body),
            inline_payload=int(got.get("inline_payload") or base.inline_payload),
            max_batch=batch,
            max_wait=float(got.get("max_wait") or base.max_wait),
            max_wait_ids=int(got.get("max_wait_ids") or batch),
        )


@dataclass(frozen=True)
class _Answer:
    status: int
    #: lower-case names
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class _Target:
    origin: _Origin
    #: path and query, as sent in the request line
    path: str
    #: same origin as the plane: the bearer token goes along (never to S3 and the like)
    own: bool


class _HTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _nodelay(self.sock)


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _nodelay(self.sock)


def _nodelay(sock: socket.socket) -> None:
    # Requests are written in one piece and answered at once: never wait for Nagle.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _dropped(sock: socket.socket) -> bool:
    """Whether the server closed this idle keep-alive connection (or sent stray bytes).

    An idle HTTP/1.1 connection has nothing to read; readable means EOF. TLS 1.3 servers
    send session tickets after the handshake, so a TLS socket is read without blocking:
    records that carry no application data leave it healthy.
    """
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        if not isinstance(sock, ssl.SSLSocket):
            return True
        sock.setblocking(False)
        try:
            sock.recv(1)
        except ssl.SSLWantReadError:
            return False
        return True
    except (OSError, ValueError):
        return True


class _ThreadConnections:
    """One thread's keep-alive connections, by origin; closed when the thread ends."""

    __slots__ = ("__weakref__", "by_origin")

    def __init__(self) -> None:
        self.by_origin: dict[_Origin, http.client.HTTPConnection] = {}


def _close_all(conns: dict[_Origin, http.client.HTTPConnection]) -> None:
    for conn in list(conns.values()):
        conn.close()
    conns.clear()


def _batches(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for i in range(0, len(items), max(1, size)):
        yield items[i : i + max(1, size)]


class HttpTransport:
    """A remote plane at ``base_url`` (``https://host[/stage]``). Thread-safe.

    ``timeout`` bounds each request's silence (a long-poll gets its wait on top);
    ``retries`` is how many times a request is repeated after a connection error, a
    ``429`` or a ``5xx`` before the error is raised (``Unavailable`` for connections).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        retries: int = 6,
        backoff: float = 0.2,
        max_backoff: float = 10.0,
        wait_timeout: float = 20.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a plane URL looks like https://host[/stage], not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.wait_timeout = wait_timeout
        self._token = token
        self._origin: _Origin = _origin_of(parts.scheme, parts.hostname, parts.port)
        self._prefix = parts.path.rstrip("/")
        self._ssl: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._threads: weakref.WeakSet[_ThreadConnections] = weakref.WeakSet()
        self._closed = threading.Event()
        self._hello_lock = threading.Lock()
        self._hello: dict[str, Any] | None = None
        self._limits = Limits()
        self._offset = 0.0
        self._known: OrderedDict[str, None] = OrderedDict()
        self._uploads: dict[str, str] = {}
        self._watches = _Watches(self)

    def __repr__(self) -> str:
        return f"HttpTransport({self.base_url!r})"

    # ------------------------------------------------------------------ hello, clock
    def hello(self, *, refresh: bool = False) -> dict[str, Any]:
        """``GET /v1/hello`` (cached): server, version, limits, identity, workers.

        Also measures the offset of the plane's clock (its ``time`` field, else the
        ``Date`` header to the second) from this machine's.
        """
        cached = self._hello
        if cached is not None and not refresh:
            return cached
        with self._hello_lock:
            if self._hello is not None and not refresh:
                return self._hello
            sent = time.time()
            answer = self._call_raw("GET", self._target("/v1/hello"), None)
            received = time.time()
            hello = _decode_map(answer)
            middle = (sent + received) / 2
            server_time = hello.get("time")
            if isinstance(server_time, int | float) and not isinstance(server_time, bool):
                self._offset = float(server_time) - middle
            else:
                self._offset = _date_offset(answer.headers.get("date"), middle)
            self._limits = Limits.from_hello(hello.get("limits"))
            self._hello = hello
            return hello

    @property
    def limits(self) -> Limits:
        self.hello()
        return self._limits

    def now(self) -> float:
        self.hello()
        return time.time() + self._offset

    def inline_limit(self) -> int:
        """Bytes of arguments or result kept inline: the plane's ``inline_payload``,
        less room for the envelope around them."""
        return max(0, self.limits.inline_payload - _ENVELOPE_ROOM)

    # ------------------------------------------------------------------ queues
    def ensure_queue(
        self, spec: QueueSpec, *, create: bool = True, check: Iterable[str] = ()
    ) -> QueueSpec:
        body: dict[str, Any] = {"name": spec.name}
        body.update({k: v for k, v in spec.settings().items() if v is not None})
        if not spec.delete_when_drained:
            del body["delete_when_drained"]  # not in the documented body; False is the default
        body["create"] = create
        body["check"] = list(check)
        return _spec(self._call("POST", "/v1/queues", body)["queue"])

    def update_queue(self, name: str, **settings: Any) -> QueueSpec:
        return _spec(self._call("PATCH", f"/v1/queues/{_seg(name)}", settings)["queue"])

    def delete_queue(self, name: str, *, force: bool = False) -> int:
        query = {"force": "true"} if force else None
        return int(self._call("DELETE", f"/v1/queues/{_seg(name)}", query=query)["deleted"])

    def list_queues(self) -> list[dict[str, Any]]:
        return [
            {
                "spec": _spec(q),
                "last_activity": q.get("last_activity"),
                "counts": _counts(q.get("counts")),
            }
            for q in self._call("GET", "/v1/queues")["queues"]
        ]

    def prune_queues(self, older_than: float) -> list[str]:
        answer = self._call("POST", "/v1/queues/prune", {"older_than": older_than})
        return [str(n) for n in answer["removed"]]

    def counts(self, name: str) -> dict[str, int]:
        """Counts by public state; a queue that does not exist counts zero (as embedded)."""
        try:
            answer = self._call("GET", f"/v1/queues/{_seg(name)}")
        except QueueNotFound:
            return _counts(None)
        queue = answer.get("queue") or {}
        return _counts(answer.get("counts", queue.get("counts")))

    # ------------------------------------------------------------------ invocations
    def submit(self, subs: Sequence[Submission]) -> list[str]:
        """Submit in as few calls as ``max_batch`` and ``max_body`` allow.

        Each call is idempotent on the ids, so one retried after a lost answer (or a
        whole submit repeated) never makes a second invocation.
        """
        items = [_submission(s) for s in subs]
        limits = self.limits
        ids: list[str] = []
        for chunk in _size_batches(items, limits.max_batch, limits.max_body):
            ids.extend(
                str(i) for i in self._call("POST", "/v1/invocations", {"invocations": chunk})["ids"]
            )
        self._remember(ids)
        return ids

    def get(self, inv_id: str) -> Invocation:
        view = self._call("GET", f"/v1/invocations/{_seg(inv_id)}")["invocation"]
        self._remember([inv_id])
        return _invocation(view, self.now())

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        """The records of the ids that exist (unknown ones are left out, as embedded)."""
        out = []
        for inv_id in dict.fromkeys(ids):
            with contextlib.suppress(UnknownInvocation):
                out.append(self.get(inv_id))
        return out

    def watch(
        self, ids: Sequence[str], callback: Callable[[Invocation], None]
    ) -> Callable[[], None]:
        """Call ``callback(record)`` once per id when it is finished.

        Ids this transport has not seen before are checked at once with one zero-second
        wait: an unknown one raises :class:`UnknownInvocation` before anything is
        registered, and finished ones fire from this thread. The rest is awaited by the
        transport's shared long-poll. Returns a function that removes the watch.
        """
        ids = list(dict.fromkeys(ids))
        fresh = [i for i in ids if not self._is_known(i)]
        finished: list[Invocation] = []
        for chunk in _batches(fresh, self.limits.max_wait_ids):
            finished.extend(self._wait(list(chunk), 0.0))
        self._remember(fresh)
        return self._watches.add(ids, callback, finished)

    def cancel(self, inv_id: str) -> State:
        return State(self._call("POST", f"/v1/invocations/{_seg(inv_id)}/cancel")["state"])

    def set_priority(self, inv_id: str, priority: float) -> Invocation:
        answer = self._call("PATCH", f"/v1/invocations/{_seg(inv_id)}", {"priority": priority})
        return _invocation(answer["invocation"], self.now())

    def retry(self, inv_id: str) -> Invocation:
        answer = self._call("POST", f"/v1/invocations/{_seg(inv_id)}/retry")
        return _invocation(answer["invocation"], self.now())

    def list_invocations(
        self, queue: str, state: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Invocation]:
        """A queue's invocations by id after the id ``after`` (views carry no result)."""
        query = {"queue": queue, "limit": str(limit)}
        if state is not None:
            query["state"] = state
        if after is not None:
            query["cursor"] = after
        answer = self._call("GET", "/v1/invocations", query=query)
        now = self.now()
        return [_invocation(v, now) for v in answer.get("invocations") or ()]

    def _wait(self, ids: list[str], timeout: float) -> list[Invocation]:
        answer = self._call(
            "POST", "/v1/invocations/wait", {"ids": ids, "timeout": timeout}, wait=timeout
        )
        now = self.now()
        return [_invocation(v, now) for v in answer.get("invocations") or ()]

    # ------------------------------------------------------------------ workers
    def claim(
        self,
        queues: Sequence[str],
        worker: str,
        *,
        limit: int = 1,
        wait: float = 0.0,
        lease_seconds: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Claim]:
        """Lease up to ``limit`` invocations, waiting up to ``wait`` seconds for work.

        The server holds each call up to ``max_wait``; longer waits are several calls.
        With ``should_stop`` a call waits at most 2 s so a stop is seen soon.
        """
        if limit < 1:
            raise InvalidRequest("claim limit must be at least 1")
        deadline = time.monotonic() + max(0.0, wait)
        cap = self.limits.max_wait if should_stop is None else min(2.0, self.limits.max_wait)
        while True:
            chunk = max(0.0, min(deadline - time.monotonic(), cap))
            body: dict[str, Any] = {
                "queues": list(queues),
                "worker": worker,
                "limit": limit,
                "wait": chunk,
            }
            if lease_seconds is not None:
                body["lease_seconds"] = lease_seconds
            started = time.monotonic()
            answer = self._call("POST", "/v1/claims", body, wait=chunk)
            claims = [_claim(c) for c in answer.get("claims") or ()]
            remaining = deadline - time.monotonic()
            if claims or remaining <= 0 or (should_stop is not None and should_stop()):
                return claims
            if time.monotonic() - started < chunk / 2:
                # The server answered early and empty: do not spin on it.
                self._closed.wait(min(0.1, remaining))

    def heartbeat(
        self, inv_id: str, lease_token: str, *, lease_seconds: float | None = None
    ) -> HeartbeatAnswer:
        body: dict[str, Any] = {"leases": [{"id": inv_id, "lease_token": lease_token}]}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        item = _only_answer(self._call("POST", "/v1/heartbeats", body))
        expires = item.get("lease_expires_at")
        return HeartbeatAnswer(
            id=str(item.get("id", inv_id)),
            ok=bool(item.get("ok")),
            cancel=bool(item.get("cancel")),
            lease_expires_at=None if expires is None else float(expires),
        )

    def complete(self, inv_id: str, lease_token: str, result: bytes) -> None:
        """Record the result; raises the item's error (``LeaseLost``, ...) if refused."""
        body = {"results": [{"id": inv_id, "lease_token": lease_token, "result": result}]}
        _item_ok(_only_answer(self._call("POST", "/v1/completions", body)))

    def fail(
        self, inv_id: str, lease_token: str, error: dict[str, Any], *, retryable: bool = True
    ) -> State:
        item = {"id": inv_id, "lease_token": lease_token, "error": error, "retryable": retryable}
        answer = _item_ok(_only_answer(self._call("POST", "/v1/failures", {"failures": [item]})))
        return State(answer["state"])

    def release(self, inv_id: str, lease_token: str) -> None:
        """Hand a claim back untried; raises the item's error (``LeaseLost``)."""
        body = {"leases": [{"id": inv_id, "lease_token": lease_token}]}
        _item_ok(_only_answer(self._call("POST", "/v1/releases", body)))

    def report_progress(
        self, inv_id: str, lease_token: str, fraction: float, message: str | None = None
    ) -> None:
        body = {"id": inv_id, "lease_token": lease_token, "fraction": fraction, "message": message}
        self._call("POST", "/v1/progress", body)

    def append_logs(
        self, inv_id: str, lease_token: str, chunks: Sequence[tuple[int, str, str]]
    ) -> None:
        """Send output chunks, ``max_batch`` a call (a resent chunk is kept once)."""
        rows = [[n, stream, text] for n, stream, text in chunks]
        for batch in _size_batches(rows, self.limits.max_batch, self.limits.max_body):
            body = {"id": inv_id, "lease_token": lease_token, "chunks": batch}
            self._call("POST", "/v1/logs", body)

    def read_logs(self, inv_id: str, after: int = 0, limit: int = 1000) -> list[LogEntry]:
        query = {"after": str(after), "limit": str(limit)}
        answer = self._call("GET", f"/v1/invocations/{_seg(inv_id)}/logs", query=query)
        return [_log_entry(e) for e in answer.get("entries") or ()]

    # ------------------------------------------------------------------ daemons
    def register_daemon(
        self,
        name: str,
        *,
        daemon_id: str | None = None,
        queues: Sequence[str] = (),
        concurrency: int = 1,
        python: str = "",
        pickle_protocols: Sequence[int] = (),
        host: str = "",
    ) -> DaemonRecord:
        body: dict[str, Any] = {
            "name": name,
            "queues": list(queues),
            "concurrency": concurrency,
            "python": python,
            "pickle_protocols": list(pickle_protocols),
            "host": host,
        }
        if daemon_id is not None:
            body["id"] = daemon_id
        return _daemon(self._call("POST", "/v1/daemons", body)["daemon"])

    def daemon_heartbeat(self, daemon_id: str, running: int | None = None) -> DaemonRecord:
        body = {} if running is None else {"running": running}
        path = f"/v1/daemons/{_seg(daemon_id)}/heartbeat"
        return _daemon(self._call("POST", path, body)["daemon"])

    def list_daemons(self) -> list[DaemonRecord]:
        return [_daemon(d) for d in self._call("GET", "/v1/daemons")["daemons"]]

    def update_daemon(
        self,
        daemon_id: str,
        *,
        add_queues: Sequence[str] = (),
        remove_queues: Sequence[str] = (),
        concurrency: int | None = None,
    ) -> DaemonRecord:
        body: dict[str, Any] = {
            "add_queues": list(add_queues),
            "remove_queues": list(remove_queues),
        }
        if concurrency is not None:
            body["concurrency"] = concurrency
        return _daemon(self._call("PATCH", f"/v1/daemons/{_seg(daemon_id)}", body)["daemon"])

    def drain_daemon(self, daemon_id: str) -> DaemonRecord:
        return _daemon(self._call("POST", f"/v1/daemons/{_seg(daemon_id)}/drain")["daemon"])

    # ------------------------------------------------------------------ data keys
    # Not in docs/api.md yet; these are the routes proposed for it.
    def put_data(self, key: str, digest: str) -> None:
        """Point ``key`` at an uploaded blob (``POST /v1/data``)."""
        self._call("POST", "/v1/data", {"key": key, "digest": digest})

    def data_digests(self, keys: Sequence[str]) -> dict[str, str]:
        """The digests of the keys that exist (``POST /v1/data/lookup``)."""
        found: dict[str, str] = {}
        for batch in _batches(list(keys), self.limits.max_batch):
            answer = self._call("POST", "/v1/data/lookup", {"keys": list(batch)})
            found.update({str(k): str(d) for k, d in (answer.get("digests") or {}).items()})
        return found

    def blob_url(self, digest: str) -> str:
        """A URL that serves the blob without a token (``GET /v1/blobs/{digest}/url``);
        a relative one is made absolute on this plane's base URL."""
        url = str(self._call("GET", f"/v1/blobs/{digest}/url")["url"])
        return self.base_url + url if url.startswith("/") and not url.startswith("//") else url

    # ------------------------------------------------------------------ blobs
    def missing_blobs(self, digests: Iterable[str]) -> set[str]:
        """The digests the plane lacks; their signed upload URLs are kept for put_blob."""
        wanted = list(dict.fromkeys(digests))
        missing: set[str] = set()
        for chunk in _batches(wanted, self.limits.max_batch):
            answer = self._call("POST", "/v1/blobs/missing", {"digests": list(chunk)})
            missing.update(str(d) for d in answer.get("missing") or ())
            uploads = answer.get("upload") or {}
            with self._lock:
                self._uploads.update({str(d): str(u) for d, u in uploads.items()})
        return missing

    def put_blob(self, digest: str, data: bytes) -> None:
        """Upload by the signed URL :meth:`missing_blobs` got, else ``PUT /v1/blobs``.

        A relative URL is the plane's own; an absolute one (an S3 presigned URL) is used
        as it is, without the bearer token. A signature that has run out is asked for
        again once.
        """
        if hashlib.sha256(data).hexdigest() != digest:
            raise InvalidRequest("blob digest does not match its bytes")
        with self._lock:
            url = self._uploads.pop(digest, None)
        if url is not None:
            try:
                self._blob("PUT", self._resolve(url), data)
                return
            except (Unauthorized, Forbidden):
                if digest not in self.missing_blobs([digest]):
                    return
                with self._lock:
                    url = self._uploads.pop(digest, None)
                if url is not None:
                    self._blob("PUT", self._resolve(url), data)
                    return
        self._blob("PUT", self._target(f"/v1/blobs/{digest}"), data)

    def get_blob(self, digest: str) -> bytes:
        """The blob's bytes; a redirect (to S3, say) is followed without the token."""
        return self._blob("GET", self._target(f"/v1/blobs/{digest}"), None)

    def _blob(self, method: str, target: _Target, data: bytes | None) -> bytes:
        for _ in range(4):
            headers = self._headers(target, accept="*/*")
            if data is not None:
                headers["Content-Type"] = "application/octet-stream"
            answer = self._exchange(method, target, data, headers, self.timeout)
            location = answer.headers.get("location")
            if method == "GET" and answer.status in (301, 302, 303, 307, 308) and location:
                target = self._resolve(urljoin(self._url_of(target), location))
                continue
            if not 200 <= answer.status < 300:
                raise _error(answer)
            return answer.body
        raise LakeshoreError(f"too many redirects fetching {target.path}")

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the watch threads and close every connection. Calls after it fail."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._watches.close()
        with self._lock:
            threads = list(self._threads)
        for conns in threads:
            _close_all(conns.by_origin)

    # ------------------------------------------------------------------ requests
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
        return _decode_map(self._call_raw(method, self._target(path, query), body, wait=wait))

    def _call_raw(
        self, method: str, target: _Target, body: dict[str, Any] | None, *, wait: float = 0.0
    ) -> _Answer:
        headers = self._headers(target, accept=MSGPACK)
        data = None
        if body is not None:
            data = pack(body)
            headers["Content-Type"] = MSGPACK
        answer = self._exchange(method, target, data, headers, self.timeout + wait)
        if not 200 <= answer.status < 300:
            raise _error(answer)
        return answer

    def _headers(self, target: _Target, *, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": _USER_AGENT}
        if target.own and self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _exchange(
        self,
        method: str,
        target: _Target,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
    ) -> _Answer:
        """Send with retries: connection errors, 429 and 5xx, backing off in between."""
        attempt = 0
        while True:
            if self._closed.is_set():
                raise LakeshoreError(f"{self!r} is closed")
            try:
                answer = self._once(
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
                delay = max(self._backoff(attempt), _retry_after(answer))
            attempt += 1
            self._closed.wait(delay)

    def _once(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        target: _Target,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
    ) -> _Answer:
        """One request on ``conn`` (reopened if the server dropped it); no retry."""
        if conn.sock is not None and _dropped(conn.sock):
            conn.close()
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, target.path, body=body, headers=dict(headers))
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        headers_out = {k.lower(): v for k, v in response.getheaders()}
        return _Answer(response.status, headers_out, data)

    def _conn(self, origin: _Origin) -> http.client.HTTPConnection:
        """This thread's keep-alive connection to ``origin``."""
        mine: _ThreadConnections | None = getattr(self._local, "conns", None)
        if mine is None:
            mine = _ThreadConnections()
            self._local.conns = mine
            weakref.finalize(mine, _close_all, mine.by_origin)
            with self._lock:
                self._threads.add(mine)
        conn = mine.by_origin.get(origin)
        if conn is None:
            conn = self._new_conn(origin)
            mine.by_origin[origin] = conn
        return conn

    def _new_conn(self, origin: _Origin) -> http.client.HTTPConnection:
        scheme, host, port = origin
        if scheme == "https":
            with self._lock:
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                context = self._ssl
            return _HTTPSConnection(host, port, timeout=self.timeout, context=context)
        return _HTTPConnection(host, port, timeout=self.timeout)

    def _backoff(self, attempt: int) -> float:
        """Capped exponential backoff with jitter: half fixed, half random."""
        ceiling = min(self.max_backoff, self.backoff * 2.0**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def _target(self, path: str, query: Mapping[str, str] | None = None) -> _Target:
        full = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        return _Target(self._origin, full, own=True)

    def _resolve(self, url: str) -> _Target:
        """A URL the plane handed out: ``/v1/...`` is relative to the plane's base URL."""
        if url.startswith("/") and not url.startswith("//"):
            return _Target(self._origin, self._prefix + url, own=True)
        parts = urlsplit(urljoin(self.base_url + "/", url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LakeshoreError(f"the plane handed out an unusable URL: {url!r}")
        origin = _origin_of(parts.scheme, parts.hostname, parts.port)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return _Target(origin, path, own=origin == self._origin)

    def _url_of(self, target: _Target) -> str:
        scheme, host, port = target.origin
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{port}{target.path}"

    # ------------------------------------------------------------------ known ids
    def _remember(self, ids: Iterable[str]) -> None:
        with self._lock:
            for inv_id in ids:
                self._known[inv_id] = None
                self._known.move_to_end(inv_id)
            while len(self._known) > _KNOWN_IDS:
                self._known.popitem(last=False)

    def _is_known(self, inv_id: str) -> bool:
        with self._lock:
            return inv_id in self._known


# ---------------------------------------------------------------------- result watches
class _Watch:
    """One watch over some ids; it fires once per id."""

    __slots__ = ("callback", "fired")

    def __init__(self, callback: Callable[[Invocation], None]) -> None:
        self.callback = callback
        self.fired: set[str] = set()


class _Watches:
    """Every watch of one transport, awaited by one long-poll per ``max_wait_ids`` ids.

    A poller thread long-polls ``POST /v1/invocations/wait`` with all of its ids
    (``wait_timeout``, at most ``max_wait``), fires the watches of the finished ones and
    polls again with the rest. The wait is level-triggered (it answers with what *is*
    finished), so nothing is missed between two polls.

    A watch added while a poll is in flight that does not cover it *kicks* the poller:
    the poll's socket is shut down, so the poller stops waiting at once, pauses
    ``_COALESCE`` for more new watches to gather and polls again with the whole set
    on a fresh connection. So a new id is awaited within a round trip, and a burst of
    watches (``asyncio.gather`` over many results) costs a few polls, not one each.
    """

    def __init__(self, transport: HttpTransport) -> None:
        self.transport = transport
        self.cond = threading.Condition()
        self.closed = False
        self.entries: dict[str, list[_Watch]] = {}
        self.owner: dict[str, _Poller] = {}
        self.pollers: list[_Poller] = []

    def add(
        self, ids: list[str], callback: Callable[[Invocation], None], finished: list[Invocation]
    ) -> Callable[[], None]:
        entry = _Watch(callback)
        done = {rec.id: rec for rec in finished if rec.state in FINISHED}
        due: list[tuple[_Watch, Invocation]] = []
        with self.cond:
            if self.closed:
                raise LakeshoreError(f"{self.transport!r} is closed")
            kick: set[_Poller] = set()
            for inv_id in ids:
                if inv_id in done:
                    entry.fired.add(inv_id)
                    due.append((entry, done[inv_id]))
                    continue
                self.entries.setdefault(inv_id, []).append(entry)
                if inv_id not in self.owner:
                    poller = self._poller_with_room()
                    poller.ids.add(inv_id)
                    self.owner[inv_id] = poller
                    if poller.inflight is not None and inv_id not in poller.inflight:
                        kick.add(poller)
            for poller in kick:
                poller.kick()
            self.cond.notify_all()
        _fire(due)
        self.deliver(done.values())  # other watches of the same ids fire too, as embedded

        def unwatch() -> None:
            with self.cond:
                for inv_id in ids:
                    entries = self.entries.get(inv_id)
                    if entries and entry in entries:
                        entries.remove(entry)
                        if not entries:
                            self._forget(inv_id)

        return unwatch

    def deliver(self, records: Iterable[Invocation]) -> None:
        due: list[tuple[_Watch, Invocation]] = []
        with self.cond:
            for rec in records:
                if rec.state not in FINISHED:
                    continue
                for entry in self.entries.get(rec.id, ()):
                    if rec.id not in entry.fired:
                        entry.fired.add(rec.id)
                        due.append((entry, rec))
                self._forget(rec.id)
        _fire(due)

    def drop(self, ids: Iterable[str]) -> None:
        """Stop polling for ids the plane no longer has (their watches never fire)."""
        with self.cond:
            for inv_id in ids:
                self._forget(inv_id)

    def _forget(self, inv_id: str) -> None:
        self.entries.pop(inv_id, None)
        poller = self.owner.pop(inv_id, None)
        if poller is not None:
            poller.ids.discard(inv_id)

    def _poller_with_room(self) -> _Poller:
        cap = self.transport.limits.max_wait_ids
        for poller in self.pollers:
            if len(poller.ids) < cap:
                return poller
        poller = _Poller(self)
        self.pollers.append(poller)
        poller.thread.start()
        return poller

    def stopping(self) -> bool:
        return self.closed

    def sleep(self, seconds: float) -> None:
        """Sleep, cut short only by close()."""
        deadline = time.monotonic() + seconds
        with self.cond:
            while not self.closed and (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            pollers = list(self.pollers)
            for poller in pollers:
                poller.kick()
            self.cond.notify_all()
        for poller in pollers:
            if poller.thread is not threading.current_thread():
                poller.thread.join(timeout=5)


def _fire(due: list[tuple[_Watch, Invocation]]) -> None:
    for entry, rec in due:
        try:
            entry.callback(rec)
        except Exception:
            log.exception("a result watch callback raised")


class _Poller:
    """One thread long-polling one shard of the watched ids over its own connection."""

    def __init__(self, hub: _Watches) -> None:
        self.hub = hub
        self.ids: set[str] = set()
        #: the ids of the poll in flight, None between polls
        self.inflight: frozenset[str] | None = None
        self.kicked = False
        self.conn: http.client.HTTPConnection | None = None
        self.thread = threading.Thread(target=self._run, name="lakeshore-watch", daemon=True)

    def kick(self) -> None:
        """End the poll in flight now (called with the hub's lock held)."""
        if self.inflight is None or self.kicked:
            return
        self.kicked = True
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            # The plain socket's shutdown, also under TLS: the reader sees EOF at once.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            if self.conn is not None:
                self.conn.close()

    def _loop(self) -> None:
        hub, transport = self.hub, self.hub.transport
        failures = 0
        while True:
            with hub.cond:
                idle_until = time.monotonic() + _IDLE_EXIT
                while not self.ids and not hub.closed:
                    left = idle_until - time.monotonic()
                    if left <= 0:
                        hub.pollers.remove(self)
                        return
                    hub.cond.wait(left)
                if hub.closed:
                    return
            timeout = min(transport.wait_timeout, transport.limits.max_wait)
            try:
                conn = self._connect()
            except Exception as exc:
                failures = self._failed(exc, failures)
                continue
            # Snapshot only once connected: a kick can then always reach the socket.
            with hub.cond:
                if hub.stopping():
                    return
                snapshot = frozenset(self.ids)
                if not snapshot:
                    continue
                self.inflight, self.kicked = snapshot, False
            try:
                records = self._poll(conn, sorted(snapshot), timeout)
            except Exception as exc:
                with hub.cond:
                    kicked, self.inflight = self.kicked, None
                conn.close()
                if kicked:
                    failures = 0
                    hub.sleep(_COALESCE)
                elif isinstance(exc, UnknownInvocation):
                    self._recheck(snapshot)
                else:
                    failures = self._failed(exc, failures)
                continue
            with hub.cond:
                kicked, self.inflight = self.kicked, None
            if kicked:
                conn.close()  # the answer made it, but the socket was shut down after it
            failures = 0
            hub.deliver(records)
            if records:
                with hub.cond:
                    hub.cond.wait(_LINGER)

    def _failed(self, exc: Exception, failures: int) -> int:
        """Back off after a failed poll (the watch has nobody to raise to: keep trying)."""
        failures += 1
        if failures == 3:
            log.warning("waiting for results from %r keeps failing: %s", self.hub.transport, exc)
        self.hub.sleep(max(self.hub.transport._backoff(min(failures, 10)), 1.0))
        return failures

    def _connect(self) -> http.client.HTTPConnection:
        transport = self.hub.transport
        if self.conn is None:
            self.conn = transport._new_conn(transport._origin)
        if self.conn.sock is not None and _dropped(self.conn.sock):
            self.conn.close()
        if self.conn.sock is None:
            self.conn.connect()
        return self.conn

    def _poll(
        self, conn: http.client.HTTPConnection, ids: list[str], timeout: float
    ) -> list[Invocation]:
        transport = self.hub.transport
        target = transport._target("/v1/invocations/wait")
        headers = transport._headers(target, accept=MSGPACK)
        headers["Content-Type"] = MSGPACK
        body = pack({"ids": ids, "timeout": timeout})
        answer = transport._once(conn, "POST", target, body, headers, transport.timeout + timeout)
        if not 200 <= answer.status < 300:
            raise _error(answer)
        now = transport.now()
        return [_invocation(v, now) for v in _decode_map(answer).get("invocations") or ()]

    def _recheck(self, ids: frozenset[str]) -> None:
        """A wait refused an unknown id (a queue deleted with force): find it, drop it."""
        transport, gone, finished = self.hub.transport, [], []
        for inv_id in sorted(ids):
            try:
                rec = transport.get(inv_id)
            except UnknownInvocation:
                gone.append(inv_id)
                continue
            except LakeshoreError:
                continue
            if rec.state in FINISHED:
                finished.append(rec)
        self.hub.drop(gone)
        self.hub.deliver(finished)


# ---------------------------------------------------------------------- wire shapes
def _origin_of(scheme: str, host: str, port: int | None) -> _Origin:
    return (scheme, host, port or (443 if scheme == "https" else 80))


def _seg(value: str) -> str:
    """One path segment (a queue name or an id) with everything else escaped."""
    return quote(value, safe="")


def _decode(answer: _Answer) -> Any:
    media = answer.headers.get("content-type", "").split(";")[0].strip().lower()
    if not answer.body:
        return {}
    if media == "application/json":
        return json.loads(answer.body)
    return msgpack.unpackb(answer.body, raw=False)


def _decode_map(answer: _Answer) -> dict[str, Any]:
    try:
        obj = _decode(answer)
    except Exception as exc:
        raise LakeshoreError(f"the plane answered a malformed body: {exc}") from None
    if not isinstance(obj, dict):
        raise LakeshoreError("the plane answered something other than a map")
    return obj


def _error(answer: _Answer) -> LakeshoreError:
    """The exception an error answer stands for: its wire code, else its status."""
    try:
        obj = _decode(answer)
    except Exception:
        obj = None
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        return from_wire(err["code"], str(err.get("message") or ""))
    if answer.status >= 500:
        cls: type[LakeshoreError] = Unavailable
    else:
        cls = _BY_STATUS.get(answer.status, LakeshoreError)
    text = answer.body[:200].decode("utf-8", "replace").strip()
    return cls(f"HTTP {answer.status} from the plane" + (f": {text}" if text else ""))


def _retry_after(answer: _Answer) -> float:
    value = answer.headers.get("retry-after")
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 0.0
    return min(max(0.0, seconds), _MAX_RETRY_AFTER)


def _date_offset(value: str | None, middle: float) -> float:
    """The clock offset a ``Date`` header tells, when it is more than its resolution."""
    if not value:
        return 0.0
    try:
        server = parsedate_to_datetime(value).timestamp() + 0.5
    except (TypeError, ValueError):
        return 0.0
    offset = server - middle
    return offset if abs(offset) > 1.0 else 0.0


def _size_batches(items: Sequence[Any], count: int, max_body: int) -> Iterator[list[Any]]:
    """Items in runs of at most ``count`` whose encoding stays within ``max_body``."""
    budget = max(1, max_body - 1024)  # room for the envelope around the list
    run: list[Any] = []
    size = 0
    for item in items:
        n = len(pack(item))
        if run and (len(run) >= count or size + n > budget):
            yield run
            run, size = [], 0
        run.append(item)
        size += n
    if run:
        yield run


def _submission(sub: Submission) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": sub.id,
        "queue": sub.queue,
        "payload": sub.payload,
        "priority": sub.priority,
        "delay": sub.delay,
    }
    if sub.timeout is not None:
        out["timeout"] = sub.timeout
    if sub.max_attempts is not None:
        out["max_attempts"] = sub.max_attempts
    if sub.retry is not None:
        out["retry"] = sub.retry.to_dict()
    return out


def _spec(raw: Mapping[str, Any]) -> QueueSpec:
    return QueueSpec(**{k: v for k, v in raw.items() if k in _QUEUE_FIELDS})


def _counts(raw: Any) -> dict[str, int]:
    got = raw if isinstance(raw, dict) else {}
    return {s.value: int(got.get(s.value) or 0) for s in State}


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _invocation(view: Mapping[str, Any], now: float) -> Invocation:
    """A view as the plane's record. ``scheduled`` is kept as pending with its
    ``available_at``, as stores keep it (``public_state`` says scheduled again)."""
    state = State(view["state"])
    if state is State.SCHEDULED:
        state = State.PENDING
    expires_at = _opt_float(view.get("expires_at"))
    if view.get("expired") and (expires_at is None or expires_at > now):
        expires_at = now  # the plane said expired: do not let clock skew say otherwise
    result = view.get("result")
    return Invocation(
        id=str(view["id"]),
        queue=str(view.get("queue") or ""),
        state=state,
        payload=None,
        request_digest="",
        order_key="",
        priority=float(view.get("priority") or 0.0),
        available_at=float(view.get("available_at") or 0.0),
        created_at=float(view.get("created_at") or 0.0),
        max_attempts=int(view.get("max_attempts") or 1),
        timeout=_opt_float(view.get("timeout")),
        attempt=int(view.get("attempt") or 0),
        worker=view.get("worker"),
        started_at=_opt_float(view.get("started_at")),
        finished_at=_opt_float(view.get("finished_at")),
        expires_at=expires_at,
        result=bytes(result) if result is not None else None,
        error=view.get("error"),
        progress=_opt_float(view.get("progress")),
        progress_message=view.get("progress_message"),
    )


def _claim(raw: Mapping[str, Any]) -> Claim:
    return Claim(
        id=str(raw["id"]),
        queue=str(raw["queue"]),
        payload=bytes(raw["payload"]),
        lease_token=str(raw["lease_token"]),
        lease_expires_at=float(raw["lease_expires_at"]),
        attempt=int(raw["attempt"]),
        timeout=_opt_float(raw.get("timeout")),
    )


def _log_entry(raw: Mapping[str, Any]) -> LogEntry:
    return LogEntry(
        seq=int(raw["seq"]),
        stream=str(raw["stream"]),
        text=str(raw["text"]),
        at=float(raw["at"]),
        attempt=int(raw["attempt"]),
    )


def _daemon(raw: Mapping[str, Any]) -> DaemonRecord:
    return DaemonRecord(**{k: v for k, v in raw.items() if k in _DAEMON_FIELDS})


def _only_answer(answer: Mapping[str, Any]) -> dict[str, Any]:
    answers = answer.get("answers")
    if not isinstance(answers, list) or len(answers) != 1 or not isinstance(answers[0], dict):
        raise LakeshoreError("the plane answered a one-item batch without exactly one answer")
    item: dict[str, Any] = answers[0]
    return item


def _item_ok(item: dict[str, Any]) -> dict[str, Any]:
    """The answer of one batch item, or the exception its ``error`` stands for."""
    if item.get("ok"):
        return item
    err = item.get("error") or {}
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    raise from_wire(str(code or "error"), str(message or "refused by the plane"))
