"""What the DynamoDB store finds through its indexes: claim candidates, lapsed leases,
a queue's counts and listing, and what purge strips or deletes (groups of
:mod:`.dynamo_groups`; reads by id and every write are in :mod:`.dynamo_invocations`).

Index reads are eventually consistent and name groups only; the groups they name are
then read strongly consistent, and the plane core's compare-and-set decides the rest.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from ..plane.ids import GROUP_SIZE, group_of
from ..plane.model import Invocation, State
from . import keys as K
from .dynamo_extras import error_code
from .dynamo_groups import GROUP_PREFIX, PAYLOAD_TTL, Group, is_part, renew_due
from .dynamo_invocations import TRIES, DynamoInvocations
from .dynamo_items import Item, num

__all__ = ["DynamoIndexes"]

#: how often a handle looks for payload items to extend (purge calls it)
_RENEW_EVERY = 3600.0


class DynamoIndexes(DynamoInvocations):
    """Index reads, purge and queue deletion. Mixed into :class:`.dynamo.DynamoStore`."""

    #: when this handle next looks for payload items to extend
    _next_renew = 0.0

    # --- index reads ----------------------------------------------------------------------
    def pending(self, queue: str, now: float, limit: int) -> list[Invocation]:
        if limit <= 0:
            return []
        found: list[tuple[str, str, Group]] = []
        read: list[Group] = []
        entries = heapq.merge(
            *(self._pending_entries(pk, now) for pk in K.pending_pks(queue)),
            key=lambda i: str(i["order_key"]["S"]),
        )
        # a group holds up to GROUP_SIZE candidates: read few groups first, more if needed
        for chunk in _chunks(entries, min(limit, limit // GROUP_SIZE + 2)):
            groups = self._groups(i["id"]["S"][len(GROUP_PREFIX) :] for i in chunk)
            read += groups.values()
            for g in groups.values():
                for sid, slot in g.slots.items():
                    v = slot.values
                    if slot.state is State.PENDING and v["available_at"] <= now:
                        found.append((v["order_key"], sid, g))
            found.sort(key=lambda f: (f[0], f[1]))
            if len(found) >= limit and chunk[-1]["order_key"]["S"] >= found[limit - 1][0]:
                break
        # the leases that follow start from these (none follow when none was found)
        self.keep_for_claim(read if found else ())
        return [self._record(g, sid) for _, sid, g in found[:limit]]

    def _pending_entries(self, pk: str, now: float) -> Iterator[Item]:
        return self._pages(
            self._ddb.query,
            TableName=self._invocations,
            IndexName=K.PENDING_INDEX,
            KeyConditionExpression="#pk = :pk",
            FilterExpression="#av <= :now",
            ExpressionAttributeNames={"#pk": K.PENDING_PK, "#av": "available_at"},
            ExpressionAttributeValues={":pk": {"S": pk}, ":now": num(now)},
            Limit=100,
        )

    def next_available_at(self, queue: str) -> float | None:
        """The earliest time a job of the queue that was scheduled for later comes due
        (the due index holds groups with such jobs only)."""
        earliest: list[float] = []
        for pk in K.pending_pks(queue):
            out = self._ddb.query(
                TableName=self._invocations,
                IndexName=K.DUE_INDEX,
                KeyConditionExpression="#pk = :pk",
                ExpressionAttributeNames={"#pk": K.PENDING_PK},
                ExpressionAttributeValues={":pk": {"S": pk}},
                Limit=1,
            )
            earliest += [float(i[K.DUE_AT]["N"]) for i in out["Items"]]
        return min(earliest, default=None)

    def expired_leases(self, now: float, limit: int) -> list[Invocation]:
        if limit <= 0:
            return []
        names: list[str] = []
        for pk in K.lease_pks():
            items = self._pages(
                self._ddb.query,
                limit=limit,
                TableName=self._invocations,
                IndexName=K.LEASES_INDEX,
                KeyConditionExpression="#pk = :pk AND #exp < :now",
                ExpressionAttributeNames={"#pk": K.LEASE_PK, "#exp": "lease_expires_at"},
                ExpressionAttributeValues={":pk": {"S": pk}, ":now": num(now)},
                Limit=limit,
            )
            names += [i["id"]["S"][len(GROUP_PREFIX) :] for i in items]
        lapsed = [
            (slot.values["lease_expires_at"], sid, g)
            for g in self._groups(names).values()
            for sid, slot in g.slots.items()
            if slot.state is State.RUNNING and slot.values["lease_expires_at"] < now
        ]
        lapsed.sort(key=lambda f: (f[0], f[1]))
        return [self._record(g, sid) for _, sid, g in lapsed[:limit]]

    def counts(self, queue: str, now: float) -> dict[str, int]:
        # Every group of the queue (by-queue index, keys only): the cost grows with the
        # queue's history, a group item per up to 16 jobs.
        tally: Counter[str] = Counter()
        for page in self._queue_groups(queue):
            for g in self._groups(page).values():
                for slot in g.slots.values():
                    v = slot.values
                    state = (
                        State.SCHEDULED
                        if (slot.state is State.PENDING and v["available_at"] > now)
                        else slot.state
                    )
                    tally[state.value] += 1
        return dict(tally)

    def list_invocations(
        self, queue: str, state: str | None, now: float, after: str | None, limit: int
    ) -> list[Invocation]:
        if limit <= 0:
            return []
        start = None if after is None else GROUP_PREFIX + group_of(after)
        found: list[Invocation] = []
        for page in self._queue_groups(queue, start=start, limit=limit):
            groups = self._groups(page)
            for name in page:
                g = groups.get(name)
                if g is None:
                    continue
                for sid in sorted(g.slots):
                    if after is not None and sid <= after:
                        continue
                    rec = self._record(g, sid)
                    if state is None or rec.public_state(now).value == state:
                        found.append(rec)
            if len(found) >= limit:
                break
        return found[:limit]

    def _queue_groups(
        self, queue: str, *, start: str | None = None, limit: int = 100
    ) -> Iterator[list[str]]:
        """Pages of the queue's group names in id order (from group item ``start``)."""
        key = "#q = :q"
        names = {"#q": "queue"}
        values: dict[str, Any] = {":q": {"S": queue}}
        if start is not None:
            key += " AND #id >= :start"
            names["#id"] = "id"
            values[":start"] = {"S": start}
        for page in self._pages(
            self._ddb.query,
            by_page=True,
            TableName=self._invocations,
            IndexName=K.QUEUE_INDEX,
            KeyConditionExpression=key,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            Limit=max(1, min(limit, 100)),
        ):
            yield [i["id"]["S"][len(GROUP_PREFIX) :] for i in page]

    # --- purge and delete -----------------------------------------------------------------
    def purge(self, now: float, tombstone_until: float) -> int:
        touched = 0
        for shard in range(K.EXPIRY_SHARDS):
            strip, bury = K.strip_pk(shard), K.bury_pk(shard)
            for pk in (strip, bury):
                for name in self._expiring(pk, "<", tombstone_until):
                    touched += self._purge_delete(name, tombstone_until)
            for name in self._expiring(strip, "<=", now):
                touched += self._purge_strip(name, now)
        if now >= self._next_renew:
            self._next_renew = now + _RENEW_EVERY
            self._renew_payloads(now)
        return touched

    def _expiring(self, pk: str, op: str, when: float) -> list[str]:
        items = self._pages(
            self._ddb.query,
            TableName=self._invocations,
            IndexName=K.EXPIRY_INDEX,
            KeyConditionExpression=f"#pk = :pk AND #e {op} :t",
            ExpressionAttributeNames={"#pk": K.PURGE_PK, "#e": "expires_at"},
            ExpressionAttributeValues={":pk": {"S": pk}, ":t": num(when)},
        )
        return [i["id"]["S"][len(GROUP_PREFIX) :] for i in items]

    def _purge_delete(self, name: str, tombstone_until: float) -> int:
        """A group past its tombstone whose objects purge must delete: it goes whole."""
        g = self._group(name)
        if g is None or not g.finished() or _latest_expiry(g) >= tombstone_until:
            return 0
        try:
            self._ddb.delete_item(
                TableName=self._invocations,
                Key={"id": {"S": g.key}},
                ConditionExpression="#rev = :rev",
                ExpressionAttributeNames={"#rev": K.REV},
                ExpressionAttributeValues={":rev": num(g.rev)},
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return 0
            raise
        self._delete_objects(k for s in g.slots.values() for k in s.objects())
        self._delete_logs(sid for sid, s in g.slots.items() if s.logged)
        return len(g.slots)

    def _purge_strip(self, name: str, now: float) -> int:
        """An expired group's S3 objects (payload, result) and job output go; TTL deletes
        the rest at its tombstone's end (a group with an error in S3 is deleted by purge
        then, object and all)."""
        g = self._group(name)
        for _ in range(TRIES):
            if g is None or g.stripped or not g.finished() or _latest_expiry(g) > now:
                return 0
            gone = [
                k
                for s in g.slots.values()
                for k in (s.payload_at, s.result_at)
                if k and not is_part(k)
            ]
            for slot in g.slots.values():
                slot.payload_at = None if slot.payload_at in gone else slot.payload_at
                slot.result_at = None if slot.result_at in gone else slot.result_at
            g.stripped = True
            logged = [sid for sid, s in g.slots.items() if s.logged]
            now_stored = self._write(g)
            if now_stored is None:
                self._delete_objects(gone)
                self._delete_logs(logged)
                return len(g.slots)
            g = now_stored
        return 0

    def _renew_payloads(self, now: float) -> None:
        """Extend the payload items of unfinished jobs that would otherwise expire
        (a job pending or running for longer than ``PAYLOAD_TTL``)."""
        names: set[str] = set()
        for spec, _ in self.list_queues():  # type: ignore[attr-defined]
            for pk in K.pending_pks(spec.name):
                names |= self._renewable(K.PENDING_INDEX, K.PENDING_PK, pk, now)
        for pk in K.lease_pks():
            names |= self._renewable(K.LEASES_INDEX, K.LEASE_PK, pk, now)
        for name in names:
            g = self._group(name)
            for _ in range(TRIES):
                due = [] if g is None else renew_due(g, now)
                if g is None or not due:
                    break
                for key in due:
                    self._extend_part(g, key, int(now + PAYLOAD_TTL))
                g = self._write(g)

    def _renewable(self, index: str, pk_attr: str, pk: str, now: float) -> set[str]:
        items = self._pages(
            self._ddb.query,
            TableName=self._invocations,
            IndexName=index,
            KeyConditionExpression="#pk = :pk",
            FilterExpression="#r <= :now",
            ExpressionAttributeNames={"#pk": pk_attr, "#r": K.P_RENEW},
            ExpressionAttributeValues={":pk": {"S": pk}, ":now": num(now)},
        )
        return {i["id"]["S"][len(GROUP_PREFIX) :] for i in items}

    def _delete_invocations(self, queue: str) -> int:
        """Every group of the queue, its part items, S3 objects and job output."""
        gone = 0
        for page in self._queue_groups(queue):
            groups = list(self._groups(page).values())
            keys = {g.key for g in groups}
            for g in groups:
                for s in g.slots.values():
                    keys |= {k for k in (s.payload_at, s.result_at) if k and is_part(k)}
                keys |= set(g.p_until)
            self._delete_items(self._invocations, [{"id": {"S": k}} for k in sorted(keys)])
            self._delete_objects(k for g in groups for s in g.slots.values() for k in s.objects())
            self._delete_logs(sid for g in groups for sid, s in g.slots.items() if s.logged)
            gone += sum(len(g.slots) for g in groups)
        return gone


def _latest_expiry(g: Group) -> float:
    return max((s.values.get("expires_at") or 0.0) for s in g.slots.values())


def _chunks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    """Lists of ``size`` items, then twice as many each time (at most 100: a batch read)."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk
        size = min(size * 2, 100)
