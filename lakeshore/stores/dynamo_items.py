"""Invocation records ↔ DynamoDB items and the expressions that update them.

The encoding, in one place:

- every :class:`Invocation` field is an attribute of its own name; a ``None`` field is
  an *absent* attribute (written as ``REMOVE``, tested with ``attribute_not_exists``),
  never a NULL value, so sparse indexes and conditions see one encoding;
- numbers are ``N`` strings without exponent (``Decimal(repr(x))``), so floats round-trip
  exactly; ``retry`` and ``error`` are msgpack in ``B``;
- ``payload``, ``result`` and packed ``error`` larger than their ``keys.INLINE_LIMITS``
  live in S3 under a content-addressed key; the item holds the key in ``<field>_ref``;
- ``available_at`` of an invocation inserted due (not after ``created_at``) is kept as
  ``keys.READY_AT``, so it has no entry in the due index; any later write of the field
  uses its own name;
- the derived attributes of :mod:`.keys` (index keys, final state, deadline, TTL) are
  written in the same expression as the fields they derive from.

Nothing here talks to AWS: the store sends what these functions build.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any

import msgpack

from ..plane.model import FINISHED, Invocation, RetryPolicy, State
from . import keys as K

__all__ = [
    "FIELDS",
    "Expr",
    "Item",
    "Plan",
    "condition",
    "holds",
    "invocation",
    "leaves_running",
    "new_item",
    "normal",
    "num",
    "pack",
    "plan_changes",
    "unpack",
]

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
#: started_at stand-in when only a timeout is known: its deadline is long past
_NEVER_STARTED = {"N": "-1000000000000000"}


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


def _raw(name: str, value: Any) -> bytes:
    """The bytes of an offloadable field (payload, result, error)."""
    if name == "error":
        return pack(value)
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"{name} must be bytes")
    return bytes(value)


def _encode(name: str, value: Any) -> dict[str, Any]:
    if name in _INTS:
        return num(int(value))
    if name in _FLOATS:
        return num(float(value))
    if name in ("payload", "result"):
        return {"B": _raw(name, value)}
    if name == "retry":
        if not isinstance(value, RetryPolicy):
            raise TypeError("retry must be a RetryPolicy")
        return {"B": pack(value.to_dict())}
    if name == "error":
        return {"B": pack(value)}
    if name == "state":
        return {"S": State(value).value}
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string")
    if len(value.encode()) > K.INLINE_MAX:
        raise ValueError(f"{name} is over {K.INLINE_MAX} bytes: too large for an item")
    return {"S": value}


def _decode(name: str, av: dict[str, Any]) -> Any:
    if name in _INTS:
        return int(av["N"])
    if name in _FLOATS:
        return float(av["N"])
    if name in ("payload", "result"):
        return bytes(av["B"])
    if name == "retry":
        return RetryPolicy(**unpack(av["B"]))
    if name == "error":
        return unpack(av["B"])
    if name == "state":
        return State(av["S"])
    return av["S"]


def _stored(inv_id: str, name: str, value: Any) -> tuple[str, dict[str, Any], bytes | None]:
    """(attribute, value, bytes to upload) for a non-None offloadable field."""
    raw = _raw(name, value)
    if len(raw) <= K.INLINE_LIMITS[name]:
        return name, {"B": raw}, None
    key = K.offload_key(inv_id, name, hashlib.sha256(raw).hexdigest())
    return K.OFFLOAD_REFS[name], {"S": key}, raw


# --- records ------------------------------------------------------------------------------


class _Lazy(Invocation):
    """An invocation with fields not read yet, each fetched the first time it is read:
    offloaded ones (``_refs``: field → S3 key, read with ``_fetch``) and, for a
    candidate read from an index that projects only some attributes, every field the
    index does not carry (``_unknown``, filled from one read of the item, ``_load``).

    ``pending()`` candidates and the records an update returns rarely need their
    payload, so nothing is fetched unless it is used. Compares equal to an
    :class:`Invocation` with the same field values.
    """

    def _field(self, name: str) -> Any:
        d = self.__dict__
        if name in d.get("_unknown", ()):
            self._load_rest()
        refs: dict[str, str] | None = d.get("_refs")
        key = refs.get(name) if refs else None
        if key is not None and refs is not None:
            # the ref goes only once the value is there: a concurrent reader fetches too
            raw = d["_fetch"](key)
            d[name] = unpack(raw) if name == "error" and raw is not None else raw
            refs.pop(name, None)
        return d.get(name)

    def _load_rest(self) -> None:
        """The fields the index did not carry, from the item as it is now (all None if
        it is gone: a candidate that vanished is not claimed anyway)."""
        d = self.__dict__
        item = d["_load"]()
        values, refs = _fields(item or {})
        for name in d.pop("_unknown", ()):
            if name in refs:
                d.setdefault("_refs", {})[name] = refs[name]
            d[name] = values[name]

    def _set(self, name: str, value: Any) -> None:
        d = self.__dict__
        refs: dict[str, str] | None = d.get("_refs")
        if refs:
            refs.pop(name, None)
        d.get("_unknown", set()).discard(name)
        d[name] = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Invocation):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in FIELDS)

    __hash__ = None  # type: ignore[assignment]


def _lazy_property(name: str) -> property:
    def get(self: _Lazy) -> Any:
        return self._field(name)

    def put(self: _Lazy, value: Any) -> None:
        self._set(name, value)

    return property(get, put)


for _name in FIELDS:
    setattr(_Lazy, _name, _lazy_property(_name))


def _attr(item: Item, name: str) -> dict[str, Any] | None:
    """The attribute holding field ``name`` (``available_at`` may be READY_AT)."""
    av: dict[str, Any] | None = item.get(name)
    if av is None and name == "available_at":
        av = item.get(K.READY_AT)
    return av


def _fields(item: Item) -> tuple[dict[str, Any], dict[str, str]]:
    """The field values an item holds (offloaded ones None) and its S3 keys by field."""
    values: dict[str, Any] = {}
    for name in FIELDS:
        av = _attr(item, name)
        values[name] = None if av is None else _decode(name, av)
    refs = {f: item[ref]["S"] for f, ref in K.OFFLOAD_REFS.items() if ref in item}
    return values, refs


def invocation(
    item: Item,
    fetch: Callable[[str], bytes | None],
    *,
    carried: frozenset[str] | None = None,
    load: Callable[[], Item | None] | None = None,
) -> Invocation:
    """The record an item holds; offloaded fields are fetched with ``fetch(key)`` on use.

    ``carried``: the item is an index entry with only these attributes (None: all of
    them); every other field is read with ``load()`` (the whole item) when first used.
    """
    values, refs = _fields(item)
    unknown: set[str] = set()
    if carried is not None:
        if load is None:
            raise ValueError("an index entry's record needs load() for the rest")
        unknown = {n for n in FIELDS if not _carries(carried, n)}
    if not refs and not unknown:
        return Invocation(**values)
    rec = _Lazy(**values)
    rec.__dict__.update(_refs=refs, _fetch=fetch, _unknown=unknown, _load=load)
    return rec


def _carries(carried: frozenset[str], name: str) -> bool:
    """Whether an index entry with attributes ``carried`` holds field ``name``."""
    if name == "available_at":
        return name in carried and K.READY_AT in carried
    if name in K.OFFLOAD_REFS:
        return name in carried and K.OFFLOAD_REFS[name] in carried
    return name in carried


def new_item(inv: Invocation) -> tuple[Item, dict[str, bytes]]:
    """The item of a new record, and the offloaded bytes to upload first (key → bytes)."""
    item: Item = {}
    uploads: dict[str, bytes] = {}
    for name in FIELDS:
        value = getattr(inv, name)
        if value is None:
            continue
        if name in K.OFFLOAD_REFS:
            attr, av, raw = _stored(inv.id, name, value)
            item[attr] = av
            if raw is not None:
                uploads[av["S"]] = raw
        elif name == "available_at" and not value > inv.created_at:
            item[K.READY_AT] = _encode(name, value)  # due on arrival: no due-index entry
        else:
            item[name] = _encode(name, value)
    home = K.shard_home(inv.queue, inv.id)
    item[K.SHARD_HOME] = {"S": home}
    item[K.REV] = {"N": "0"}
    if inv.state is State.PENDING:
        item[K.PENDING_PK] = {"S": home}
    elif inv.state is State.RUNNING:
        item[K.LEASE_PK] = {"S": K.lease_pk(inv.id)}
    elif inv.state in FINISHED:
        item[K.FINAL] = {"S": inv.state.value}
    if inv.expires_at is not None:
        item[K.PURGE_AT] = num(int(inv.expires_at + K.TTL_AFTER_EXPIRY))
        if uploads:  # objects in S3: purge must delete them (TTL deletes the rest)
            item[K.PURGE_PK] = {"S": K.strip_pk(K.expiry_shard(inv.id))}
    if inv.started_at is not None and inv.timeout is not None:
        item[K.DEADLINE] = _sum(num(inv.started_at), num(inv.timeout))
    return item, uploads


def _sum(a: dict[str, str], b: dict[str, str]) -> dict[str, str]:
    """Decimal addition, as DynamoDB's own ``SET x = a + b`` computes it."""
    return {"N": format(Decimal(a["N"]) + Decimal(b["N"]), "f")}


# --- expressions --------------------------------------------------------------------------


class Expr:
    """Placeholders for one request's expressions (every name is a placeholder, so
    reserved words never matter)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def n(self, attr: str) -> str:
        for ph, name in self.names.items():
            if name == attr:
                return ph
        ph = f"#n{len(self.names)}"
        self.names[ph] = attr
        return ph

    def v(self, av: dict[str, Any]) -> str:
        ph = f":v{len(self.values)}"
        self.values[ph] = av
        return ph

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ExpressionAttributeNames": self.names}
        if self.values:
            out["ExpressionAttributeValues"] = self.values
        return out


def condition(
    x: Expr, inv_id: str, expect: Mapping[str, Any], deadline_after: float | None
) -> list[str]:
    """The clauses of an update's condition: the record exists and ``expect`` holds."""
    parts = [f"attribute_exists({x.n('id')})"]
    for name, value in expect.items():
        if value is None:
            parts.append(f"attribute_not_exists({x.n(name)})")
            if name in K.OFFLOAD_REFS:
                parts.append(f"attribute_not_exists({x.n(K.OFFLOAD_REFS[name])})")
        elif name in K.OFFLOAD_REFS:
            attr, av, _ = _stored(inv_id, name, value)
            parts.append(f"{x.n(attr)} = {x.v(av)}")
        elif name == "available_at":
            v = x.v(_encode(name, value))
            parts.append(f"({x.n(name)} = {v} OR {x.n(K.READY_AT)} = {v})")
        else:
            parts.append(f"{x.n(name)} = {x.v(_encode(name, value))}")
    if deadline_after is not None:
        parts.append(
            f"(attribute_not_exists({x.n('timeout')})"
            f" OR {x.n(K.DEADLINE)} > {x.v(num(deadline_after))})"
        )
    return parts


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    if a is None:
        return False
    if "N" in a and "N" in b:
        return Decimal(a["N"]) == Decimal(b["N"])
    return a == b


def holds(item: Item, inv_id: str, expect: Mapping[str, Any], deadline_after: float | None) -> bool:
    """Whether :func:`condition` holds for ``item``, evaluated here as DynamoDB would."""
    for name, value in expect.items():
        if value is None:
            if name in item or K.OFFLOAD_REFS.get(name, name) in item:
                return False
        elif name in K.OFFLOAD_REFS:
            attr, av, _ = _stored(inv_id, name, value)
            if item.get(attr) != av:
                return False
        elif not _same(_attr(item, name), _encode(name, value)):
            return False
    if deadline_after is not None and "timeout" in item:
        deadline = item.get(K.DEADLINE)
        if deadline is None or not Decimal(deadline["N"]) > Decimal(num(deadline_after)["N"]):
            return False
    return True


def leaves_running(changes: Mapping[str, Any]) -> bool:
    return "state" in changes and State(changes["state"]) is not State.RUNNING


@dataclass
class Plan:
    """An update: SET and REMOVE clauses, and what to upload to S3 before sending it."""

    sets: list[str] = field(default_factory=list)
    removes: list[str] = field(default_factory=list)
    uploads: dict[str, bytes] = field(default_factory=dict)
    #: offloadable field → the S3 key it will hold (None: inline or absent)
    refs: dict[str, str | None] = field(default_factory=dict)

    def expression(self, x: Expr) -> str:
        parts = [f"ADD {x.n(K.REV)} {x.v({'N': '1'})}"]
        if self.sets:
            parts.append("SET " + ", ".join(self.sets))
        if self.removes:
            parts.append("REMOVE " + ", ".join(dict.fromkeys(self.removes)))
        return " ".join(parts)


def plan_changes(x: Expr, inv_id: str, changes: Mapping[str, Any]) -> Plan:
    """SET/REMOVE for ``changes``, with every derived attribute kept in step."""
    p = Plan()
    for name, value in changes.items():
        if name in K.OFFLOAD_REFS:
            ref = K.OFFLOAD_REFS[name]
            if value is None:
                p.removes += [x.n(name), x.n(ref)]
                p.refs[name] = None
                continue
            attr, av, raw = _stored(inv_id, name, value)
            p.sets.append(f"{x.n(attr)} = {x.v(av)}")
            p.removes.append(x.n(ref if attr == name else name))
            p.refs[name] = None if raw is None else av["S"]
            if raw is not None:
                p.uploads[av["S"]] = raw
        elif value is None:
            p.removes.append(x.n(name))
        else:
            p.sets.append(f"{x.n(name)} = {x.v(_encode(name, value))}")
            if name == "available_at":
                p.removes.append(x.n(K.READY_AT))
    if "state" in changes:
        state = State(changes["state"])
        if state is State.PENDING:
            p.sets.append(f"{x.n(K.PENDING_PK)} = {x.n(K.SHARD_HOME)}")
            p.removes.append(x.n(K.LEASE_PK))
        elif state is State.RUNNING:
            p.sets.append(f"{x.n(K.LEASE_PK)} = {x.v({'S': K.lease_pk(inv_id)})}")
            p.removes.append(x.n(K.PENDING_PK))
        else:
            p.removes += [x.n(K.PENDING_PK), x.n(K.LEASE_PK)]
        if state in FINISHED:
            p.sets.append(f"{x.n(K.FINAL)} = {x.v({'S': state.value})}")
        else:
            p.removes.append(x.n(K.FINAL))
    strip = {"S": K.strip_pk(K.expiry_shard(inv_id))}
    expires = changes.get("expires_at")
    clearing = "expires_at" in changes and expires is None
    if clearing:
        p.removes += [x.n(K.PURGE_PK), x.n(K.PURGE_AT)]
    elif expires is not None:
        ttl = num(int(expires + K.TTL_AFTER_EXPIRY))
        p.sets.append(f"{x.n(K.PURGE_AT)} = {x.v(ttl)}")
    if p.uploads and not clearing:
        # an object in S3: purge must delete it (the expiry index finds the record once
        # it has expires_at); a record without objects is left to TTL. Objects the
        # record already holds are the store's to check (DynamoStore._purge_later).
        p.sets.append(f"{x.n(K.PURGE_PK)} = {x.v(strip)}")
    _plan_deadline(x, changes, p)
    return p


def _plan_deadline(x: Expr, changes: Mapping[str, Any], p: Plan) -> None:
    """DEADLINE = started_at + timeout, computed by DynamoDB when one side is stored."""
    if "started_at" not in changes and "timeout" not in changes:
        return
    deadline = x.n(K.DEADLINE)
    started: Any = changes.get("started_at")
    timeout: Any = changes.get("timeout")
    if ("started_at" in changes and started is None) or ("timeout" in changes and timeout is None):
        p.removes.append(deadline)
    elif started is not None and timeout is not None:
        p.sets.append(f"{deadline} = {x.v(_sum(num(started), num(timeout)))}")
    elif started is not None:
        # no timeout stored: the deadline is never consulted (the condition checks timeout)
        zero = x.v({"N": "0"})
        p.sets.append(f"{deadline} = {x.v(num(started))} + if_not_exists({x.n('timeout')}, {zero})")
    else:
        never = x.v(_NEVER_STARTED)
        p.sets.append(
            f"{deadline} = if_not_exists({x.n('started_at')}, {never}) + {x.v(num(timeout))}"
        )
