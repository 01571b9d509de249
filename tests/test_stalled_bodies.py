"""``lakeshore serve`` answers a request whose head or body stops arriving ``408 timeout``
and closes its connection, once its client has sent nothing for ``REQUEST_IDLE`` seconds
(set to a fraction of a second here), on the short lane and through ASGI alike; an idle
keep-alive connection between requests and a body that arrives slowly but steadily are
not cut; a connection idle for ``KEEP_ALIVE`` seconds, from its opening too, is closed.

Every wait is a socket read with a timeout: on a server that never answers a stalled
request, the read times out and the test fails instead of hanging.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from support import wait_for

import dreamlake.lakeshore.server as server_module
from dreamlake.lakeshore.server import AT_ONCE, CARRIED, INLINE_BODY, LocalServer

pytestmark = pytest.mark.timeout(120)

#: the idle bound the tests set (the server's is 60 s)
BOUND = 0.5
#: how long a test waits for an answer before it calls the server hung
PATIENCE = 10.0


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalServer]:
    """``lakeshore serve`` whose requests may go quiet for :data:`BOUND` seconds; the
    lane each request took is recorded in ``server.lanes`` (``AT_ONCE``, ``CARRIED``, 0:
    ASGI), and
    every body the ASGI app read to its end in ``server.read``."""
    monkeypatch.setattr(server_module, "REQUEST_IDLE", BOUND)
    server = LocalServer(tmp_path / "plane.db")
    server.start()
    asgi = server.asgi
    assert asgi is not None
    lanes: list[int] = []
    read: list[Any] = []
    takes, read_body = asgi.takes, asgi._read_body

    def spied_takes(method: str, path: str, size: int) -> int:
        lane = takes(method, path, size)
        lanes.append(lane)
        return lane

    async def spied_read_body(headers: Any, receive: Any) -> Any:
        body = await read_body(headers, receive)
        read.append(body)
        return body

    monkeypatch.setattr(asgi, "takes", spied_takes)
    monkeypatch.setattr(asgi, "_read_body", spied_read_body)
    server.lanes = lanes  # type: ignore[attr-defined]
    server.read = read  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


# --- helpers -----------------------------------------------------------------------------


class _Conn:
    """A client connection to the server, reading its answers one at a time."""

    def __init__(self, server: LocalServer) -> None:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=PATIENCE)
        self.sock.settimeout(PATIENCE)
        self.got = b""

    def __enter__(self) -> _Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> bytes:
        chunk = self.sock.recv(65536)
        self.got += chunk
        return chunk

    def answer(self) -> tuple[int, bytes, bytes]:
        """The next whole answer: status, head, body (its Content-Length)."""
        while b"\r\n\r\n" not in self.got:
            assert self._more(), f"the connection closed before an answer: {self.got!r}"
        head, _, rest = self.got.partition(b"\r\n\r\n")
        found = re.search(rb"content-length: (\d+)", head, re.I)
        assert found is not None, head
        size = int(found.group(1))
        while len(rest) < size:
            assert self._more(), "the connection closed mid-answer"
            rest = self.got.partition(b"\r\n\r\n")[2]
        self.got = rest[size:]
        return int(head.split(b" ")[1]), head, rest[:size]

    def closed(self) -> bool:
        """Whether the server closed the connection with nothing more sent."""
        try:
            return not self.got and not self._more()
        except ConnectionResetError:
            return True

    def quiet_for(self, seconds: float) -> bool:
        """Whether the server sends nothing, nor closes, for ``seconds``."""
        self.sock.settimeout(seconds)
        try:
            self._more()
        except TimeoutError:
            return not self.got
        finally:
            self.sock.settimeout(PATIENCE)
        return False


def _submit_body(ident: str, media: str = "application/json") -> bytes:
    submit = {"invocations": [{"id": ident, "queue": "stalls", "ref": "math:sqrt"}]}
    if media == "application/msgpack":
        return bytes(msgpack.packb(submit))
    return json.dumps(submit).encode()


def _head(
    server: LocalServer,
    method: str,
    path: str,
    length: int,
    *,
    media: str = "application/json",
    extra: bytes = b"",
) -> bytes:
    assert server.admin_token is not None
    return (
        b"%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: %s\r\n"
        b"Accept: %s\r\n%sContent-Length: %d\r\n\r\n"
        % (
            method.encode(),
            path.encode(),
            server.admin_token.encode(),
            media.encode(),
            media.encode(),
            extra,
            length,
        )
    )


def _error(media: str, body: bytes) -> dict[str, Any]:
    decoded = msgpack.unpackb(body) if media == "application/msgpack" else json.loads(body)
    assert isinstance(decoded, dict)
    error = decoded["error"]
    assert isinstance(error, dict)
    return error


def _assert_408(conn: _Conn, media: str, what: str) -> None:
    """The next answer on ``conn`` is a 408 in the API's shape and ``media``, one line
    naming ``what`` stopped, and then the connection is closed."""
    began = time.monotonic()
    status, head, body = conn.answer()
    assert status == 408, head + body
    assert b"connection: close" in head.lower()
    assert f"content-type: {media}".encode() in head.lower()
    error = _error(media, body)
    assert error["code"] == "timeout"
    message = error["message"]
    assert f"request's {what} stopped arriving" in message and "\n" not in message
    assert time.monotonic() - began < PATIENCE / 2  # (the bound set, not the 60 s default)
    assert conn.closed()


def _exists(server: LocalServer, ident: str) -> bool:
    with _Conn(server) as conn:
        conn.send(_head(server, "GET", f"/v1/invocations/{ident}", 0))
        status, _, _ = conn.answer()
    assert status in (200, 404)
    return status == 200


_FORWARDED = b"X-Forwarded-For: 10.0.0.1\r\n"
#: a request the short lane answers (a small submit, or one over the loop's size,
#: INLINE_BODY, that a request thread answers), and ones it leaves to uvicorn and the
#: ASGI app (a proxy's forwarding header, on a small and on a large submit): each one's
#: extra header, and whether it is large
PATHS = {
    "lane": (b"", False),
    "lane-large": (b"", True),
    "asgi-large": (_FORWARDED, True),
    "asgi-forwarded": (_FORWARDED, False),
}


def _stalled_submit(server: LocalServer, path: str, ident: str, media: str) -> bytes:
    """A submit whose head declares more body than it sends: what it sends is the
    whole (valid) submit for ``ident``, padded on for the large one."""
    body = _submit_body(ident, media)
    extra, large = PATHS[path]
    size = INLINE_BODY + 1000 if large else len(body) + 85
    return _head(server, "POST", "/v1/invocations", size, media=media, extra=extra) + body


def _took(server: LocalServer, path: str) -> None:
    """The request went the way ``path`` names (and, through ASGI, its body was not read
    to an end: a body cut short is never resolved)."""
    lanes, read = server.lanes, server.read  # type: ignore[attr-defined]
    if path.startswith("lane"):
        assert lanes == [CARRIED if path == "lane-large" else AT_ONCE] and read == []
    else:  # (the app hears a hang-up: _GONE)
        wait_for(lambda: len(read) == 1, timeout=PATIENCE)
        assert not any(lanes) and isinstance(read[0], tuple)


# --- the tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("media", ["application/json", "application/msgpack"])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_body_that_stops_arriving_is_408_and_the_connection_closed(
    served: LocalServer, path: str, media: str
) -> None:
    # Given a submit declaring more body than it sends, then silence (what it sends is a
    # whole submit: were the body cut short resolved, it would go through)
    ident = f"stalled-{path}-{media.rsplit('/', 1)[1]}"
    with _Conn(served) as conn:
        conn.send(_stalled_submit(served, path, ident, media))
        # Then it is answered 408 within the bound, in its own media type, and closed
        _assert_408(conn, media, "body")
    _took(served, path)
    assert not _exists(served, ident)


def test_a_head_that_stops_arriving_is_408_and_the_connection_closed(
    served: LocalServer,
) -> None:
    with _Conn(served) as conn:
        conn.send(b"POST /v1/invocations HTTP/1.1\r\nHost: x\r\nContent-Ty")
        _assert_408(conn, "application/json", "head")
    # and so is one cut short on a connection that answered a request before it
    with _Conn(served) as conn:
        conn.send(_head(served, "GET", "/v1/hello", 0))
        assert conn.answer()[0] == 200
        conn.send(b"GET /v1/hel")
        _assert_408(conn, "application/json", "head")


def test_a_stalled_request_behind_a_waiting_one_is_answered_after_it(
    served: LocalServer,
) -> None:
    """A 408 never goes out ahead of the answer to a request before it on the connection
    (here a claim parked for longer than the bound)."""
    queue = b'{"name": "stalls"}'
    with _Conn(served) as conn:
        conn.send(_head(served, "POST", "/v1/queues", len(queue)) + queue)
        assert conn.answer()[0] == 200
    claim = json.dumps({"queues": ["stalls"], "worker": "w", "wait": 3 * BOUND}).encode()
    with _Conn(served) as conn:
        began = time.monotonic()
        ask = _head(served, "POST", "/v1/claims", len(claim)) + claim
        conn.send(ask + b"POST /v1/invocations HTTP/1.1\r\nHost: x\r\nContent-Le")
        status, head, body = conn.answer()
        assert status == 200 and json.loads(body)["claims"] == [], head + body
        assert time.monotonic() - began >= 3 * BOUND * 0.9  # (its whole wait)
        _assert_408(conn, "application/json", "head")


@pytest.mark.parametrize("path", ["lane", "asgi-forwarded"])
def test_an_idle_keep_alive_connection_is_not_sent_a_408(served: LocalServer, path: str) -> None:
    # Given a whole request answered on a connection kept open
    extra, _ = PATHS[path]
    with _Conn(served) as conn:
        conn.send(_head(served, "GET", "/v1/hello", 0, extra=extra))
        status, head, _ = conn.answer()
        assert status == 200 and b"connection: close" not in head.lower()
        # When it stays idle for several times the bound: nothing comes, nor a close
        assert conn.quiet_for(4 * BOUND)
        # and the connection still answers the next request
        conn.send(_head(served, "GET", "/v1/hello", 0, extra=extra))
        assert conn.answer()[0] == 200


def test_a_connection_that_never_sends_a_request_is_closed_as_an_idle_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a server whose idle connections are closed after a second
    monkeypatch.setattr(server_module, "KEEP_ALIVE", 1)
    server = LocalServer(tmp_path / "plane.db")
    server.start()
    try:
        with _Conn(server) as silent, _Conn(server) as talking:
            # When one connection sends nothing at all, and another a request
            talking.send(_head(server, "GET", "/v1/hello", 0))
            assert talking.answer()[0] == 200
            # Then the silent one is closed (an empty read: the server's close)
            assert silent.sock.recv(1) == b""
            # and so is the other once it sits idle as long
            assert talking.sock.recv(1) == b""
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["lane", "asgi-forwarded"])
def test_a_request_that_arrives_slowly_but_steadily_is_answered(
    served: LocalServer, path: str
) -> None:
    # Given a submit sent a few bytes at a time, a fifth of the bound apart, for several
    # times the bound in all
    extra, _ = PATHS[path]
    body = _submit_body(f"steady-{path}")
    request = _head(served, "POST", "/v1/invocations", len(body), extra=extra) + body
    pieces = 30
    step = -(-len(request) // pieces)
    began = time.monotonic()
    with _Conn(served) as conn:
        for start in range(0, len(request), step):
            conn.send(request[start : start + step])
            time.sleep(BOUND / 5)
        # Then it is answered as any other
        status, head, answer = conn.answer()
        assert status == 200, head + answer
        assert b"connection: close" not in head.lower()
    assert time.monotonic() - began > 2 * BOUND  # (it did take longer than the bound)
    assert _exists(served, f"steady-{path}")
