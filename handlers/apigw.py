"""The API Gateway HTTP API (payload format 2.0) event shape: the one module that knows it.

The Lambda handlers read requests through :func:`request_body`, :func:`header` and
:func:`query`; ``lakeshore serve`` and ``lakeshore dev`` turn a plain HTTP request into the
same event with :func:`http_event` and the handler's answer back into status, headers and
bytes with :func:`http_response`. So the handler code runs unchanged behind API Gateway
and on one machine.
"""

from __future__ import annotations

import base64
import itertools
import os
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["header", "http_event", "http_response", "query", "raw_bodies", "request_body"]

#: marks an event built by :func:`http_event` with ``raw_body`` (never from API Gateway)
_RAW = "lakeshoreRawBodies"
#: request ids of this process's events: unique without a uuid4 a request
_REQUEST_PREFIX = os.urandom(6).hex()
_REQUESTS = itertools.count(1)


def request_body(event: Mapping[str, Any]) -> bytes:
    """The raw request body. (Powertools' decoded body assumes UTF-8 and breaks msgpack.)"""
    body = event.get("body")
    if body is None:
        return b""
    if event.get("isBase64Encoded"):
        return base64.b64decode(body)
    return body.encode() if isinstance(body, str) else bytes(body)


def raw_bodies(event: Mapping[str, Any]) -> bool:
    """Whether bodies may stay bytes both ways (``lakeshore serve``): the answer to such
    an event may carry a ``memoryview`` of its bytes (or a ``bytearray``), which
    powertools passes on as it is and :func:`http_response` hands back as those bytes —
    no base64 round trip of a megabyte blob, and no copy of it."""
    return bool(event.get(_RAW))


def header(event: Mapping[str, Any], name: str) -> str | None:
    """A request header by lower-case name (API Gateway lower-cases them)."""
    value = (event.get("headers") or {}).get(name.lower())
    return None if value is None else str(value)


def query(event: Mapping[str, Any]) -> dict[str, str]:
    return dict(event.get("queryStringParameters") or {})


#: the second of the last event made and its time as API Gateway writes it
_clock: list[Any] = [None, ""]


def http_event(
    method: str,
    path: str,
    *,
    query_string: str = "",
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    source_ip: str = "127.0.0.1",
    raw_body: bool = False,
) -> dict[str, Any]:
    """An API Gateway v2 event for one plain HTTP request, as API Gateway builds it.

    With ``raw_body`` the body stays bytes instead of base64 text (:func:`request_body`
    reads both): what ``lakeshore serve`` uses, since nothing but this module reads it
    and a megabyte of base64 costs milliseconds each way.
    """
    hdrs: dict[str, str] = {}
    for key, value in (headers or {}).items():
        k = key.lower()
        hdrs[k] = f"{hdrs[k]},{value}" if k in hdrs else value
    params: dict[str, str] = {}
    if query_string:
        from urllib.parse import parse_qsl

        for key, value in parse_qsl(query_string, keep_blank_values=True):
            params[key] = f"{params[key]},{value}" if key in params else value
    now = time.time()
    second = int(now)
    if _clock[0] != second:  # (formatting the time is most of a small event's making)
        _clock[:] = [second, time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(second))]
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query_string,
        "headers": hdrs,
        "queryStringParameters": params or None,
        "requestContext": {
            "accountId": "local",
            "apiId": "local",
            "domainName": hdrs.get("host", "localhost"),
            "domainPrefix": "local",
            "http": {
                "method": method.upper(),
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": hdrs.get("user-agent", ""),
            },
            "requestId": f"{_REQUEST_PREFIX}-{next(_REQUESTS)}",
            "routeKey": "$default",
            "stage": "$default",
            "time": _clock[1],
            "timeEpoch": int(now * 1000),
        },
        "body": (body if raw_body else base64.b64encode(body).decode()) if body else None,
        "isBase64Encoded": bool(body) and not raw_body,
        _RAW: raw_body,
    }


def http_response(result: Mapping[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body bytes of a handler's answer."""
    raw = result.get("body") or ""
    if isinstance(raw, memoryview) and isinstance(raw.obj, bytes) and raw.nbytes == len(raw.obj):
        body = raw.obj  # a view of a whole bytes object: that object, not a copy
    elif isinstance(raw, bytearray | memoryview):
        body = bytes(raw)
    elif result.get("isBase64Encoded"):
        body = base64.b64decode(raw)
    else:
        body = str(raw).encode()
    headers: list[tuple[str, str]] = [(k, str(v)) for k, v in (result.get("headers") or {}).items()]
    for key, values in (result.get("multiValueHeaders") or {}).items():
        headers.extend((key, str(v)) for v in values)
    for cookie in result.get("cookies") or []:
        headers.append(("set-cookie", str(cookie)))
    return int(result.get("statusCode", 200)), headers, body
