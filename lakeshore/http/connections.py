"""Sockets: keep-alive connections by origin, and one request on one connection.

Contract:

- :func:`request_once` makes exactly one request and retries nothing. It reopens a
  connection the server dropped while it sat idle (:func:`dropped`), closes the
  connection on any error and when the answer says the server will close it, so a
  connection handed back is always fit for the next request.
- :class:`ThreadConnections` holds one thread's connections (one per origin); they are
  closed by :func:`close_all`, which the owner arranges for when the holder is collected.
- Every connection sets ``TCP_NODELAY``: requests go out in one piece and are answered
  at once, so Nagle's algorithm would only add latency.
- Plain HTTP connections are :class:`~.plain.PlainConnection` (one ``sendmsg`` a request,
  a small answer parser); TLS ones keep ``http.client``'s.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from .plain import Body, PlainConnection

__all__ = [
    "Answer",
    "Body",
    "Origin",
    "Target",
    "ThreadConnections",
    "close_all",
    "dropped",
    "new_connection",
    "origin_of",
    "request_once",
]

#: ``(scheme, host, port)``: where a connection goes
Origin = tuple[str, str, int]


@dataclass(frozen=True)
class Answer:
    status: int
    #: lower-case names
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Target:
    origin: Origin
    #: path and query, as sent in the request line
    path: str
    #: same origin as the plane: the bearer token goes along (never to S3 and the like)
    own: bool


def origin_of(scheme: str, host: str, port: int | None) -> Origin:
    return (scheme, host, port or (443 if scheme == "https" else 80))


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _nodelay(self.sock)


def _nodelay(sock: socket.socket) -> None:
    # Requests are written in one piece and answered at once: never wait for Nagle.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def new_connection(
    origin: Origin, timeout: float, context: ssl.SSLContext | None
) -> http.client.HTTPConnection:
    """A connection to ``origin``, not yet open; ``context`` is used for https only."""
    scheme, host, port = origin
    if scheme == "https":
        return _HTTPSConnection(host, port, timeout=timeout, context=context)
    return PlainConnection(host, port, timeout=timeout)


def dropped(sock: socket.socket) -> bool:
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


class ThreadConnections:
    """One thread's keep-alive connections, by origin; closed when the thread ends."""

    __slots__ = ("__weakref__", "by_origin")

    def __init__(self) -> None:
        self.by_origin: dict[Origin, http.client.HTTPConnection] = {}


def close_all(conns: dict[Origin, http.client.HTTPConnection]) -> None:
    for conn in list(conns.values()):
        conn.close()
    conns.clear()


def request_once(
    conn: http.client.HTTPConnection,
    method: str,
    target: Target,
    body: Body | None,
    headers: Mapping[str, str],
    timeout: float,
) -> Answer:
    """One request on ``conn`` (reopened if the server dropped it); no retry. A body
    given as a list of parts is sent part after part, never joined."""
    if conn.sock is not None and dropped(conn.sock):
        conn.close()
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    if isinstance(conn, PlainConnection):
        try:
            status, fields, data, will_close = conn.exchange(method, target.path, body, headers)
        except BaseException:
            conn.close()
            raise
        if will_close:
            conn.close()
        return Answer(status, fields, data)
    sent = dict(headers)
    if isinstance(body, list):  # (parts: http.client sends them one by one)
        sent["Content-Length"] = str(sum(len(part) for part in body))
    try:
        conn.request(method, target.path, body=body, headers=sent)
        response = conn.getresponse()
        data = response.read()
    except BaseException:
        conn.close()
        raise
    if response.will_close:
        conn.close()
    headers_out = {k.lower(): v for k, v in response.getheaders()}
    return Answer(response.status, headers_out, data)
