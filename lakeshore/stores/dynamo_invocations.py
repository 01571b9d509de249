"""The invocation primitives of the DynamoDB store, over group items (:mod:`.dynamo_groups`).

Every write of a group is a read-modify-write: the store reads the group item
(strongly consistent), checks each update's ``expect`` and applies its ``changes`` to
the slots in Python, and puts the whole item back conditioned on the revision it read.
A moved revision (another writer) answers with the item as it is now, and the updates
are checked again against it, so each update stays atomic and every decision is still
the plane core's compare-and-set. Payloads and results are written once, before the
group that points at them (a refused write leaves an unreferenced part, deleted by its
TTL). A capped claim moves the queue's running counter in the same transaction. A
claim's leases start from the groups its read of candidates found, not a second read
(:meth:`DynamoInvocations.keep_for_claim`).

Cost (docs/cost.md): a submit of n jobs of one group writes its payload item and the
group (+ a pending and a by-queue index entry); a claim of k of them writes the group
(+ pending and lease entries); their completion writes a result item and the group (+
the lease entry). The by-queue index is keys only, so it is written once per group.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from ..errors import InvalidRequest, Unavailable
from ..plane.ids import group_of
from ..plane.model import Invocation, LogEntry, State
from . import keys as K
from .dynamo_extras import DynamoExtras, backoff, error_code
from .dynamo_groups import (
    GROUP_PREFIX,
    PAYLOAD_TTL,
    RESULT_TTL_SLACK,
    SLOT_FIELDS,
    Group,
    Slot,
    check,
    group_item,
    holds,
    is_part,
    new_tag,
    parse_group,
    part_item,
    record,
    unpack_parts,
)
from .dynamo_items import FIELDS, Item, normal, num, pack

__all__ = ["TRIES", "DynamoInvocations"]

_FIELD_SET = frozenset(FIELDS)
#: attempts at one group write under contention
TRIES = 25
#: ids a handle remembers having marked as having output (then forgets them all)
_LOGGED_MEMORY = 10_000
#: part items kept in memory (they never change): a claim of a group's jobs reads its
#: payload item once
_PART_CACHE = 256
#: the fields kept outside the group's slots (or, for a small error, inside them)
_BULKY = ("payload", "result", "error")


class _Refused(Exception):
    """A capped claim found its queue at the cap."""


class DynamoInvocations(DynamoExtras):
    """Invocations as group items. Mixed into :class:`.dynamo.DynamoStore`."""

    _invocations: str
    _records: str

    def _init_invocations(self) -> None:
        self._logged: set[str] = set()
        self._parts: OrderedDict[str, dict[str, bytes]] = OrderedDict()
        self._parts_lock = threading.Lock()
        #: the groups this thread's last claim read (:meth:`keep_for_claim`)
        self._claim_read = threading.local()

    # --- reads ------------------------------------------------------------------------
    def get(self, inv_id: str) -> Invocation | None:
        g = self._group(group_of(inv_id))
        return None if g is None or inv_id not in g.slots else self._record(g, inv_id)

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        ids = list(dict.fromkeys(ids))
        groups = self._groups(group_of(i) for i in ids)
        out = []
        for inv_id in ids:
            g = groups.get(group_of(inv_id))
            if g is not None and inv_id in g.slots:
                out.append(self._record(g, inv_id))
        return out

    def _group(self, name: str) -> Group | None:
        out = self._ddb.get_item(
            TableName=self._invocations,
            Key={"id": {"S": GROUP_PREFIX + name}},
            ConsistentRead=True,
        )
        return parse_group(out["Item"]) if "Item" in out else None

    def _groups(self, names: Iterable[str]) -> dict[str, Group]:
        """Groups by name (strongly consistent; missing ones left out)."""
        names = list(dict.fromkeys(names))
        if len(names) == 1:
            g = self._group(names[0])
            return {} if g is None else {g.name: g}
        keys = [{"id": {"S": GROUP_PREFIX + n}} for n in names]
        return {g.name: g for g in map(parse_group, self._batch_get(self._invocations, keys))}

    def keep_for_claim(self, groups: Iterable[Group]) -> None:
        """Keep the groups a claim's read of candidates found (this thread's, until its
        next write): the claim's leases start from them instead of reading them again.
        Safe however old they are: every write is conditioned on the revision read, and
        updates they refuse all are judged again on the group as it is now
        (:meth:`_update_group`)."""
        self._claim_read.groups = {g.name: g for g in groups}

    def _taken_from_claim(self, names: Iterable[str]) -> dict[str, Group]:
        kept: dict[str, Group] = self._claim_read.__dict__.pop("groups", {})
        return {n: kept[n] for n in names if n in kept}

    def _record(self, g: Group, sid: str) -> Invocation:
        return record(g, sid, self._fetch_field)

    def _fetch_field(self, key: str, sid: str) -> bytes | None:
        """A payload, result or offloaded error: from a part item or S3."""
        if not is_part(key):
            return self._fetch(key)
        parts = self._part(key)
        return None if parts is None else parts.get(sid)

    def _part(self, key: str) -> dict[str, bytes] | None:
        with self._parts_lock:
            if key in self._parts:
                self._parts.move_to_end(key)
                return self._parts[key]
        out = self._ddb.get_item(
            TableName=self._invocations, Key={"id": {"S": key}}, ConsistentRead=True
        )
        if "Item" not in out:
            return None
        parts = unpack_parts(out["Item"])
        self._keep_part(key, parts)
        return parts

    def _keep_part(self, key: str, parts: dict[str, bytes]) -> None:
        with self._parts_lock:
            self._parts[key] = parts
            while len(self._parts) > _PART_CACHE:
                self._parts.popitem(last=False)

    # --- writes -----------------------------------------------------------------------
    def _write(self, g: Group, delta: int = 0, running_below: int | None = None) -> Group | None:
        """Put ``g`` conditioned on the revision it was read at (absent if new), moving
        the queue's running counter by ``delta`` in the same transaction. Returns None
        when written, else the group as it is now (raises :class:`_Refused` at the cap;
        a group deleted meanwhile comes back empty)."""
        wtok = new_tag()
        put: dict[str, Any] = {
            "TableName": self._invocations,
            "Item": group_item(g, wtok),
            "ExpressionAttributeNames": {"#id": "id"},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if g.rev < 0:
            put["ConditionExpression"] = "attribute_not_exists(#id)"
        else:
            put["ConditionExpression"] = "#rev = :rev"
            put["ExpressionAttributeNames"] = {"#rev": K.REV}
            put["ExpressionAttributeValues"] = {":rev": num(g.rev)}
        counter = self._counter_action(g.queue, delta, running_below)
        for attempt in range(TRIES):
            try:
                if counter is None:
                    self._ddb.put_item(**put)
                else:
                    self._ddb.transact_write_items(TransactItems=[{"Put": put}, counter])
            except ClientError as exc:
                code = error_code(exc)
                if code == "ConditionalCheckFailedException":
                    return self._now_stored(g, exc.response.get("Item"), wtok)
                if code == "TransactionCanceledException":
                    reasons = exc.response.get("CancellationReasons", [])
                    codes = [r.get("Code") for r in reasons]
                    if codes[:1] == ["ConditionalCheckFailed"]:
                        return self._now_stored(g, reasons[0].get("Item"), wtok)
                    if codes[1:2] == ["ConditionalCheckFailed"]:
                        raise _Refused from None
                if code in ("TransactionCanceledException", "TransactionConflictException"):
                    backoff(attempt)
                    continue
                raise
            g.rev += 1
            return None
        raise Unavailable(f"writes to the group of {g.name!r} kept conflicting; try again")

    def _now_stored(self, g: Group, old: Item | None, wtok: str) -> Group | None:
        if old is not None and old.get("wtok", {}).get("S") == wtok:
            g.rev += 1  # our own write, whose answer was lost and retried
            return None
        if old is None:  # deleted meanwhile (or a lost create raced): read it
            now = self._group(g.name)
            return now if now is not None else Group(g.name, g.queue)
        return parse_group(old)

    def _counter_action(
        self, queue: str, delta: int, running_below: int | None
    ) -> dict[str, Any] | None:
        """The transaction's second action on the queue's running counter, if any."""
        if delta == 0:
            return None
        action: dict[str, Any] = {
            "TableName": self._records,
            "Key": K.running_key(queue),
            "UpdateExpression": "ADD #r :d",
            "ExpressionAttributeNames": {"#r": K.REC_RUNNING},
            "ExpressionAttributeValues": {":d": num(delta)},
        }
        if running_below is not None and delta > 0:
            action["ConditionExpression"] = "attribute_not_exists(#r) OR #r < :cap"
            action["ExpressionAttributeValues"][":cap"] = num(running_below - delta + 1)
        return {"Update": action}

    def _put_part(self, prefix: str, group: str, parts: Mapping[str, bytes], ttl: int) -> str:
        item = part_item(prefix, group, parts, ttl)
        self._ddb.put_item(TableName=self._invocations, Item=item)
        key: str = item["id"]["S"]
        self._keep_part(key, dict(parts))
        return key

    def _stored(
        self,
        inv_id: str,
        name: str,
        raw: bytes,
        inline: dict[str, bytes],
        uploads: dict[str, bytes],
    ) -> str | None:
        """Where a payload, result or packed error goes: inline (None: into ``inline``
        for the part item, or the group for an error) or S3 (its key, into ``uploads``)."""
        if len(raw) <= K.INLINE_LIMITS[name]:
            inline[inv_id] = raw
            return None
        key = K.offload_key(inv_id, name, hashlib.sha256(raw).hexdigest())
        uploads[key] = raw
        return key

    # --- insert -----------------------------------------------------------------------
    def insert(self, inv: Invocation) -> Invocation | None:
        return self.insert_many([inv])[0]

    def insert_many(self, invs: Sequence[Invocation]) -> list[Invocation | None]:
        by_group: dict[str, list[int]] = {}
        for n, inv in enumerate(invs):
            by_group.setdefault(group_of(inv.id), []).append(n)
        answers: dict[int, Invocation | None] = {}
        for name, idx in by_group.items():
            answers.update(zip(idx, self._insert_group(name, [invs[n] for n in idx]), strict=True))
        return [answers[n] for n in range(len(invs))]

    def _insert_group(self, name: str, invs: list[Invocation]) -> list[Invocation | None]:
        queue = invs[0].queue
        for inv in invs:
            if inv.queue != queue:
                raise InvalidRequest(f"ids of one group go to one queue ({inv.id!r})")
            check({n: getattr(inv, n) for n in SLOT_FIELDS})
        firsts: dict[str, Invocation] = {}
        for inv in invs:
            firsts.setdefault(inv.id, inv)  # a repeated id is answered with the first
        bulky = self._store_bulky(
            name,
            [(inv.id, {}, {f: getattr(inv, f) for f in _BULKY}) for inv in firsts.values()],
            max(inv.created_at for inv in firsts.values()),
        )
        g: Group | None = Group(name, queue)
        for _ in range(TRIES):
            assert g is not None
            if g.slots and g.queue != queue:
                raise InvalidRequest(f"ids of one group go to one queue ({invs[0].id!r})")
            out: list[Invocation | None] = []
            added = False
            for inv in invs:
                if inv.id in g.slots:
                    out.append(self._record(g, inv.id))
                    continue
                slot = Slot({n: normal(n, getattr(inv, n)) for n in SLOT_FIELDS})
                _apply(slot, {f: getattr(inv, f) for f in _BULKY}, bulky.where.get(inv.id, {}))
                bulky.note_payload(g, slot)
                g.slots[inv.id] = slot
                added = True
                out.append(None)
            if not added:
                self._delete_objects(bulky.objects())
                return out
            g = self._write(g)
            if g is None:
                return out
        raise Unavailable(f"inserts into the group of {name!r} kept conflicting; try again")

    # --- compare-and-set ----------------------------------------------------------------
    def update_if(
        self,
        inv_id: str,
        expect: Mapping[str, Any],
        changes: Mapping[str, Any],
        *,
        running_below: int | None = None,
        deadline_after: float | None = None,
    ) -> Invocation | None:
        return self.update_many_if(
            [(inv_id, expect, changes)], running_below=running_below, deadline_after=deadline_after
        )[0]

    def update_many_if(
        self,
        updates: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
        *,
        running_below: int | None = None,
        deadline_after: float | None = None,
    ) -> list[Invocation | None]:
        for _, expect, changes in updates:
            unknown = (set(expect) | set(changes)) - _FIELD_SET
            if unknown:
                raise ValueError(f"unknown invocation fields: {sorted(unknown)}")
            if "id" in changes or "queue" in changes:
                raise ValueError("an invocation's id and queue never change")
            if {"payload", "result"} & set(expect):
                raise ValueError("payload and result cannot be expected (they are not read)")
            check(changes)
        by_group: dict[str, list[int]] = {}
        for n, (inv_id, _, _) in enumerate(updates):
            by_group.setdefault(group_of(inv_id), []).append(n)
        if running_below is not None:  # each its own transaction with the counter
            chunks = [(group_of(updates[n][0]), [n]) for n in range(len(updates))]
        else:
            chunks = list(by_group.items())
        kept = self._taken_from_claim(by_group)
        unread = [name for name in by_group if name not in kept]
        groups: dict[str, Group | None] = {**(self._groups(unread) if unread else {}), **kept}
        answers: dict[int, Invocation | None] = {}
        for name, idx in chunks:
            if name in groups and groups[name] is None:  # changed by this call: read again
                groups[name] = self._group(name)
            got = self._update_group(
                groups.get(name),
                [updates[n] for n in idx],
                running_below,
                deadline_after,
                kept=kept.pop(name, None) is not None,
            )
            answers.update(zip(idx, got, strict=True))
            if name in groups:
                groups[name] = None  # (each capped update is its own write)
        return [answers[n] for n in range(len(updates))]

    def _update_group(
        self,
        g: Group | None,
        updates: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
        running_below: int | None,
        deadline_after: float | None,
        *,
        kept: bool = False,
    ) -> list[Invocation | None]:
        """Apply the updates of one group (``g`` as read; ``kept``: by the claim's read of
        candidates, which may be old) and put it back conditioned on its revision."""
        if g is None:
            return [None] * len(updates)
        if running_below is not None and running_below <= 0:
            return [None] * len(updates)
        bulky = self._store_bulky(g.name, updates)
        for _ in range(TRIES):
            out: list[str | None] = []
            replaced: list[str] = []
            delta = 0
            for inv_id, expect, changes in updates:
                slot = g.slots.get(inv_id)
                if slot is None or not holds(slot.values, expect, deadline_after):
                    out.append(None)
                    continue
                replaced += _apply(slot, changes, bulky.where.get(inv_id, {}))
                bulky.note_payload(g, slot)
                if running_below is not None and changes.get("state") == State.RUNNING:
                    if not slot.counted:
                        slot.counted, delta = True, delta + 1
                elif slot.counted and _leaves_running(changes):
                    slot.counted, delta = False, delta - 1
                out.append(inv_id)
            if not any(out):
                if kept:  # refused on a read that may be old: judged again on the group now
                    kept, now = False, self._group(g.name)
                    if now is not None:
                        g = now
                        continue
                # Nothing took what was uploaded for them, but an object the group holds
                # stays (a key is the bytes' digest: a repeated result is the stored one)
                held = {k for slot in g.slots.values() for k in slot.objects()}
                self._delete_objects([k for k in bulky.objects() if k not in held])
                return [None] * len(updates)
            self._extend_payloads(g, [sid for sid in out if sid is not None])
            try:
                now_stored = self._write(g, delta, running_below if delta > 0 else None)
            except _Refused:
                return [None] * len(updates)
            if now_stored is None:
                self._delete_objects(replaced)
                return [None if sid is None else self._record(g, sid) for sid in out]
            g = now_stored
        raise Unavailable(f"updates of the group of {g.name!r} kept conflicting; try again")

    def _store_bulky(
        self,
        group: str,
        updates: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
        now: float | None = None,
    ) -> _Bulky:
        """Write the payloads, results and large errors the updates set, once, before
        the group (see :class:`_Bulky`). ``now`` is the plane's time (TTLs count from
        it), if known."""
        where: dict[str, dict[str, str | None]] = {}
        payload_item: tuple[str, int] | None = None
        parts: dict[str, dict[str, bytes]] = {"payload": {}, "result": {}}
        uploads: dict[str, bytes] = {}
        expiry = 0.0
        for inv_id, _, changes in updates:
            for name in ("payload", "result", "error"):
                value = changes.get(name)
                if value is None:
                    continue
                raw = pack(value) if name == "error" else _bytes(value)
                inline: dict[str, bytes] = {}
                key = self._stored(inv_id, name, raw, inline, uploads)
                if name != "error" and key is None:
                    parts[name].update(inline)
                where.setdefault(inv_id, {})[name] = key
            expiry = max(expiry, float(changes.get("expires_at") or 0.0))
        self._upload(uploads)
        now = time.time() if now is None else now
        if parts["payload"]:
            ttl = int(now + PAYLOAD_TTL)
            key = self._put_part("p", group, parts["payload"], ttl)
            payload_item = (key, ttl)
            for inv_id in parts["payload"]:
                where[inv_id]["payload"] = key
        if parts["result"]:
            ttl = int(expiry + RESULT_TTL_SLACK) if expiry else int(now + PAYLOAD_TTL)
            key = self._put_part("r", group, parts["result"], ttl)
            for inv_id in parts["result"]:
                where[inv_id]["result"] = key
        return _Bulky(where, payload_item)

    def _extend_payloads(self, g: Group, changed: list[str]) -> None:
        """A job that finished past its payload item's TTL keeps its payload to its
        expiry: extend the item (rare: a job that ran for over a week)."""
        for sid in changed:
            slot = g.slots[sid]
            expires = slot.values.get("expires_at")
            key = slot.payload_at
            if expires is None or key is None or key not in g.p_until:
                continue
            if g.p_until[key] < expires + RESULT_TTL_SLACK:
                self._extend_part(g, key, int(expires + RESULT_TTL_SLACK))

    def _extend_part(self, g: Group, key: str, ttl: int) -> None:
        try:
            self._ddb.update_item(
                TableName=self._invocations,
                Key={"id": {"S": key}},
                UpdateExpression="SET #t = :t",
                ConditionExpression="attribute_exists(#id)",
                ExpressionAttributeNames={"#t": K.PURGE_AT, "#id": "id"},
                ExpressionAttributeValues={":t": num(ttl)},
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
        g.p_until[key] = max(g.p_until.get(key, 0), ttl)

    # --- output ---------------------------------------------------------------------------
    def append_logs(self, inv_id: str, entries: Sequence[LogEntry]) -> None:
        """Marks the record as having output first (once per handle), so purge deletes
        the output with its payload and result; then stores the entries."""
        if entries and inv_id not in self._logged:
            self._mark_logged(inv_id)
        super().append_logs(inv_id, entries)

    def _mark_logged(self, inv_id: str) -> None:
        g = self._group(group_of(inv_id))
        for _ in range(TRIES):
            if g is None or inv_id not in g.slots or g.slots[inv_id].logged:
                break
            g.slots[inv_id].logged = True
            g = self._write(g)
        if len(self._logged) >= _LOGGED_MEMORY:
            self._logged.clear()
        self._logged.add(inv_id)


@dataclass(frozen=True)
class _Bulky:
    """Where the payloads, results and errors of a write went: ``where`` is id → field →
    key (a payload or result item, or S3; None for an error kept inline), and
    ``payload_item`` the payload item written with its TTL, if one was."""

    where: dict[str, dict[str, str | None]]
    payload_item: tuple[str, int] | None

    def note_payload(self, g: Group, slot: Slot) -> None:
        """A slot that took its payload from the payload item: the group keeps the
        item's TTL (to extend it while the slot needs it)."""
        if self.payload_item is not None and slot.payload_at == self.payload_item[0]:
            g.p_until[self.payload_item[0]] = self.payload_item[1]

    def objects(self) -> list[str]:
        """The S3 objects it uploaded (to delete when nothing took them)."""
        return [k for b in self.where.values() for k in b.values() if k and not is_part(k)]


def _apply(slot: Slot, changes: Mapping[str, Any], where: Mapping[str, str | None]) -> list[str]:
    """Apply ``changes`` to a slot; returns the S3 objects it no longer points at."""
    replaced: list[str] = []
    for name, value in changes.items():
        if name in ("payload", "result"):
            attr = f"{name}_at"
            old = getattr(slot, attr)
            setattr(slot, attr, None if value is None else where.get(name))
        elif name == "error":
            old = slot.error_at
            slot.error_at = None if value is None else where.get("error")
            slot.values["error"] = normal(name, value) if slot.error_at is None else None
        else:
            slot.values[name] = normal(name, value)
            continue
        if old is not None and not is_part(old) and old != getattr(slot, f"{name}_at"):
            replaced.append(old)
    return replaced


def _leaves_running(changes: Mapping[str, Any]) -> bool:
    return "state" in changes and changes["state"] != State.RUNNING


def _bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError("payload and result must be bytes")
    return bytes(value)
