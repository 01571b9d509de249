"""One HTTP/1.1 exchange over a plain (not TLS) keep-alive socket, without http.client's
per-request machinery.

``http.client`` spends ~0.15 ms of Python on each request it sends and answer it reads
(header objects, an email parser for the answer's headers, a buffered file per answer):
as much as the whole server side of a short request to ``lakeshore serve``. On plain
HTTP — the loopback and LAN case where that matters — :class:`PlainConnection` writes
the request in one ``sendmsg`` (the body, however large, is not copied) and reads the
answer with a small parser: the status line, the headers, then a ``Content-Length`` body,
a chunked one, or (with neither) one that ends when the server closes. Interim ``1xx``
answers are skipped. TLS connections keep ``http.client`` (its cost hides behind TLS's).

It is an ``http.client.HTTPConnection`` (``connect``, ``sock``, ``close`` as there), so
everything that opens, checks or shuts connections treats both alike; only
:func:`~.connections.request_once` calls :meth:`PlainConnection.exchange`. Malformed
answers raise ``http.client`` errors, a connection the server closed before answering
raises ``RemoteDisconnected``: the same exceptions callers already handle.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Mapping

__all__ = ["MAX_HEADER_BYTES", "Body", "PlainConnection"]

#: bytes of status line and headers an answer may have
MAX_HEADER_BYTES = 64 * 1024
_READ = 256 * 1024
#: buffers one sendmsg takes at most (Linux's IOV_MAX)
_IOV_MAX = 1024
#: a request body: bytes, or parts sent one after the other as they are
Body = bytes | list[bytes]
#: statuses whose answers have no body, whatever their headers say
_NO_BODY = frozenset({204, 304})


class PlainConnection(http.client.HTTPConnection):
    """A keep-alive connection to a plain HTTP origin (see the module's notes)."""

    #: bytes read past the last answer's head (a body's start, or nothing)
    _rest = b""

    def connect(self) -> None:
        super().connect()
        assert self.sock is not None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._rest = b""

    def close(self) -> None:
        super().close()
        self._rest = b""

    def exchange(
        self, method: str, path: str, body: Body | None, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, str], bytes, bool]:
        """Send one request and read its answer: ``(status, headers, body, will_close)``
        with lower-case header names (repeated ones joined with ", "). A body given as
        a list of parts goes out as those parts, one after the other."""
        if self.sock is None:
            self.connect()
        sock = self.sock
        assert sock is not None
        parts = [] if body is None else body if isinstance(body, list) else [body]
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self._host_header()}"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {sum(len(part) for part in parts)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        _send_all(sock, [head, *parts])
        while True:
            status, fields, will_close = self._read_head()
            if not 100 <= status < 200:
                break
        if method == "HEAD" or status in _NO_BODY:
            data = b""
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            data = self._read_chunked()
        elif "content-length" in fields:
            declared = fields["content-length"]
            if not declared.isdigit() or not declared.isascii():
                raise http.client.HTTPException("malformed Content-Length")
            data = self._read_exactly(int(declared))
        else:  # the body ends when the server closes
            data = self._read_to_close()
            will_close = True
        if self._rest:  # nothing may follow an answer: the stream is out of step
            will_close = True
        return status, fields, data, will_close

    def _host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 80 else f"{host}:{self.port}"

    # --- reading ---------------------------------------------------------------------------
    def _recv(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(_READ)
        if not chunk:
            raise http.client.IncompleteRead(b"")
        return chunk

    def _read_head(self) -> tuple[int, dict[str, str], bool]:
        buf = self._rest
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            if len(buf) > MAX_HEADER_BYTES:
                raise http.client.LineTooLong("answer headers")
            assert self.sock is not None
            chunk = self.sock.recv(_READ)
            if not chunk:
                if not buf:
                    raise http.client.RemoteDisconnected(
                        "Remote end closed connection without response"
                    )
                raise http.client.IncompleteRead(buf)
            buf += chunk
            end = buf.find(b"\r\n\r\n", max(0, len(buf) - len(chunk) - 3))
        self._rest = buf[end + 4 :]
        status_line, *header_lines = buf[:end].decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise http.client.BadStatusLine(status_line)
        fields: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise http.client.HTTPException(f"malformed header line {line[:80]!r}")
            key, value = name.strip().lower(), value.strip()
            fields[key] = f"{fields[key]}, {value}" if key in fields else value
        connection = fields.get("connection", "").lower()
        will_close = "close" in connection or (
            version == "HTTP/1.0" and "keep-alive" not in connection
        )
        return int(code), fields, will_close

    def _read_exactly(self, n: int) -> bytes:
        rest = self._rest
        if len(rest) >= n:
            self._rest = rest[n:]
            return rest[:n]
        parts = [rest]
        have = len(rest)
        self._rest = b""
        if n - have > _READ:  # a large body: read straight into its buffer
            out = bytearray(n)
            view = memoryview(out)
            view[:have] = rest
            assert self.sock is not None
            while have < n:
                got = self.sock.recv_into(view[have:], n - have)
                if not got:
                    raise http.client.IncompleteRead(bytes(out[:have]), n - have)
                have += got
            return bytes(out)
        while have < n:
            chunk = self._recv()
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self._rest = data[n:]
        return data[:n]

    def _read_line(self) -> bytes:
        while (end := self._rest.find(b"\r\n")) < 0:
            if len(self._rest) > MAX_HEADER_BYTES:
                raise http.client.LineTooLong("chunk size")
            self._rest += self._recv()
        line, self._rest = self._rest[:end], self._rest[end + 2 :]
        return line

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_text = self._read_line().split(b";", 1)[0].strip()
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                raise http.client.HTTPException("malformed chunk size")
            size = int(size_text, 16)
            if size == 0:
                while self._read_line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._read_exactly(size))
            if self._read_exactly(2) != b"\r\n":
                raise http.client.HTTPException("malformed chunk end")

    def _read_to_close(self) -> bytes:
        parts = [self._rest]
        self._rest = b""
        assert self.sock is not None
        while chunk := self.sock.recv(_READ):
            parts.append(chunk)
        return b"".join(parts)


def _send_all(sock: socket.socket, parts: list[bytes]) -> None:
    """Write the parts in order without joining them (a large body is not copied)."""
    views = [memoryview(part) for part in parts if len(part)]
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while sent:
            if sent < len(views[0]):
                views[0] = views[0][sent:]
                break
            sent -= len(views.pop(0))
