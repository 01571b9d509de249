"""The HTTP client (``HttpTransport``) against real loopback servers.

Most tests run against a tiny HTTP server started here (``http.server`` on 127.0.0.1:0)
that serves just the routes they use over an embedded plane, and can be told to drop a
connection, answer 503 or 429, or hand out signed URLs of another origin. It counts
connections and requests, so keep-alive, retries and watch coalescing are measured, not
assumed. The last tests run the SDK through the client against ``lakeshore serve``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs

import msgpack
import pytest
from support import wait_for

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.errors import (
    IdempotencyConflict,
    InvalidRequest,
    LakeshoreError,
    LeaseLost,
    QueueNotFound,
    Throttled,
    Unauthorized,
    Unavailable,
    UnknownInvocation,
)
from dreamlake.lakeshore.http import HttpTransport
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.plane.model import (
    FINISHED,
    Invocation,
    QueueSpec,
    RetryPolicy,
    State,
    Submission,
)
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.wire import encode_result, pack

TOKEN = "lks_test"

# --- the loopback server ----------------------------------------------------------------


@dataclass
class Fault:
    """What to do to the next request matching ``method`` and ``path`` (a regex)."""

    method: str
    path: str
    #: "drop" (close, no answer), "drop_after" (do the work, close, no answer),
    #: "status" (answer ``status`` with ``code``), "html" (a proxy's 502 page)
    kind: str
    status: int = 503
    code: str = "unavailable"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


class Loopback:
    """A real HTTP/1.1 server with keep-alive over an embedded plane."""

    def __init__(self, **limits: Any) -> None:
        self.plane = Plane(SqliteStore(":memory:"))
        self.limits = {
            "max_body": 4 * 1024 * 1024,
            "inline_payload": 256 * 1024,
            "max_batch": 500,
            "max_wait": 20.0,
            **limits,
        }
        self.clock_offset = 0.0
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self.connections = 0
        #: close every connection after its answer, without saying so (an idle timeout)
        self.close_silently = False
        #: digest → URL handed out by /v1/blobs/missing (else a relative signed URL)
        self.upload_urls: dict[str, str] = {}
        #: digest → where GET /v1/blobs/{digest} redirects
        self.redirects: dict[str, str] = {}
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.httpd.loopback = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def requests(self, method: str, path: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.method == method and re.fullmatch(path, s.path)]

    def close(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()
            self.plane.close()

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method == method and re.fullmatch(fault.path, path):
                    self.faults.remove(fault)
                    return fault
        return None

    # --- routes ------------------------------------------------------------------------
    def route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        plane = self.plane
        now = plane.now()
        parts = path.strip("/").split("/")[1:]  # after "v1"
        match method, parts:
            case "GET", ["hello"]:
                return {
                    "server": "loopback",
                    "time": now + self.clock_offset,
                    "limits": self.limits,
                }
            case "POST", ["queues"]:
                create, check = body.pop("create", True), body.pop("check", [])
                spec = plane.ensure_queue(QueueSpec(**body), create=create, check=check)
                return {"queue": _spec_view(spec)}
            case "GET", ["queues", name]:
                spec = plane.get_queue(name)
                return {"queue": {**_spec_view(spec), "counts": plane.counts(name)}}
            case "POST", ["invocations"]:
                subs = [_sub(s) for s in body["invocations"]]
                return {"ids": plane.submit(subs)}
            case "POST", ["invocations", "wait"]:
                done = plane.wait(body["ids"], min(body["timeout"], self.limits["max_wait"]))
                return {"invocations": [_view(r, plane.now()) for r in done]}
            case "GET", ["invocations", inv_id]:
                return {"invocation": _view(plane.get(inv_id), now)}
            case "POST", ["invocations", inv_id, "cancel"]:
                return {"state": plane.cancel(inv_id).value}
            case "POST", ["claims"]:
                wait = min(body.get("wait", 0.0), self.limits["max_wait"])
                claims = plane.claim(body["queues"], body["worker"], limit=body["limit"], wait=wait)
                return {"claims": [asdict(c) for c in claims]}
            case "POST", ["heartbeats"]:
                return {
                    "answers": [
                        asdict(plane.heartbeat(x["id"], x["lease_token"])) for x in body["leases"]
                    ]
                }
            case "POST", ["completions"]:
                return {"answers": [_item(plane.complete, x, x["result"]) for x in body["results"]]}
            case "POST", ["failures"]:
                return {"answers": [_item(plane.fail, x, x["error"]) for x in body["failures"]]}
            case "POST", ["blobs", "missing"]:
                missing = sorted(plane.missing_blobs(body["digests"]))
                urls = {d: self.upload_urls.get(d, f"/v1/blobs/{d}?sig=ok") for d in missing}
                return {"missing": missing, "upload": urls}
            case "PUT", ["blobs", digest]:
                plane.put_blob(digest, body)
                return None
            case "GET", ["blobs", digest]:
                return plane.get_blob(digest)
        raise dls.LakeshoreError(f"no route {method} {path}")


def _spec_view(spec: QueueSpec) -> dict[str, Any]:
    return {"name": spec.name, **spec.settings()}


def _sub(raw: dict[str, Any]) -> Submission:
    retry = raw.pop("retry", None)
    return Submission(**raw, retry=RetryPolicy(**retry) if retry else None)


def _item(fn: Callable[..., Any], x: dict[str, Any], arg: Any) -> dict[str, Any]:
    try:
        state = fn(x["id"], x["lease_token"], arg)
    except LakeshoreError as exc:
        return {"id": x["id"], "ok": False, "error": {"code": exc.code, "message": str(exc)}}
    return {"id": x["id"], "ok": True, "state": state.value if state else None, "error": None}


def _view(rec: Invocation, now: float) -> dict[str, Any]:
    view = {
        "id": rec.id,
        "queue": rec.queue,
        "state": rec.public_state(now).value,
        "attempt": rec.attempt,
        "max_attempts": rec.max_attempts,
        "priority": rec.priority,
        "created_at": rec.created_at,
        "available_at": rec.available_at,
        "started_at": rec.started_at,
        "finished_at": rec.finished_at,
        "expires_at": rec.expires_at,
        "expired": rec.is_expired(now),
        "worker": rec.worker,
        "timeout": rec.timeout,
        "error": rec.error,
    }
    if rec.result is not None:
        view["result"] = rec.result
    return view


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # http.server writes headers and body apart: without this, Nagle holds the body
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.loop.lock:
            self.loop.connections += 1

    @property
    def loop(self) -> Loopback:
        return self.server.loopback  # type: ignore[attr-defined,no-any-return]

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        loop = self.loop
        close_after = loop.close_silently  # as it was when the request came
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        is_msgpack = self.headers.get("Content-Type") == "application/msgpack"
        body = msgpack.unpackb(raw) if raw and is_msgpack else raw
        with loop.lock:
            loop.seen.append(Seen(method, path, query, dict(self.headers), body))
        fault = loop.take_fault(method, path)
        if fault is not None and fault.kind == "drop":
            self.close_connection = True
            return
        if fault is not None and fault.kind in ("status", "html"):
            text = b"<html>502 Bad Gateway</html>"
            error = pack({"error": {"code": fault.code, "message": "injected"}})
            ctype = "text/html" if fault.kind == "html" else "application/msgpack"
            self._send(fault.status, text if fault.kind == "html" else error, ctype, fault.headers)
            return
        if self.headers.get("Authorization") != f"Bearer {TOKEN}" and "sig=" not in query:
            self._send(401, pack({"error": {"code": "unauthorized", "message": "no"}}))
            return
        if path.startswith("/v1/blobs/") and method == "GET":
            target = loop.redirects.get(path.rsplit("/", 1)[1])
            if target is not None:
                self._send(307, b"", "text/plain", {"Location": target})
                return
        try:
            answer = loop.route(method, path, {k: v[0] for k, v in parse_qs(query).items()}, body)
            status = 200 if answer is not None else 204
        except LakeshoreError as exc:
            answer, status = {"error": {"code": exc.code, "message": str(exc)}}, exc.status
        if fault is not None and fault.kind == "drop_after":
            self.close_connection = True
            return
        if isinstance(answer, bytes):
            self._send(status, answer, "application/octet-stream")
        else:
            self._send(status, pack(answer) if answer is not None else b"")
        if close_after:
            self.close_connection = True

    def _send(
        self,
        status: int,
        data: bytes,
        ctype: str = "application/msgpack",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)


class BlobStore(BaseHTTPRequestHandler):
    """Another origin (an S3 stand-in): keeps PUT bodies, serves them back."""

    protocol_version = "HTTP/1.1"
    blobs: ClassVar[dict[str, bytes]] = {}
    headers_seen: ClassVar[list[dict[str, str]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:
        self.headers_seen.append(dict(self.headers))
        self.blobs[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.headers_seen.append(dict(self.headers))
        data = self.blobs.get(self.path, b"")
        self.send_response(200 if self.path in self.blobs else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def loopback() -> Iterator[Callable[..., Loopback]]:
    made: list[Loopback] = []

    def make(**limits: Any) -> Loopback:
        made.append(Loopback(**limits))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def client() -> Iterator[Callable[..., HttpTransport]]:
    made: list[HttpTransport] = []

    def make(server: Loopback, **options: Any) -> HttpTransport:
        options = {"backoff": 0.01, "max_backoff": 0.05, **options}
        made.append(HttpTransport(server.url, options.pop("token", TOKEN), **options))
        return made[-1]

    yield make
    for transport in made:
        transport.close()


def _submit(t: HttpTransport, n: int = 1, queue: str = "q", **extra: Any) -> list[str]:
    t.ensure_queue(QueueSpec(queue))
    payload = pack({"v": 1, "kind": "ref", "target": "math:sqrt", "args": [4], "kwargs": {}})
    subs = [Submission(id=dls_id(), queue=queue, payload=payload, **extra) for _ in range(n)]
    return t.submit(subs)


def dls_id() -> str:
    from dreamlake.lakeshore.submit import new_id

    return new_id()


def _finish(plane: Plane, queue: str = "q", n: int = 1) -> None:
    """Run ``n`` pending invocations to success directly on the plane."""
    result, _ = encode_result(2.0, prefer_msgpack=True)
    for claim in plane.claim([queue], "w", limit=n):
        plane.complete(claim.id, claim.lease_token, result)


# --- requests, keep-alive ---------------------------------------------------------------


def test_calls_are_msgpack_with_the_bearer_token(loopback: Any, client: Any) -> None:
    # Given a client of a plane
    server = loopback()
    t = client(server)
    # When it submits
    (inv_id,) = _submit(t)
    # Then the request was msgpack both ways with the token, and the id is the SDK's own
    (sent,) = server.requests("POST", "/v1/invocations")
    assert sent.headers["Content-Type"] == "application/msgpack"
    assert sent.headers["Accept"] == "application/msgpack"
    assert sent.headers["Authorization"] == f"Bearer {TOKEN}"
    assert sent.body["invocations"][0]["id"] == inv_id
    assert t.get(inv_id).state is State.PENDING


def test_one_keep_alive_connection_per_thread(loopback: Any, client: Any) -> None:
    # Given a client
    server = loopback()
    t = client(server)
    _submit(t)
    # When 20 calls are made in this thread, then 10 in each of 4 threads
    for _ in range(20):
        t.counts("q")
    assert server.connections == 1
    threads = [
        threading.Thread(target=lambda: [t.counts("q") for _ in range(10)]) for _ in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    # Then each thread used one connection for all its calls
    assert server.connections == 5


def test_a_connection_the_server_dropped_is_reopened(loopback: Any, client: Any) -> None:
    # Given a server that closes each connection after answering, without saying so
    server = loopback()
    t = client(server, retries=0)  # no retry: the client must notice before sending
    _submit(t)
    server.close_silently = True
    # When the client calls again and again
    for _ in range(3):
        time.sleep(0.05)
        assert t.counts("q")["pending"] == 1
    # Then none failed: each call after the first silent close reopened the connection
    assert server.connections == 3


@pytest.mark.parametrize("kind", ["drop", "drop_after"])
def test_a_dropped_submit_is_retried_and_counted_once(
    loopback: Any, client: Any, kind: str
) -> None:
    # Given a server that drops the connection of the next submit (before or after doing it)
    server = loopback()
    t = client(server)
    t.ensure_queue(QueueSpec("q"))
    server.faults.append(Fault("POST", "/v1/invocations", kind))
    # When the client submits
    (inv_id,) = _submit(t)
    # Then it retried with the same id: one invocation, whatever the first attempt did
    assert len(server.requests("POST", "/v1/invocations")) == 2
    assert server.plane.counts("q")["pending"] == 1
    assert t.get(inv_id).id == inv_id


def test_503_and_502_pages_are_retried(loopback: Any, client: Any) -> None:
    server = loopback()
    t = client(server)
    _submit(t)
    server.faults += [
        Fault("GET", "/v1/queues/q", "status", 503, "unavailable"),
        Fault("GET", "/v1/queues/q", "html", 502),
    ]
    assert t.counts("q")["pending"] == 1
    assert len(server.requests("GET", "/v1/queues/q")) == 3


def test_429_waits_for_its_retry_after(loopback: Any, client: Any) -> None:
    # Given a server that throttles the next call for one second
    server = loopback()
    t = client(server)
    _submit(t)
    server.faults.append(
        Fault("GET", "/v1/queues/q", "status", 429, "throttled", {"Retry-After": "1"})
    )
    # When the client calls
    started = time.monotonic()
    counts = t.counts("q")
    # Then it waited as told, then succeeded
    assert time.monotonic() - started >= 0.95
    assert counts["pending"] == 1


def test_retries_end_with_the_error(loopback: Any, client: Any) -> None:
    # Given a server that answers 503 (or throttles) every time
    server = loopback()
    t = client(server, retries=3)
    _submit(t)
    server.faults += [Fault("GET", "/v1/queues/q", "status", 503) for _ in range(4)]
    # Then the client tries 1 + 3 times and raises the plane's error
    with pytest.raises(Unavailable):
        t.counts("q")
    assert len(server.requests("GET", "/v1/queues/q")) == 4
    server.faults += [Fault("GET", "/v1/queues/q", "status", 429, "throttled") for _ in range(4)]
    with pytest.raises(Throttled):
        t.counts("q")


def test_an_unreachable_plane_is_unavailable(loopback: Any) -> None:
    server = loopback()
    url = server.url
    server.close()
    t = HttpTransport(url, TOKEN, retries=2, backoff=0.01)
    try:
        with pytest.raises(Unavailable, match="cannot reach the plane"):
            t.hello()
    finally:
        t.close()


def test_error_answers_raise_their_class(loopback: Any, client: Any) -> None:
    # Given a plane with one invocation
    server = loopback()
    t = client(server)
    (inv_id,) = _submit(t)
    # Then each error answer is its exception, and a 4xx is not retried
    with pytest.raises(UnknownInvocation):
        t.get("no-such-id")
    assert len(server.requests("GET", "/v1/invocations/no-such-id")) == 1
    with pytest.raises(QueueNotFound):
        t.ensure_queue(QueueSpec("missing"), create=False)
    other = pack({"v": 1, "kind": "ref", "target": "math:floor", "args": [1], "kwargs": {}})
    with pytest.raises(IdempotencyConflict):
        t.submit([Submission(id=inv_id, queue="q", payload=other)])
    with pytest.raises(Unauthorized):
        client(server, token="wrong").get(inv_id)
    # and a counts() of a queue that does not exist is zeros, as on the embedded plane
    assert set(t.counts("missing").values()) == {0}


def test_one_item_batches_raise_the_items_error(loopback: Any, client: Any) -> None:
    # Given a claimed invocation
    server = loopback()
    t = client(server)
    (inv_id,) = _submit(t)
    (claim,) = t.claim(["q"], "w")
    # When a stale token answers, then the item's error is raised as LeaseLost
    result, _ = encode_result(1, prefer_msgpack=True)
    with pytest.raises(LeaseLost):
        t.complete(inv_id, "stale", result)
    with pytest.raises(LeaseLost):
        t.fail(inv_id, "stale", {"type": "E", "message": "", "traceback": "", "pickled": None})
    assert not t.heartbeat(inv_id, "stale").ok
    # and the real holder's answers are taken
    beat = t.heartbeat(inv_id, claim.lease_token, lease_seconds=30)
    assert beat.ok and not beat.cancel and beat.lease_expires_at is not None
    t.complete(inv_id, claim.lease_token, result)
    rec = t.get(inv_id)
    assert rec.state is State.SUCCEEDED and rec.result == result


def test_submit_is_split_by_max_batch(loopback: Any, client: Any) -> None:
    server = loopback(max_batch=3)
    t = client(server)
    ids = _submit(t, 7)
    assert len(ids) == 7 and len(set(ids)) == 7
    assert [len(s.body["invocations"]) for s in server.requests("POST", "/v1/invocations")] == [
        3,
        3,
        1,
    ]


def test_now_is_the_planes_clock(loopback: Any, client: Any) -> None:
    # Given a plane whose clock is 1000 s ahead of this machine's
    server = loopback()
    server.clock_offset = 1000.0
    t = client(server)
    # Then now() is the plane's time, to within the round trip
    assert abs(t.now() - (time.time() + 1000.0)) < 0.5


def test_views_become_records(loopback: Any, client: Any) -> None:
    # Given a delayed invocation and a cancelled one
    server = loopback()
    t = client(server)
    (later,) = _submit(t, delay=300)
    (gone,) = _submit(t)
    # Then the delayed one reads as pending until due (scheduled by the plane's clock)
    rec = t.get(later)
    assert rec.state is State.PENDING and rec.public_state(t.now()) is State.SCHEDULED
    assert t.cancel(gone) is State.CANCELLED
    assert t.get(gone).state is State.CANCELLED
    assert t.get_many([later, "unknown", gone]) == [t.get(later), t.get(gone)]


# --- claims -----------------------------------------------------------------------------


def test_a_long_claim_wait_is_several_server_waits(loopback: Any, client: Any) -> None:
    # Given a plane that holds a claim at most 0.2 s
    server = loopback(max_wait=0.2)
    t = client(server)
    t.ensure_queue(QueueSpec("q"))
    # When a worker waits 1 s on an empty queue
    started = time.monotonic()
    assert t.claim(["q"], "w", wait=1.0) == []
    # Then it waited the whole second, in several capped calls
    assert time.monotonic() - started >= 0.95
    sent = server.requests("POST", "/v1/claims")
    assert len(sent) >= 4 and all(s.body["wait"] <= 0.2 for s in sent)
    # and a stop is seen after one call
    started = time.monotonic()
    assert t.claim(["q"], "w", wait=30.0, should_stop=lambda: True) == []
    assert time.monotonic() - started < 1.0


# --- watches ----------------------------------------------------------------------------


def test_watching_an_unknown_id_raises_at_once(loopback: Any, client: Any) -> None:
    server = loopback()
    t = client(server)
    _submit(t)
    with pytest.raises(UnknownInvocation):
        t.watch(["no-such-id"], lambda rec: None)


def test_a_finished_id_fires_from_the_calling_thread(loopback: Any, client: Any) -> None:
    # Given an invocation finished before this client ever saw it
    server = loopback()
    (inv_id,) = _submit(client(server))
    _finish(server.plane)
    t = client(server)
    fired: list[tuple[str, str]] = []
    # When it is watched, then its callback ran before watch() returned, here
    t.watch([inv_id], lambda rec: fired.append((rec.id, threading.current_thread().name)))
    assert fired == [(inv_id, threading.current_thread().name)]


def test_200_results_are_awaited_by_one_long_poll(loopback: Any, client: Any) -> None:
    # Given 200 invocations submitted through one client, each watched on its own
    server = loopback()
    t = client(server)
    ids = _submit(t, 200)
    done: dict[str, Invocation] = {}
    all_done = threading.Event()

    def on_done(rec: Invocation) -> None:
        done[rec.id] = rec
        if len(done) == 200:
            all_done.set()

    unwatches = [t.watch([inv_id], on_done) for inv_id in ids]
    # When they finish, in batches of 20
    for _ in range(10):
        _finish(server.plane, n=20)
        time.sleep(0.01)
    # Then every callback fired once, with the result ...
    assert all_done.wait(10)
    assert sorted(done) == sorted(ids)
    assert all(rec.state in FINISHED and rec.result for rec in done.values())
    # ... one thread polled for all of them, with far fewer waits than results
    waits = server.requests("POST", "/v1/invocations/wait")
    assert len(waits) <= 40, len(waits)
    assert max(len(w.body["ids"]) for w in waits) == 200
    assert not server.requests("GET", "/v1/invocations/.*")
    assert len(t._watches.pollers) == 1
    for unwatch in unwatches:
        unwatch()


def test_a_new_watch_does_not_wait_for_the_long_poll(loopback: Any, client: Any) -> None:
    # Given a client long-polling (20 s) for one invocation that does not finish
    server = loopback(max_wait=20.0)
    t = client(server)
    slow, quick = _submit(t, 2)
    t.watch([slow], lambda rec: None)
    deadline = time.monotonic() + 5
    while not server.requests("POST", "/v1/invocations/wait"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # When another invocation is watched and then finishes
    fired = threading.Event()
    t.watch([quick], lambda rec: fired.set())
    time.sleep(0.05)
    started = time.monotonic()
    result, _ = encode_result(1, prefer_msgpack=True)
    claim = next(c for c in server.plane.claim(["q"], "w", limit=2) if c.id == quick)
    server.plane.complete(quick, claim.lease_token, result)
    # Then its callback fires at once, not when the first poll runs out
    assert fired.wait(2), "the new watch waited behind the long poll"
    assert time.monotonic() - started < 1.0


def test_a_burst_of_watches_goes_out_in_a_poll_or_two(loopback: Any, client: Any) -> None:
    # Given a client long-polling for one invocation that does not finish
    server = loopback(max_wait=20.0, max_wait_ids=10_000)  # (one poller for them all)
    t = client(server)
    first, *rest = _submit(t, 2001)
    t.watch([first], lambda rec: None)
    wait_for(lambda: server.requests("POST", "/v1/invocations/wait"))
    # When 2,000 more are watched one at a time, each just after the last (as
    # asyncio.gather over many results does: each of its tasks adds its own)
    started = time.monotonic()
    for inv_id in rest:
        t.watch([inv_id], lambda rec: None)
        # (gives up the GIL, as a gather's tasks do between their watches: without it
        # this thread would hold it for the whole burst and the poller never run in it;
        # no time is waited)
        time.sleep(0)
    took = time.monotonic() - started
    # Then the poller waited for the burst to end (or 0.2 s at most) before polling
    # again: each poll a new watch cuts is one the plane answered in full, into a closed
    # socket. A poll per 10 ms window would be one per 10 ms the burst took; a busy
    # machine that stalls this loop for a window can cost one or two more.
    waits = lambda: server.requests("POST", "/v1/invocations/wait")  # noqa: E731
    wait_for(lambda: any(len(w.body["ids"]) == 2001 for w in waits()))
    most = 4 + int(took / 0.2)
    assert len(waits()) <= most, (took, [len(w.body["ids"]) for w in waits()])


def test_a_steady_stream_of_watches_does_not_hold_up_results(loopback: Any, client: Any) -> None:
    # Given a client watching a new invocation every few milliseconds (tasks that each
    # submit and await, at a steady pace)
    server = loopback(max_wait=20.0)
    t = client(server)
    ids = _submit(t, 201)
    claims = {c.id: c for c in server.plane.claim(["q"], "w", limit=201)}
    result, _ = encode_result(1, prefer_msgpack=True)
    fired: dict[str, float] = {}
    finished: dict[str, float] = {}
    for k, inv_id in enumerate(ids):
        t.watch([inv_id], lambda rec: fired.setdefault(rec.id, time.monotonic()))
        if k % 40 == 20:  # When one watched a little before finishes meanwhile
            done = claims[ids[k - 10]]
            server.plane.complete(done.id, done.lease_token, result)
            finished[done.id] = time.monotonic()
        time.sleep(0.004)
    # Then each fired within a poll or two, not after the stream paused
    wait_for(lambda: set(finished) <= set(fired))
    delays = sorted(fired[i] - finished[i] for i in finished)
    assert delays[len(delays) // 2] < 0.1, delays


def test_unwatch_stops_callbacks(loopback: Any, client: Any) -> None:
    server = loopback()
    t = client(server)
    (inv_id,) = _submit(t)
    fired: list[str] = []
    unwatch = t.watch([inv_id], lambda rec: fired.append(rec.id))
    unwatch()
    _finish(server.plane)
    time.sleep(0.3)
    assert fired == []


# --- blobs ------------------------------------------------------------------------------


def test_blobs_go_by_the_signed_urls_the_plane_hands_out(loopback: Any, client: Any) -> None:
    # Given a plane that hands out its own signed URL for one blob and another origin's
    # (an S3 presigned URL, say) for another
    server = loopback()
    store = ThreadingHTTPServer(("127.0.0.1", 0), BlobStore)
    threading.Thread(target=store.serve_forever, args=(0.05,), daemon=True).start()
    try:
        t = client(server)
        own, elsewhere = b"own bytes", b"bytes for s3"
        d_own = hashlib.sha256(own).hexdigest()
        d_else = hashlib.sha256(elsewhere).hexdigest()
        server.upload_urls[d_else] = f"http://127.0.0.1:{store.server_address[1]}/b/{d_else}"
        # When the client uploads both
        assert t.missing_blobs([d_own, d_else]) == {d_own, d_else}
        t.put_blob(d_own, own)
        t.put_blob(d_else, elsewhere)
        # Then the plane's went to its signed URL, the other origin's there, without token
        (put,) = server.requests("PUT", f"/v1/blobs/{d_own}")
        assert put.query == "sig=ok"
        assert BlobStore.blobs[f"/b/{d_else}"] == elsewhere
        assert "Authorization" not in BlobStore.headers_seen[-1]
        assert t.get_blob(d_own) == own
        # and a download the plane redirects elsewhere follows it, without the token
        server.redirects[d_else] = f"http://127.0.0.1:{store.server_address[1]}/b/{d_else}"
        assert t.get_blob(d_else) == elsewhere
        assert "Authorization" not in BlobStore.headers_seen[-1]
        # and bytes that do not match their digest are refused here
        with pytest.raises(InvalidRequest):
            t.put_blob(d_own, b"other bytes")
    finally:
        store.shutdown()
        store.server_close()


# --- the SDK through the client -----------------------------------------------------------


def square(x: int) -> int:
    return x * x


def explode() -> None:
    raise ValueError("boom")


def test_the_sdk_runs_over_the_client(loopback: Any) -> None:
    # Given a Dispatch of the loopback plane and a worker on it
    server = loopback()
    with dls.Dispatch(server.url, token=TOKEN, backoff=0.01) as dp:
        assert isinstance(dp.transport, HttpTransport)
        q = dls.SyncQueue("sdk", dispatch=dp)
        stop = threading.Event()
        worker = threading.Thread(
            target=dls.run_worker, args=(q,), kwargs={"stop": stop.is_set, "poll": 0.1}
        )
        worker.start()
        try:
            # Then calls, results and raises travel as on the embedded plane
            assert q.result(q.submit(square, 7), timeout=10) == 49
            with pytest.raises(ValueError, match="boom"):
                q.result(q.submit(explode), timeout=10)
            assert q.status(q.submit(square, 2, _delay=300)) == "scheduled"

            async def fan_out() -> list[int]:
                aq = dls.Queue("sdk", dispatch=dp)
                ids = [await aq.submit(square, i) for i in range(50)]
                return list(await asyncio.gather(*(aq.result(i, timeout=20) for i in ids)))

            assert asyncio.run(fan_out()) == [i * i for i in range(50)]
        finally:
            stop.set()
            worker.join(10)


def test_dispatch_takes_only_remote_options() -> None:
    with pytest.raises(TypeError, match="lease_seconds"):
        dls.Dispatch("http://127.0.0.1:9", token=TOKEN, lease_seconds=5)


# --- against lakeshore serve ----------------------------------------------------------------


def big_echo(data: bytes) -> bytes:
    return data + data


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Any:
    pytest.importorskip("uvicorn")
    return request.getfixturevalue("lakeshore_server")


def test_sdk_against_lakeshore_serve(served: Any, lakeshore_worker: Any) -> None:
    # Given a producer and a worker token on a served plane
    producer, worker = served.dispatch("producer"), served.dispatch("worker")
    q = dls.SyncQueue("served", dispatch=producer)
    lakeshore_worker(dls.SyncQueue("served", dispatch=worker))
    # Then results come back, arguments and results over the inline limit included
    assert q.result(q.submit(square, 9), timeout=20) == 81
    big = b"z" * 400_000
    assert q.result(q.submit(big_echo, big), timeout=30) == big + big
    # and a fan-out is awaited by one long poll
    ids = [q.submit(square, i) for i in range(100)]
    assert [q.result(i, timeout=30) for i in ids] == [i * i for i in range(100)]
    assert isinstance(producer.transport, HttpTransport)
    assert len(producer.transport._watches.pollers) <= 1


def test_worker_and_daemon_routes_against_lakeshore_serve(served: Any) -> None:
    # Given a producer, a worker and an admin on a served plane, and one claimed invocation
    p = served.dispatch("producer").transport
    w = served.dispatch("worker").transport
    admin = served.dispatch("admin").transport
    (inv_id,) = _submit(p, queue="routes")
    (claim,) = w.claim(["routes"], "w1")
    # Then output, progress and release travel in the shapes the plane answers
    w.report_progress(inv_id, claim.lease_token, 0.5, "half way")
    w.append_logs(inv_id, claim.lease_token, [(1, "stdout", "hello\n"), (2, "stderr", "oops\n")])
    w.append_logs(inv_id, claim.lease_token, [(2, "stderr", "oops\n")])  # resent: kept once
    entries = p.read_logs(inv_id)
    assert [(e.stream, e.text, e.attempt) for e in entries] == [
        ("stdout", "hello\n", 1),
        ("stderr", "oops\n", 1),
    ]
    assert p.read_logs(inv_id, after=entries[0].seq) == entries[1:]
    w.release(inv_id, claim.lease_token)
    with pytest.raises(LeaseLost):
        w.release(inv_id, claim.lease_token)
    (claim,) = w.claim(["routes"], "w1")
    assert claim.attempt == 1  # the release did not spend an attempt
    error = {"type": "E", "message": "no", "traceback": "", "pickled": None}
    assert w.fail(inv_id, claim.lease_token, error, retryable=False) is State.FAILED
    assert p.retry(inv_id).state is State.PENDING
    assert [r.id for r in p.list_invocations("routes", state="pending")] == [inv_id]
    # and daemons register, beat and are listed, updated and drained
    daemon = w.register_daemon("box", queues=["routes"], concurrency=2, python="3.11", host="h")
    assert w.daemon_heartbeat(daemon.id, running=1).running == 1
    assert [d.id for d in w.list_daemons()] == [daemon.id]
    assert admin.update_daemon(daemon.id, add_queues=["more"]).queues == ["routes", "more"]
    assert admin.drain_daemon(daemon.id).draining
