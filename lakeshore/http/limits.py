"""The plane's limits, and requests cut to fit them.

Contract: :class:`Limits` holds what ``GET /v1/hello`` said (defaults for anything it
left out or zeroed). :func:`batches` and :func:`size_batches` keep the order of the
items and never yield an empty run; :func:`size_batches` also keeps each run's encoding
within the body limit, except that an item too large on its own still goes, alone (the
plane then refuses it with ``PayloadTooLarge``). :func:`carried` picks the blobs a
submit can carry within the limits, and :func:`carrying_body` encodes such a submit in
parts that leave each blob's bytes where they are.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..wire import pack

__all__ = ["ENVELOPE_ROOM", "Limits", "batches", "carried", "carrying_body", "size_batches"]

#: room left for the pickle envelope around arguments kept inline (the plane's
#: ``inline_payload`` bounds the whole payload; the SDK compares the arguments alone)
ENVELOPE_ROOM = 1024

#: bytes of msgpack around one blob a submit carries (its digest key, the bin header)
_BLOB_ROOM = 80

_T = TypeVar("_T")


@dataclass(frozen=True)
class Limits:
    """The plane's limits, from ``GET /v1/hello`` (these defaults until it answers)."""

    #: bytes of one request body
    max_body: int = 4 * 1024 * 1024
    #: bytes a payload or result may have inline; larger ones travel as blobs
    inline_payload: int = 256 * 1024
    #: items in one batch call
    max_batch: int = 500
    #: seconds one claim or wait may block on the server
    max_wait: float = 20.0
    #: ids in one wait (``max_wait_ids`` if hello names it, else ``max_batch``)
    max_wait_ids: int = 500
    #: bytes of blobs one submit may carry along (0: the plane takes blobs by upload only)
    submit_blobs: int = 0
    #: bytes of one blob the plane takes (0: not said; the plane refuses what it will not
    #: take)
    max_blob: int = 0

    @classmethod
    def from_hello(cls, raw: Any) -> Limits:
        got = raw if isinstance(raw, dict) else {}
        base = cls()
        batch = int(got.get("max_batch") or base.max_batch)
        return cls(
            max_body=int(got.get("max_body") or base.max_body),
            inline_payload=int(got.get("inline_payload") or base.inline_payload),
            max_batch=batch,
            max_wait=float(got.get("max_wait") or base.max_wait),
            max_wait_ids=int(got.get("max_wait_ids") or batch),
            submit_blobs=int(got.get("submit_blobs") or 0),
            max_blob=int(got.get("max_blob") or 0),
        )


def batches(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    """Runs of at most ``size`` items (at least one)."""
    for i in range(0, len(items), max(1, size)):
        yield items[i : i + max(1, size)]


def size_batches(items: Sequence[Any], count: int, max_body: int) -> Iterator[list[Any]]:
    """Items in runs of at most ``count`` whose encoding stays within ``max_body``."""
    budget = max(1, max_body - 1024)  # room for the envelope around the list
    run: list[Any] = []
    size = 0
    for item in items:
        n = len(pack(item))
        if run and (len(run) >= count or size + n > budget):
            yield run
            run, size = [], 0
        run.append(item)
        size += n
    if run:
        yield run


def carried(items_size: int, blobs: Mapping[str, bytes], limits: Limits) -> dict[str, bytes]:
    """The blobs, in order, that a submit whose items encode to ``items_size`` bytes
    can carry: within ``submit_blobs`` and, with the items, within the body limit."""
    room = min(limits.submit_blobs, limits.max_body - 1024 - items_size)
    out: dict[str, bytes] = {}
    for digest, data in blobs.items():
        need = len(data) + _BLOB_ROOM
        if need <= room:
            out[digest] = data
            room -= need
    return out


def carrying_body(items: list[dict[str, Any]], blobs: Mapping[str, bytes]) -> list[bytes]:
    """``{"invocations": items, "blobs": blobs}`` in msgpack, as parts: each blob's bytes
    are a part of their own, after the header that names them, never copied into one
    buffer with the rest (a megabyte copied is a megabyte of fresh memory faulted in)."""
    head = [_MAP2, pack("invocations"), pack(items), pack("blobs"), _map_header(len(blobs))]
    parts: list[bytes] = []
    for digest, data in blobs.items():
        head += [pack(digest), _bin_header(len(data))]
        parts += [b"".join(head), data]
        head = []
    return parts or [b"".join(head)]


#: msgpack: a map of two entries
_MAP2 = b"\x82"


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    return b"\xde" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdf" + n.to_bytes(4, "big")


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return b"\xc4" + n.to_bytes(1, "big")
    return b"\xc5" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xc6" + n.to_bytes(4, "big")
