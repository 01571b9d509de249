"""Random bytes for ids and lease tokens (lakeshore/entropy.py): the kernel's, read in
blocks, and never the same in a forked child as in its parent."""

from __future__ import annotations

import os

import pytest

from dreamlake.lakeshore import entropy
from dreamlake.lakeshore.submit import new_id


def test_ids_take_the_kernel_randomness_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = os.urandom

    def urandom(n: int) -> bytes:
        reads.append(n)
        return real(n)

    monkeypatch.setattr(entropy.os, "urandom", urandom)
    monkeypatch.setattr(entropy, "_block", b"")
    # When a thousand ids are made (10 random bytes each)
    ids = {new_id() for _ in range(1000)}
    # Then they are all different, from three reads of the kernel, not a thousand
    assert len(ids) == 1000
    assert reads == [entropy._BLOCK] * 3


def test_random_bytes_are_fresh_across_blocks() -> None:
    seen = [entropy.random_bytes(10) for _ in range(2000)]
    assert all(len(b) == 10 for b in seen) and len(set(seen)) == 2000
    assert len(entropy.random_hex(8)) == 16
    assert len(entropy.random_bytes(entropy._BLOCK + 1)) == entropy._BLOCK + 1


def test_a_forked_child_never_repeats_its_parents_bytes() -> None:
    entropy.random_bytes(1)  # (a block is open in the parent)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next bytes, to the parent
        try:
            os.write(w, entropy.random_bytes(32))
        finally:
            os._exit(0)
    os.close(w)
    child = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    # Then the parent's next bytes are not the child's (the block stayed the parent's)
    assert len(child) == 32 and entropy.random_bytes(32) != child


def test_in_lambda_each_draw_is_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    # (a function restored from a snapshot would replay a kept block in every copy)
    reads: list[int] = []
    real = os.urandom
    monkeypatch.setattr(entropy.os, "urandom", lambda n: reads.append(n) or real(n))
    monkeypatch.setattr(entropy, "_DIRECT", True)
    entropy.random_bytes(10)
    entropy.random_bytes(8)
    assert reads == [10, 8]
