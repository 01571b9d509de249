"""What an answer of the plane means: its body as a map, its failure as an exception.

Contract:

- :func:`decode_map` reads a msgpack or JSON body (an empty body is ``{}``) and raises
  :class:`LakeshoreError` for anything that is not a map.
- :func:`error_of` turns an error answer into an exception of the one tree: by the wire
  code of its ``{"error": {...}}`` body, else by its status (a proxy's or gateway's
  answer carries no such body). It never raises itself.
- :func:`retry_after` and :func:`date_offset` read the ``Retry-After`` and ``Date``
  headers, and read anything malformed as zero.
"""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime
from typing import Any

import msgpack

from ..errors import (
    Conflict,
    ExpiredInvocation,
    Forbidden,
    InvalidRequest,
    LakeshoreError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    Throttled,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    from_wire,
)
from .connections import Answer

__all__ = ["date_offset", "decode_map", "error_of", "expect_ok", "retry_after"]

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


def _decode(answer: Answer) -> Any:
    media = answer.headers.get("content-type", "").split(";")[0].strip().lower()
    if not answer.body:
        return {}
    if media == "application/json":
        return json.loads(answer.body)
    return msgpack.unpackb(answer.body, raw=False)


def decode_map(answer: Answer) -> dict[str, Any]:
    try:
        obj = _decode(answer)
    except Exception as exc:
        raise LakeshoreError(f"the plane answered a malformed body: {exc}") from None
    if not isinstance(obj, dict):
        raise LakeshoreError("the plane answered something other than a map")
    return obj


def error_of(answer: Answer) -> LakeshoreError:
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


def expect_ok(answer: Answer) -> Answer:
    """The answer itself when it is a 2xx; raises the error it stands for otherwise."""
    if not 200 <= answer.status < 300:
        raise error_of(answer)
    return answer


def _http_date(value: str) -> float | None:
    """The time an HTTP date names (seconds since the epoch), or None if it names none."""
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def retry_after(answer: Answer) -> float:
    """Seconds the ``Retry-After`` header asks for (seconds or a date), at most 60."""
    value = answer.headers.get("retry-after")
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        at = _http_date(value)
        if at is None:
            return 0.0
        seconds = at - time.time()
    return min(max(0.0, seconds), _MAX_RETRY_AFTER)


def date_offset(value: str | None, middle: float) -> float:
    """The clock offset a ``Date`` header tells, when it is more than its resolution."""
    if not value:
        return 0.0
    at = _http_date(value)
    if at is None:
        return 0.0
    offset = at + 0.5 - middle
    return offset if abs(offset) > 1.0 else 0.0
