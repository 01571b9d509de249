"""Group items: the DynamoDB store keeps the records of one id group in one item.

Invocation ids of a batch share a group (:mod:`..plane.ids`; any other id is a group of
its own). DynamoDB bills each write of an item per KB of the whole item and each index
entry a write adds, changes or removes, so one item per group — written once for a claim
of the group's jobs and once for their completion — costs a fraction of one item per job
written at each step. The bulky fields are written once, beside it. Three kinds of item
share the invocations table (hash key ``id``):

``g#<group>``
    The group: every record of the group except its payload and result (``slots``,
    msgpack: slot id → a positional list, :data:`SLOT_FIELDS`), a revision (``rev``, +1
    on every write; each write is conditioned on the one it read) and a write tag
    (``wtok``: a write whose answer was lost knows its own), and the index attributes
    derived from the slots (:func:`group_item`): pending ones (queue shard, lowest order
    key, earliest ``available_at``, earliest later-scheduled time), running ones
    (earliest lease expiry), finished ones (expiry, TTL). Only this item is in indexes.
``p#<group>#<tag>``
    The payloads one insert wrote (``parts``: msgpack slot id → bytes), written once,
    deleted by TTL (``purge_at``) after :data:`PAYLOAD_TTL`; the group keeps each payload
    item's TTL (``p_until``) and has it extended while a job that needs it is unfinished
    (:func:`renew_due`) and to the expiry of a job that finishes later.
``r#<group>#<tag>``
    The results one write recorded (``parts``), written once, deleted by TTL after the
    latest expiry among them (the plane hides a result past its expiry anyway).

A payload, result or error over ``keys.INLINE_LIMITS`` goes to S3 (``keys.offload_key``)
and the slot keeps its key. Nothing here talks to AWS.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..plane.ids import group_of
from ..plane.model import FINISHED, Invocation, RetryPolicy, State
from . import keys as K
from .dynamo_items import Item, lazy, normal, num, pack, unpack

__all__ = [
    "GROUP_PREFIX",
    "PAYLOAD_TTL",
    "RENEW_MARGIN",
    "RESULT_TTL_SLACK",
    "SLOT_FIELDS",
    "Group",
    "Slot",
    "check",
    "group_item",
    "group_key",
    "holds",
    "is_part",
    "new_tag",
    "parse_group",
    "part_item",
    "record",
    "renew_at",
    "renew_due",
    "unpack_parts",
]

GROUP_PREFIX = "g#"
PAYLOAD_PREFIX = "p#"
RESULT_PREFIX = "r#"
#: a payload item's lifetime from its write; extended while a job that needs it is
#: unfinished, so a job pending for months keeps its payload
PAYLOAD_TTL = 14 * 86400
#: extend a payload item this long before its TTL (the sweep looks once an hour)
RENEW_MARGIN = 3 * 86400
#: after the latest expiry among a result item's results (TTL's own lag comes on top)
RESULT_TTL_SLACK = 3600

#: the fields of a slot's positional list, in order; then payload_at, result_at,
#: error_at (S3 or part keys) and flags
SLOT_FIELDS = (
    "state",
    "attempt",
    "order_key",
    "priority",
    "available_at",
    "created_at",
    "max_attempts",
    "timeout",
    "retry",
    "request_digest",
    "lease_token",
    "lease_expires_at",
    "worker",
    "started_at",
    "finished_at",
    "expires_at",
    "error",
    "progress",
    "progress_message",
)
_STATES = tuple(State)
_COUNTED = 1
_LOGGED = 2
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_STRINGS = frozenset({"order_key", "request_digest", "lease_token", "worker", "progress_message"})


def group_key(inv_id: str) -> str:
    """The ``id`` of the group item holding ``inv_id``."""
    return GROUP_PREFIX + group_of(inv_id)


def new_tag() -> str:
    return secrets.token_hex(6)


@dataclass
class Slot:
    """One record of a group: its fields (payload and result stay where they are
    stored: ``payload_at``/``result_at``/``error_at`` name a part item or S3 key)."""

    values: dict[str, Any]
    payload_at: str | None = None
    result_at: str | None = None
    error_at: str | None = None
    counted: bool = False
    logged: bool = False

    @property
    def state(self) -> State:
        return State(self.values["state"])

    def objects(self) -> list[str]:
        """The S3 keys this slot holds."""
        keys = (self.payload_at, self.result_at, self.error_at)
        return [k for k in keys if k is not None and _is_s3(k)]


@dataclass
class Group:
    name: str
    queue: str
    slots: dict[str, Slot] = field(default_factory=dict)
    #: revision read (-1: not stored yet)
    rev: int = -1
    wtok: str | None = None
    #: payload item key → its TTL (epoch seconds)
    p_until: dict[str, int] = field(default_factory=dict)
    #: purge has deleted the objects and output of its expired records
    stripped: bool = False

    @property
    def key(self) -> str:
        return GROUP_PREFIX + self.name

    def finished(self) -> bool:
        return all(s.state in FINISHED for s in self.slots.values())


def _is_s3(key: str | None) -> bool:
    return key is not None and key.startswith(K.INV_PREFIX)


# --- encoding -------------------------------------------------------------------------


def _encode_value(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name == "state":
        return _STATES.index(State(value))
    if name == "retry":
        if not isinstance(value, RetryPolicy):
            raise TypeError("retry must be a RetryPolicy")
        return value.to_dict()
    if name == "request_digest" and isinstance(value, str) and _HEX_DIGEST.fullmatch(value):
        return bytes.fromhex(value)  # a sha256: 32 bytes instead of 64 characters
    if name in _STRINGS:
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string")
        if len(value.encode()) > K.INLINE_MAX:
            raise ValueError(f"{name} is over {K.INLINE_MAX} bytes: too large for an item")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"DynamoDB stores finite numbers only, not {value!r}")
    return value


def check(values: Mapping[str, Any]) -> None:
    """Refuse, before any request, field values a group item cannot hold."""
    for name, value in values.items():
        if name in SLOT_FIELDS:
            _encode_value(name, value)


def _decode_value(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name == "state":
        return _STATES[value]
    if name == "retry":
        return RetryPolicy(**value)
    if name == "request_digest" and isinstance(value, bytes):
        return value.hex()
    if name == "error":
        return value  # (msgpack made it: no copy needed)
    return normal(name, value)


def _encode_slot(slot: Slot, ref: Callable[[str | None], int | None]) -> list[Any]:
    flags = (_COUNTED if slot.counted else 0) | (_LOGGED if slot.logged else 0)
    values = [_encode_value(n, slot.values.get(n)) for n in SLOT_FIELDS]
    return [*values, ref(slot.payload_at), ref(slot.result_at), ref(slot.error_at), flags]


def _decode_slot(raw: list[Any], keys: list[str]) -> Slot:
    n = len(SLOT_FIELDS)
    values = {name: _decode_value(name, raw[i]) for i, name in enumerate(SLOT_FIELDS)}
    payload_at, result_at, error_at = (None if r is None else keys[r] for r in raw[n : n + 3])
    return Slot(
        values,
        payload_at=payload_at,
        result_at=result_at,
        error_at=error_at,
        counted=bool(raw[n + 3] & _COUNTED),
        logged=bool(raw[n + 3] & _LOGGED),
    )


def _pack_slots(g: Group) -> bytes:
    """The slots as stored: each under its id less the group's name (``.c``, or empty
    for a group of one), the keys they name listed once (a slot holds their index)."""
    keys: list[str] = []
    index: dict[str, int] = {}

    def ref(key: str | None) -> int | None:
        if key is None:
            return None
        if key not in index:
            index[key] = len(keys)
            keys.append(key)
        return index[key]

    slots = {sid[len(g.name) :]: _encode_slot(slot, ref) for sid, slot in g.slots.items()}
    return pack({"k": keys, "s": slots})


def _unpack_slots(name: str, raw: bytes) -> dict[str, Slot]:
    doc = unpack(raw)
    return {name + suffix: _decode_slot(slot, doc["k"]) for suffix, slot in doc["s"].items()}


def parse_group(item: Item) -> Group:
    """The group a stored item holds."""
    name = item["id"]["S"][len(GROUP_PREFIX) :]
    slots = _unpack_slots(name, item["slots"]["B"])
    p_until = unpack(item["p_until"]["B"]) if "p_until" in item else {}
    return Group(
        name=name,
        queue=item["queue"]["S"],
        slots=slots,
        rev=int(item[K.REV]["N"]),
        wtok=item["wtok"]["S"] if "wtok" in item else None,
        p_until=p_until,
        stripped="stripped" in item,
    )


def group_item(g: Group, wtok: str) -> Item:
    """The item to write for ``g`` (revision ``g.rev + 1``), index attributes derived."""
    slots = g.slots.values()
    item: Item = {
        "id": {"S": g.key},
        "queue": {"S": g.queue},
        K.REV: num(g.rev + 1),
        "wtok": {"S": wtok},
        "slots": {"B": _pack_slots(g)},
    }
    if g.p_until:
        item["p_until"] = {"B": pack(g.p_until)}
    if g.stripped:
        item["stripped"] = {"BOOL": True}
    pending = [s.values for s in slots if s.state is State.PENDING]
    if pending:
        item[K.PENDING_PK] = {"S": K.shard_home(g.queue, g.name)}
        item["order_key"] = {"S": min(v["order_key"] for v in pending)}
        item["available_at"] = num(min(v["available_at"] for v in pending))
        later = [v["available_at"] for v in pending if v["available_at"] > v["created_at"]]
        if later:
            item[K.DUE_AT] = num(min(later))
    leases = [s.values["lease_expires_at"] for s in slots if s.state is State.RUNNING]
    leases = [t for t in leases if t is not None]
    if leases:
        item[K.LEASE_PK] = {"S": K.lease_pk(g.name)}
        item["lease_expires_at"] = num(min(leases))
    renew = renew_at(g)
    if renew is not None:
        item[K.P_RENEW] = num(renew)
    if slots and g.finished():
        expires = max(s.values["expires_at"] or 0.0 for s in slots)
        item[K.PURGE_AT] = num(math.ceil(expires) + K.TTL_AFTER_EXPIRY)
        keeps = any(s.objects() or s.logged for s in slots)
        if keeps and not g.stripped:
            item[K.PURGE_PK] = {"S": K.strip_pk(K.expiry_shard(g.name))}
            item["expires_at"] = num(expires)
        elif g.stripped and any(_is_s3(s.error_at) for s in slots):
            item[K.PURGE_PK] = {"S": K.bury_pk(K.expiry_shard(g.name))}
            item["expires_at"] = num(expires)
    return item


def renew_at(g: Group) -> int | None:
    """When the earliest payload item an unfinished slot needs must be extended."""
    needed = [
        g.p_until[s.payload_at]
        for s in g.slots.values()
        if s.state not in FINISHED and s.payload_at in g.p_until
    ]
    return min(needed) - RENEW_MARGIN if needed else None


def renew_due(g: Group, now: float) -> list[str]:
    """Payload items an unfinished slot needs that expire within the margin."""
    return sorted(
        {
            s.payload_at
            for s in g.slots.values()
            if s.state not in FINISHED
            and s.payload_at in g.p_until
            and g.p_until[s.payload_at] - RENEW_MARGIN <= now
        }
    )


def part_item(prefix: str, group: str, parts: Mapping[str, bytes], ttl: int) -> Item:
    """A payload (``p``) or result (``r``) item: written once, read by key."""
    key = f"{prefix}#{group}#{new_tag()}"
    return {
        "id": {"S": key},
        "parts": {"B": pack(dict(parts))},
        K.PURGE_AT: num(int(ttl)),
    }


# --- records --------------------------------------------------------------------------


def record(g: Group, sid: str, fetch: Callable[[str, str], bytes | None]) -> Invocation:
    """The record of slot ``sid``; payload, result and an offloaded error are read with
    ``fetch(key, sid)`` when first used."""
    s = g.slots[sid]
    values = dict(s.values)
    refs = {
        name: key
        for name, key in (("payload", s.payload_at), ("result", s.result_at), ("error", s.error_at))
        if key is not None
    }
    if s.error_at is not None:
        values["error"] = None
    values.update(id=sid, queue=g.queue, payload=None, result=None)
    return lazy(values, refs, lambda key: fetch(key, sid))


def holds(
    values: Mapping[str, Any], expect: Mapping[str, Any], deadline_after: float | None
) -> bool:
    """Whether a slot holds what ``expect`` says (and its deadline is after the time)."""
    for name, want in expect.items():
        have = values.get(name)
        if normal(name, want) != have:
            return False
    if deadline_after is not None:
        timeout, started = values.get("timeout"), values.get("started_at")
        if timeout is not None and started is not None and started + timeout <= deadline_after:
            return False
    return True


def is_part(key: str) -> bool:
    return key.startswith((PAYLOAD_PREFIX, RESULT_PREFIX))


def unpack_parts(item: Item) -> dict[str, bytes]:
    parts: dict[str, bytes] = unpack(item["parts"]["B"])
    return parts
