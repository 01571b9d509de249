"""Random bytes for ids and lease tokens: ``os.urandom``'s, read 4 KiB at a time.

Each ``os.urandom`` call lets go of the GIL for its system call. A loop that makes an
id every few calls (``dls.batch()``'s submits, a claim that leases thirty records) then
lets go of the GIL and takes it back many times a millisecond, and CPython forces a
switch only to a thread that waited a whole switch interval (5 ms) *without* the GIL
changing hands: the batch's sender thread waited 250-350 ms for it to open one
connection. Read in blocks, the bytes are the same kernel randomness, and a loop makes
one system call per ~400 ids.

Contract: :func:`random_bytes` is thread-safe, and a child made by ``fork`` never
returns bytes its parent returned or will return (the block is dropped in the child).
In AWS Lambda no block is kept: a function restored from a snapshot (SnapStart) would
replay it in every copy, and a handler makes a few ids a request, not thousands.
"""

from __future__ import annotations

import os
import threading

__all__ = ["random_bytes", "random_hex"]

#: bytes read from the kernel at a time
_BLOCK = 4096
#: keep no block (a Lambda function's memory may be snapshotted and cloned)
_DIRECT = bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))

_lock = threading.Lock()
_block = b""
_at = 0


def random_bytes(n: int) -> bytes:
    """``n`` bytes of ``os.urandom``'s randomness."""
    global _block, _at
    if n > _BLOCK or _DIRECT:
        return os.urandom(n)
    with _lock:
        if _at + n > len(_block):
            _block, _at = os.urandom(_BLOCK), 0
        out = _block[_at : _at + n]
        _at += n
    return out


def random_hex(n: int) -> str:
    """``n`` random bytes as ``2 * n`` hex digits (``secrets.token_hex(n)``'s form)."""
    return random_bytes(n).hex()


def _forget() -> None:
    """In a forked child: its parent's block is its parent's."""
    global _block, _at, _lock
    _lock = threading.Lock()
    _block, _at = b"", 0


os.register_at_fork(after_in_child=_forget)
