"""The SDK's plain-HTTP exchange (lakeshore/http/plain.py) against scripted servers.

Each server is a real loopback socket that reads one request and writes bytes exactly as
given, so every framing an HTTP/1.1 server may use is covered: Content-Length, chunked,
a body ended by closing, interim 1xx answers, bodiless statuses, and broken answers.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from dreamlake.lakeshore.http.connections import Origin, Target, new_connection, request_once
from dreamlake.lakeshore.http.plain import PlainConnection

pytestmark = pytest.mark.timeout(30)

Script = Callable[[socket.socket, bytes], None]


def read_request(conn: socket.socket) -> bytes:
    """One request: head and (Content-Length) body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.fixture
def serve() -> Iterator[Callable[..., int]]:
    """Start a server that answers each request it reads with the next script."""
    socks: list[socket.socket] = []

    def start(*scripts: Script) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        socks.append(listener)

        def run() -> None:
            conn, _ = listener.accept()
            with conn:
                for script in scripts:
                    request = read_request(conn)
                    if not request:
                        return
                    script(conn, request)

        threading.Thread(target=run, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    for s in socks:
        s.close()


def answer(raw: bytes) -> Script:
    return lambda conn, request: conn.sendall(raw)


def test_a_content_length_answer_and_keep_alive(serve: Callable[..., int]) -> None:
    seen: list[bytes] = []

    def echo(conn: socket.socket, request: bytes) -> None:
        seen.append(request)
        body = request.partition(b"\r\n\r\n")[2]
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-A: 1\r\nX-A: 2\r\n\r\n" % len(body)
        )
        conn.sendall(body)  # the body in a second segment

    port = serve(echo, echo)
    conn = PlainConnection("127.0.0.1", port, timeout=5)
    status, fields, data, close = conn.exchange("POST", "/v1/x?a=1", b"hello", {"Accept": "x"})
    assert (status, data, close) == (200, b"hello", False)
    assert fields["x-a"] == "1, 2" and fields["content-length"] == "5"
    # the same connection serves the next request
    status, _, data, _ = conn.exchange("PUT", "/y", b"", {})
    assert (status, data) == (200, b"")
    head = seen[0].partition(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"POST /v1/x?a=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}".encode() in head and b"Content-Length: 5" in head
    assert b"Content-Length: 0" in seen[1]
    conn.close()


def test_a_large_body_both_ways(serve: Callable[..., int]) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB

    def echo(conn: socket.socket, request: bytes) -> None:
        body = request.partition(b"\r\n\r\n")[2]
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    conn = PlainConnection("127.0.0.1", serve(echo), timeout=5)
    assert conn.exchange("PUT", "/b", big, {})[2] == big
    conn.close()


def test_chunked_interim_and_bodiless_answers(serve: Callable[..., int]) -> None:
    port = serve(
        answer(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n"
        ),
        answer(b"HTTP/1.1 204 No Content\r\nContent-Length: 99\r\n\r\n"),
        answer(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"),  # HEAD: no body follows
        answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    )
    conn = PlainConnection("127.0.0.1", port, timeout=5)
    assert conn.exchange("GET", "/c", None, {})[:3:2] == (200, b"hello world")
    assert conn.exchange("DELETE", "/d", None, {})[::2] == (204, b"")
    assert conn.exchange("HEAD", "/h", None, {})[::2] == (200, b"")
    assert conn.exchange("GET", "/e", None, {})[::2] == (200, b"ok")
    conn.close()


def test_a_body_ended_by_close_and_connection_close(serve: Callable[..., int]) -> None:
    def until_close(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        conn.shutdown(socket.SHUT_WR)

    conn = PlainConnection("127.0.0.1", serve(until_close), timeout=5)
    status, _, data, close = conn.exchange("GET", "/", None, {})
    assert (status, data, close) == (200, b"all of it", True)
    conn.close()
    port = serve(answer(b"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
    conn = PlainConnection("127.0.0.1", port, timeout=5)
    assert conn.exchange("GET", "/", None, {})[::3] == (503, True)
    conn.close()


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"", http.client.RemoteDisconnected),
        (b"SMTP ready\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", http.client.IncompleteRead),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000, http.client.LineTooLong),
    ],
)
def test_broken_answers_raise_what_http_client_would(
    serve: Callable[..., int], raw: bytes, error: type[Exception]
) -> None:
    def send_and_close(conn: socket.socket, request: bytes) -> None:
        conn.sendall(raw)
        conn.shutdown(socket.SHUT_WR)

    conn = PlainConnection("127.0.0.1", serve(send_and_close), timeout=5)
    with pytest.raises(error):
        conn.exchange("GET", "/", None, {})
    conn.close()


def test_request_once_uses_it_for_plain_http_and_closes_on_errors(
    serve: Callable[..., int],
) -> None:
    port = serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), answer(b"junk\r\n\r\n"))
    origin: Origin = ("http", "127.0.0.1", port)
    conn = new_connection(origin, 5.0, None)
    assert isinstance(conn, PlainConnection)
    target = Target(origin, "/v1/hello", own=True)
    got = request_once(conn, "GET", target, None, {"Accept": "application/json"}, 5.0)
    assert (got.status, got.body) == (200, b"ok") and conn.sock is not None
    with pytest.raises(http.client.BadStatusLine):
        request_once(conn, "GET", target, None, {}, 5.0)
    assert conn.sock is None  # a connection in an unknown state is never reused
    assert not isinstance(new_connection(("https", "example.com", 443), 5.0, None), PlainConnection)
