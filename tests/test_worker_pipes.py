"""The pipe between a process worker and its job processes (worker/pipes.py), and the
plain-value pickling shortcut (wire.py): both must behave exactly as what they replace."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import cloudpickle
import pytest

from dreamlake.lakeshore.plane.model import Claim
from dreamlake.lakeshore.wire import PICKLE_PROTOCOL, _dumps, _pickle_args
from dreamlake.lakeshore.worker.execute import Outcome
from dreamlake.lakeshore.worker.pipes import Pipe, wait


def test_ready_says_whether_a_message_waits_and_messages_arrive_whole() -> None:
    a, b = multiprocessing.Pipe()
    ours, theirs = Pipe(a), Pipe(b)
    # Given nothing sent, nothing is ready
    assert not ours.ready()
    claim = Claim("i", "q", b"\x00" * 100, "t", lease_expires_at=1.0, attempt=1, timeout=None)
    # When two messages are sent, each is read whole, in order, and then none is left
    theirs.send(("run", claim, {"d": b"body"}, False))
    theirs.send(("done", "i", Outcome(ok=True, result=b"r"), 1.0, False, None))
    assert ours.ready()
    assert ours.recv() == ("run", claim, {"d": b"body"}, False)
    assert ours.ready()
    assert ours.recv() == ("done", "i", Outcome(ok=True, result=b"r"), 1.0, False, None)
    assert not ours.ready()


def test_a_pipe_reads_and_writes_what_a_bare_connection_does() -> None:
    # (a job process of an older worker, or a test's bare end, may sit at the other end)
    a, b = multiprocessing.Pipe()
    ours = Pipe(a)
    b.send(("skip", "i"))
    assert ours.recv() == ("skip", "i")
    ours.send(("skipped", "i"))
    assert b.recv() == ("skipped", "i")


def test_a_closed_other_end_is_ready_and_its_read_says_so() -> None:
    a, b = multiprocessing.Pipe()
    ours = Pipe(a)
    b.close()
    assert ours.ready()
    with pytest.raises(EOFError):
        ours.recv()


def test_ready_on_a_closed_end_raises_as_a_connection_does() -> None:
    a, _b = multiprocessing.Pipe()
    ours = Pipe(a)
    ours.close()
    with pytest.raises(OSError):
        ours.ready()


def test_wait_returns_the_readable_pipes_and_descriptors() -> None:
    a, b = multiprocessing.Pipe()
    c, d = multiprocessing.Pipe()
    p, q = Pipe(a), Pipe(c)
    r, w = os.pipe()
    try:
        # Given nothing readable, a zero wait returns nothing
        assert wait([p, q, r], 0) == []
        # When one pipe has a message and a descriptor's other end closes (a process's
        # sentinel does so when it ends), those two come back, as the objects given
        Pipe(d).send(("done",))
        os.close(w)
        assert set(map(id, wait([p, q, r], 1.0))) == {id(q), id(r)}
        assert p.fileno() == a.fileno()
    finally:
        os.close(r)
        b.close()


@pytest.mark.parametrize(
    "value", [0, -7, 2**100, 1.5, float("inf"), "", "text", b"\x00bytes", True, None]
)
def test_a_plain_value_pickles_to_cloudpickles_bytes(value: object) -> None:
    assert _dumps(value) == cloudpickle.dumps(value, protocol=PICKLE_PROTOCOL)


def test_plain_arguments_pickle_to_cloudpickles_bytes_and_others_still_go_by_value() -> None:
    def fn(*args: object, **kwargs: object) -> None: ...

    args, kwargs = (1, "a", b"b", 2.5, None), {"k": True}
    assert _pickle_args(fn, args, kwargs) == cloudpickle.dumps(
        (args, kwargs), protocol=PICKLE_PROTOCOL
    )
    # A function defined here goes by value, which plain pickle cannot do
    local = (lambda x: x + 1,)
    loaded_args, _ = pickle.loads(_pickle_args(fn, local, {}))
    assert loaded_args[0](1) == 2

    # A value of a type derived from a plain one keeps its type
    class Num(int): ...

    back, _ = pickle.loads(_pickle_args(fn, (Num(3),), {}))
    assert type(back[0]).__name__ == "Num" and back[0] == 3
