"""Values as the DynamoDB store writes and reads them, and records read lazily.

- numbers are ``N`` strings without exponent (``Decimal(repr(x))``), so floats round-trip
  exactly (:func:`num`); documents are msgpack in ``B`` (:func:`pack`);
- :func:`normal` is a field value as a read gives it back;
- :class:`Lazy` is a record whose payload, result or offloaded error is read the first
  time it is used (a claim's update returns records whose payload only the claim reads).

Nothing here talks to AWS: the store sends what these functions build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from decimal import Decimal
from typing import Any

import msgpack

from ..plane.model import Invocation, State

__all__ = ["FIELDS", "Item", "Lazy", "lazy", "normal", "num", "pack", "unpack"]

#: an item or key as the low-level client speaks it: name → AttributeValue
Item = dict[str, Any]

FIELDS = tuple(f.name for f in fields(Invocation))
_INTS = frozenset({"max_attempts", "attempt"})
_FLOATS = frozenset(
    {
        "priority",
        "available_at",
        "created_at",
        "timeout",
        "lease_expires_at",
        "started_at",
        "finished_at",
        "expires_at",
        "progress",
    }
)


def pack(value: Any) -> bytes:
    out: bytes = msgpack.packb(value, use_bin_type=True)
    return out


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def num(x: float) -> dict[str, str]:
    """A DynamoDB number; exact for floats (no exponent: the service normalises)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"not a number: {x!r}")
    if isinstance(x, int):
        return {"N": str(x)}
    d = Decimal(repr(float(x)))
    if not d.is_finite():
        raise ValueError(f"DynamoDB stores finite numbers only, not {x!r}")
    return {"N": format(d, "f")}


def normal(name: str, value: Any) -> Any:
    """A field value as a read gives it back (ints, floats and states normalised)."""
    if value is None:
        return None
    if name == "state":
        return State(value)
    if name == "error":  # the record gets its own copy, as a read would
        return unpack(pack(value))
    if name in _INTS:
        return int(value)
    if name in _FLOATS:
        return float(value)
    return value


class Lazy(Invocation):
    """An invocation with fields not read yet (``_refs``: field → key, read with
    ``_fetch(key)``), each fetched the first time it is read. Compares equal to an
    :class:`Invocation` with the same field values."""

    def _field(self, name: str) -> Any:
        d = self.__dict__
        refs: dict[str, str] | None = d.get("_refs")
        key = refs.get(name) if refs else None
        if key is not None and refs is not None:
            # the ref goes only once the value is there: a concurrent reader fetches too
            raw = d["_fetch"](key)
            d[name] = unpack(raw) if name == "error" and raw is not None else raw
            refs.pop(name, None)
        return d.get(name)

    def _set(self, name: str, value: Any) -> None:
        d = self.__dict__
        refs: dict[str, str] | None = d.get("_refs")
        if refs:
            refs.pop(name, None)
        d[name] = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Invocation):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in FIELDS)

    __hash__ = None  # type: ignore[assignment]


def lazy(values: dict[str, Any], refs: dict[str, str], fetch: Callable[[str], Any]) -> Invocation:
    """A record of ``values``; fields in ``refs`` are read with ``fetch(key)`` on use."""
    if not refs:
        return Invocation(**values)
    rec = Lazy(**values)
    rec.__dict__.update(_refs=refs, _fetch=fetch)
    return rec


def _lazy_property(name: str) -> property:
    def get(self: Lazy) -> Any:
        return self._field(name)

    def put(self: Lazy, value: Any) -> None:
        self._set(name, value)

    return property(get, put)


for _name in FIELDS:
    setattr(Lazy, _name, _lazy_property(_name))
