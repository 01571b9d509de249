"""Order keys: how each queue kind sorts its pending invocations.

The plane computes one sortable string per invocation at submit; stores keep pending
invocations in ascending ``order_key`` and never interpret it. Changing a kind's order
is a change here and nowhere else.
"""

from __future__ import annotations

import itertools
import struct
import threading

__all__ = ["KINDS", "order_key"]

#: queue kinds the plane knows
KINDS = ("fifo", "filo", "priority", "boltzmann")

_MAX64 = (1 << 64) - 1
_MAX32 = (1 << 32) - 1
_seq = itertools.count()
_seq_lock = threading.Lock()


def _next_seq() -> int:
    with _seq_lock:
        return next(_seq) & _MAX32


def _time_key(t: float) -> int:
    return max(0, int(t * 1_000_000))


def _desc_priority(priority: float) -> str:
    """A hex string that sorts higher priorities first (IEEE-754 order trick)."""
    # + 0.0 folds -0.0 into 0.0, so equal priorities stay first-in, first-out
    (bits,) = struct.unpack(">Q", struct.pack(">d", float(priority) + 0.0))
    # map to an unsigned order-preserving integer, then invert for descending
    bits = bits ^ _MAX64 if bits >> 63 else bits | (1 << 63)
    return f"{_MAX64 - bits:016x}"


def order_key(kind: str, priority: float, available_at: float, seq: int | None = None) -> str:
    """The sort key of a pending invocation.

    fifo: oldest ``available_at`` first, then submission order. filo: the reverse.
    priority and boltzmann: highest priority first, then as fifo.
    """
    s = _next_seq() if seq is None else seq
    fifo = f"{_time_key(available_at):016x}{s:08x}"
    if kind == "fifo":
        return fifo
    if kind == "filo":
        return f"{_MAX64 - _time_key(available_at):016x}{_MAX32 - s:08x}"
    if kind in ("priority", "boltzmann"):
        return _desc_priority(priority) + fifo
    raise ValueError(f"unknown queue kind {kind!r}; expected one of {', '.join(KINDS)}")
