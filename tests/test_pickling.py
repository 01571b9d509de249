"""A call's arguments, a function and a result pickle to the bytes ``cloudpickle.dumps``
makes (what a worker of any version loads), with each large bytes-like value in them
copied once, into the pickle: the pickler hands such a value to its file itself, where
``dumps`` copies it into a buffer it grows and shrinks again."""

from __future__ import annotations

import os
import pickle
from typing import Any

import cloudpickle
import pytest

from dreamlake.lakeshore import wire

BIG = os.urandom(300 * 1024)


def _double(x: int) -> int:
    return 2 * x


CASES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((5,), {}),
    (("text", b"bytes", 1.5, None, True), {"k": -3}),
    ((b"x" * (64 * 1024),), {}),
    ((BIG,), {"also": BIG[:100_000]}),
    (("é" * 100_000,), {}),
    ((bytearray(BIG),), {}),
    ((memoryview(BIG)[:70_000].tobytes(), [BIG, {"nested": BIG}]), {}),
    ((lambda v: v + 1, BIG), {"fn": _double}),
]


@pytest.mark.parametrize(("args", "kwargs"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_arguments_pickle_to_the_bytes_cloudpickle_makes(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    made = wire._pickle_args(_double, args, kwargs)
    assert type(made) is bytes
    assert made == cloudpickle.dumps((args, kwargs), protocol=wire.PICKLE_PROTOCOL)
    loaded_args, loaded_kwargs = pickle.loads(made)
    assert len(loaded_args) == len(args) and set(loaded_kwargs) == set(kwargs)


@pytest.mark.parametrize(
    "value", [7, "s", b"b", BIG, bytearray(BIG), {"a": BIG}, _double, lambda: 1]
)
def test_results_and_functions_pickle_to_the_bytes_cloudpickle_makes(value: Any) -> None:
    want = cloudpickle.dumps(value, protocol=wire.PICKLE_PROTOCOL)
    assert wire._dumps(value) == want
    assert wire.pickle_function(value) == want


@pytest.mark.parametrize("args", [(BIG,), (BIG, lambda: 1)], ids=["plain", "by value"])
def test_a_large_argument_reaches_the_pickle_as_itself(
    args: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the pieces the pickler writes hold the argument itself, not a copy of it
    pieces: list[Any] = []

    class Parts(wire._Parts):
        def __init__(self, parts: list[Any]) -> None:
            super().__init__(parts)
            pieces.append(parts)

    monkeypatch.setattr(wire, "_Parts", Parts)
    wire._pickle_args(_double, args, {})
    assert [any(p is BIG for p in parts) for parts in pieces] == [True]


def test_a_buffer_changed_later_in_the_dump_still_pickles_whole() -> None:
    # Given a bytearray argument that a later argument's pickling cuts short
    buf = bytearray(b"x" * 100_000)

    class Cuts:
        def __reduce__(self) -> tuple[Any, ...]:
            del buf[50_000:]
            return (str, ("cut",))

    # When the call's arguments are pickled
    made = wire._pickle_args(_double, (buf, Cuts()), {})
    # Then the pickle loads, with the buffer as it was when it was written
    (first, second), _ = pickle.loads(made)
    assert first == bytearray(b"x" * 100_000) and second == "cut"
