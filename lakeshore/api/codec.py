"""Bodies on the wire: msgpack (the SDK) or JSON (curl), and request validation.

Requests are decoded by their ``Content-Type``; answers are encoded in the type the
``Accept`` header names, else the request's, else JSON. In JSON, binary values travel
as base64 strings. :func:`fields` checks a request map against a small schema, so an
unknown field or a wrong type is a 400 with a one-line reason.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import msgpack

from ..errors import InvalidRequest, LakeshoreError, PayloadTooLarge, UnsupportedMediaType

__all__ = [
    "JSON",
    "MSGPACK",
    "NUM",
    "OPT_NUM",
    "as_bytes",
    "decode_body",
    "encode_body",
    "error_view",
    "reason",
    "fields",
    "is_msgpack",
    "pick_type",
]

#: a number field (bool excluded by the check), and one that may be null
NUM = (int, float)
OPT_NUM = (int, float, type(None))

MSGPACK = "application/msgpack"
JSON = "application/json"
_MAX_DEPTH = 32


def _media(value: str | None) -> str:
    return (value or "").split(";")[0].strip().lower()


#: the media types of a msgpack body
_MSGPACKS = frozenset({MSGPACK, "application/x-msgpack"})


def is_msgpack(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` (or ``Accept`` entry) names msgpack."""
    return _media(content_type) in _MSGPACKS


@functools.lru_cache(maxsize=256)
def pick_type(content_type: str | None, accept: str | None) -> str:
    """The content type of the answer."""
    for candidate in (accept or "").split(","):
        if is_msgpack(candidate):
            return MSGPACK
        if _media(candidate) == JSON:
            return JSON
    return MSGPACK if is_msgpack(content_type) else JSON


_INT_LIMIT = 2**63


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest("strings must be valid Unicode (no lone surrogates)") from None


def _check(value: Any, texts: bool, level: int = 0) -> None:
    """Reject what no store can hold: deep nesting, non-string keys, integers past 64
    bits, non-finite floats and (``texts``: a JSON body; msgpack's UTF-8 decoding
    refuses them already) strings with lone surrogates. ``value`` is a map or a list."""
    if level >= _MAX_DEPTH and (level > _MAX_DEPTH or value):  # (its items are one deeper)
        raise InvalidRequest(f"body nests deeper than {_MAX_DEPTH} levels")
    if type(value) is dict:
        for k in value:
            if type(k) is not str:
                raise InvalidRequest("map keys must be strings")
            if texts:
                _check_text(k)
        items: Any = value.values()
    else:
        items = value
    for v in items:
        t = type(v)
        if t is dict or t is list:
            _check(v, texts, level + 1)
        elif t is str:
            if texts:
                _check_text(v)
        elif t is int:
            if not -_INT_LIMIT < v < _INT_LIMIT:
                raise InvalidRequest("integers must fit in 64 bits")
        elif t is float and not math.isfinite(v):
            raise InvalidRequest("numbers must be finite")


def decode_body(body: bytes, content_type: str | None, max_body: int) -> dict[str, Any]:
    """The request body as a map; an empty body is an empty map."""
    if len(body) > max_body:
        raise PayloadTooLarge(f"body of {len(body)} bytes is over the {max_body} byte limit")
    if not body:
        return {}
    media = _media(content_type)
    try:
        if media in _MSGPACKS:
            value = msgpack.unpackb(body, raw=False, strict_map_key=True)
        elif media in (JSON, ""):
            value = json.loads(body)
        else:
            raise UnsupportedMediaType(
                f"content type {media!r}: send application/msgpack or application/json "
                "(with curl: -H 'Content-Type: application/json')"
            )
    except UnicodeDecodeError as exc:  # (JSON: UTF-8, or UTF-16/32 told by its first bytes)
        where = f"byte 0x{exc.object[exc.start : exc.start + 1].hex()} at offset {exc.start}"
        encoding = exc.encoding.upper()
        if media in _MSGPACKS:  # (in one of its strings)
            raise InvalidRequest(f"malformed body: a string is not UTF-8 ({where} in it)") from None
        if encoding == "UTF-8":
            raise InvalidRequest(
                f"malformed body: JSON text must be UTF-8 ({where} is not)"
            ) from None
        raise InvalidRequest(
            f"malformed body: not {encoding} text ({where}: {exc.reason}); send UTF-8 JSON"
        ) from None
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        why = str(exc)
        if media not in (JSON, "") and (not why or "exceeds max_" in why):
            # (msgpack says nothing of a bad first byte, and a cut-off array or map
            # reads as one longer than the body)
            why = "not valid msgpack, or cut short" + (f" ({why})" if why else "")
        raise InvalidRequest(f"malformed body: {why}") from None
    except RecursionError:
        raise InvalidRequest("body nests too deeply") from None
    if not isinstance(value, dict):
        raise InvalidRequest("body must be a map")
    _check(value, texts=media not in _MSGPACKS)
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def encode_body(value: Mapping[str, Any], media: str) -> bytes:
    if media == MSGPACK:
        out: bytes = msgpack.packb(value, use_bin_type=True)
        return out
    return json.dumps(_jsonable(value), separators=(",", ":")).encode()


def as_bytes(value: Any, name: str) -> bytes:
    """A binary field: bytes in msgpack, a base64 string in JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{name} must be bytes (base64 in JSON)") from None
    raise InvalidRequest(f"{name} must be bytes (base64 in JSON)")


def fields(
    body: Mapping[str, Any],
    schema: Mapping[str, type | tuple[type, ...]],
    *,
    required: tuple[str, ...] = (),
    where: str = "body",
) -> dict[str, Any]:
    """Check ``body`` against ``schema`` (field → accepted types; ``None`` allowed as
    ``type(None)``). Unknown fields, missing required ones and wrong types raise."""
    unknown = set(body) - set(schema)
    if unknown:
        raise InvalidRequest(f"unknown field(s) in {where}: {', '.join(sorted(unknown))}")
    for name in required:
        if name not in body or body[name] is None:
            raise InvalidRequest(f"{where} needs {name!r}")
    for name, value in body.items():
        types = schema[name]
        accepted = types if isinstance(types, tuple) else (types,)
        if float in accepted and isinstance(value, int) and not isinstance(value, bool):
            continue
        if isinstance(value, bool) and bool not in accepted:
            raise InvalidRequest(f"{where}.{name} has the wrong type (bool)")
        if not isinstance(value, accepted):
            wanted = "/".join(t.__name__ for t in accepted)
            raise InvalidRequest(f"{where}.{name} must be {wanted}, not {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"{where}.{name} must be a finite number")
    return dict(body)


def error_view(exc: Exception) -> dict[str, str]:
    """An item's refusal as a batch answer carries it: its code and one-line reason."""
    code = exc.code if isinstance(exc, LakeshoreError) else "internal"
    return {"code": code, "message": reason(exc)}


#: characters past which a name quoted in a reason is cut: longer than any valid name (a
#: queue's is at most 256), so only one that is refused for its length, or names
#: nothing, is
_LONGEST = 256
#: a quoted name past that, and any other run of characters past it with nothing between
_LONG_QUOTED = re.compile(r"(['\"])([^'\"\s]{" + str(_LONGEST + 1) + r",})\1")
_LONG_RUN = re.compile(r"\S{" + str(_LONGEST + 64) + ",}")
#: characters of a cut name kept
_KEPT = 60


def reason(exc: Exception) -> str:
    """The one line an error answer says: the message's first line (the code's name for
    an empty one), a name over 256 characters quoted in it (a 5,000-character id that
    names nothing, quoted back) cut to its first 60 and its length."""
    text = str(exc)
    line = text.splitlines()[0] if text.strip() else getattr(exc, "code", "error")
    line = _LONG_QUOTED.sub(
        lambda m: f"{m[1]}{m[2][:_KEPT]}…{m[1]} ({len(m[2]):,} characters)", line
    )
    return _LONG_RUN.sub(lambda m: f"{m[0][:_KEPT]}… ({len(m[0]):,} characters)", line)
