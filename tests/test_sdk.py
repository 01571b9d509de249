"""The SDK surface on the embedded in-memory plane, with worker threads.

Jobs that must share state with the test (a record of what ran, a gate that holds a
job running) are plain module-level functions: they pickle by reference, so the worker
thread, in this process, calls these very functions.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.clock import FakeClock

#: seconds any wait may take before the test fails (instead of hanging)
WAIT = 30.0
QUEUE = "sdk"

# --- jobs ---------------------------------------------------------------------------

#: tags of the jobs that ran, in the order they ran
RAN: list[str] = []
#: key → (started, release) events of held jobs
GATES: dict[str, tuple[threading.Event, threading.Event]] = {}


def record(tag: str) -> list[str]:
    """A job that notes that it ran (a list: a bare str would be a data-key manifest)."""
    RAN.append(tag)
    return [tag]


def held(key: str, value: Any) -> Any:
    """A job that says it started, then runs until the test releases it."""
    started, release = GATES[key]
    started.set()
    release.wait(WAIT)
    return value


def overrun(seconds: float) -> dict[str, bool]:
    """A job that works for a while (longer than the timeout it is given)."""
    time.sleep(seconds)
    return {"finished": True}


def thread_id() -> int:
    return threading.get_ident()


def raise_value_error(message: str) -> None:
    raise ValueError(message)


class CustomError(Exception):
    """An exception class importable on both sides."""


def raise_custom(code: int) -> None:
    raise CustomError(f"custom failure {code}")


class NeedsTwoArgs(Exception):
    """Pickles, but cannot be rebuilt: unpickling calls NeedsTwoArgs(message)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"needs two: {a}, {b}")


def raise_needs_two() -> None:
    raise NeedsTwoArgs(1, 2)


def takes(value: Any, lock: Any = None, *, items: Any = None) -> None:
    """A job whose arguments the tests make unpicklable."""


@dls.udf(queue=QUEUE)
def square(x: int) -> int:
    return x * x


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    RAN.clear()
    yield
    for _, release in GATES.values():
        release.set()
    GATES.clear()


class Gate:
    """Holds a ``held`` job running until released."""

    def __init__(self) -> None:
        self.key = uuid.uuid4().hex
        self.started = threading.Event()
        self.release = threading.Event()
        GATES[self.key] = (self.started, self.release)

    def wait_started(self) -> None:
        assert self.started.wait(WAIT), "the held job never started"


@pytest.fixture
def workers(dispatch: dls.Dispatch) -> Iterator[Callable[..., list[threading.Thread]]]:
    """Start worker threads on a queue of ``dispatch``; stopped and joined afterwards."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(name: str = QUEUE, n: int = 1) -> list[threading.Thread]:
        new = [
            threading.Thread(
                target=dls.run_worker,
                args=(dls.SyncQueue(name, dispatch=dispatch),),
                kwargs={"stop": stop.is_set, "poll": 0.05},
                daemon=True,
            )
            for _ in range(n)
        ]
        for t in new:
            t.start()
        threads.extend(new)
        return new

    yield start
    for _, release in GATES.values():  # held jobs end, so their workers can stop
        release.set()
    stop.set()
    for t in threads:
        t.join(timeout=WAIT)
    assert not any(t.is_alive() for t in threads), "a worker thread did not stop"


@pytest.fixture
def q(dispatch: dls.Dispatch) -> dls.SyncQueue:
    return dls.SyncQueue(QUEUE, dispatch=dispatch)


# --- the public surface ---------------------------------------------------------------


def test_exported_members() -> None:
    # Given the package's declared public names
    expected = {
        "Batch",
        "BoltzmannQueue",
        "CancelledError",
        "CannotLoad",
        "ClientError",
        "Conflict",
        "DataKeyMissing",
        "Dispatch",
        "ExpiredInvocation",
        "Forbidden",
        "FILOQueue",
        "IdempotencyConflict",
        "InvalidRequest",
        "InvalidResult",
        "InvocationDead",
        "InvocationTimeout",
        "JobFailed",
        "LakeshoreError",
        "LeaseLost",
        "NotFound",
        "PayloadTooLarge",
        "Pool",
        "PriorityQueue",
        "Queue",
        "QueueCreatedWarning",
        "QueueMismatch",
        "QueueNotFound",
        "RemoteError",
        "Retry",
        "SerializationError",
        "State",
        "SyncBoltzmannQueue",
        "SyncFILOQueue",
        "SyncPriorityQueue",
        "SyncQueue",
        "UDF",
        "Unauthorized",
        "Unavailable",
        "UnknownInvocation",
        "WorkerCrashed",
        "__version__",
        "batch",
        "configure",
        "progress",
        "context",
        "data",
        "run_worker",
        "udf",
    }
    # When they are compared with what the package exports
    # Then they are exactly these, listed once each, and every one exists
    assert set(dls.__all__) == expected
    assert len(dls.__all__) == len(expected)
    for name in dls.__all__:
        assert hasattr(dls, name), name
    # And every exported error (not warning) is part of the one tree
    for name in expected:
        obj = getattr(dls, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning):
            assert issubclass(obj, dls.LakeshoreError), name


# --- udf ------------------------------------------------------------------------------


def test_udf_call_runs_locally(dispatch: dls.Dispatch) -> None:
    # Given a udf bound to a queue nobody serves
    local = dls.udf(queue="nobody-serves", dispatch=dispatch)(thread_id)
    # When it is called like a function
    # Then it runs here, now, in this thread
    assert local() == threading.get_ident()
    assert square(7) == 49


def test_submit_returns_a_string_id(
    dispatch: dls.Dispatch, q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given no worker yet
    # When a udf and a queue submit calls
    a = square.submit(3, _dispatch=dispatch)
    b = square.submit(4, _dispatch=dispatch)
    c = q.submit(square.fn, 5)
    # Then each returns at once with its own durable id (a str), pending on the plane
    assert all(isinstance(i, str) and i for i in (a, b, c))
    assert len({a, b, c}) == 3
    assert [q.status(i) for i in (a, b, c)] == ["pending"] * 3
    # And a worker started later runs them
    workers()
    assert [q.result(i, timeout=WAIT) for i in (a, b, c)] == [9, 16, 25]


# --- SyncQueue ------------------------------------------------------------------------


def test_sync_queue_result_and_status(q: dls.SyncQueue, workers: Callable[..., Any]) -> None:
    # Given a submitted call and no worker
    inv = q.submit(pow, 2, 10)
    assert q.status(inv) == "pending"
    assert not q.finished(inv)
    # When a worker runs it
    workers()
    # Then result() returns its value, and the status says succeeded
    assert q.result(inv, timeout=WAIT) == 1024
    assert q.status(inv) == "succeeded"
    assert q.finished(inv)
    # And cancelling a finished invocation changes nothing
    assert q.cancel(inv) == "succeeded"
    assert q.result(inv, timeout=WAIT) == 1024


def test_sync_queue_cancel_pending(q: dls.SyncQueue, workers: Callable[..., Any]) -> None:
    # Given a pending invocation
    inv = q.submit(record, "cancelled-one")
    # When it is cancelled before any worker sees it
    assert q.cancel(inv) == "cancelled"
    # Then result() raises dls.CancelledError, and its status says cancelled
    with pytest.raises(dls.CancelledError):
        q.result(inv, timeout=WAIT)
    assert q.status(inv) == "cancelled"
    # And a worker started afterwards never runs it (the next job goes first)
    workers()
    after = q.submit(record, "after")
    assert q.result(after, timeout=WAIT) == ["after"]
    assert RAN == ["after"]
    assert q.status(inv) == "cancelled"


def test_sync_queue_cancel_running(q: dls.SyncQueue, workers: Callable[..., Any]) -> None:
    # Given a running invocation
    workers()
    gate = Gate()
    inv = q.submit(held, gate.key, "late answer")
    gate.wait_started()
    assert q.status(inv) == "running"
    # When it is cancelled
    assert q.cancel(inv) == "cancelled"
    # Then result() raises dls.CancelledError at once, without waiting for the job
    with pytest.raises(dls.CancelledError):
        q.result(inv, timeout=WAIT)
    # And when the job ends anyway, its answer is refused and the worker goes on
    gate.release.set()
    nxt = q.submit(pow, 3, 3)
    assert q.result(nxt, timeout=WAIT) == 27
    assert q.status(inv) == "cancelled"


# --- async Queue ----------------------------------------------------------------------


def test_async_queue_submit_result_status_cancel(
    dispatch: dls.Dispatch, workers: Callable[..., Any]
) -> None:
    aq = dls.Queue(QUEUE, dispatch=dispatch)

    async def scenario() -> None:
        # Given a pending call submitted through the async surface
        inv = await aq.submit(pow, 2, 8)
        assert isinstance(inv, str)
        assert await aq.status(inv) == "pending"
        doomed = await aq.submit(record, "doomed", _delay=WAIT)
        assert await aq.status(doomed) == "scheduled"

        # When a worker runs it and a scheduled one is cancelled
        workers()
        value = await aq.result(inv, timeout=WAIT)
        state = await aq.cancel(doomed)

        # Then the result is awaited, and the status says succeeded
        assert value == 256
        assert await aq.status(inv) == "succeeded"
        # And the cancelled one raises dls.CancelledError, which is not asyncio's
        # (that one would cancel the awaiting task instead)
        assert state == "cancelled"
        with pytest.raises(dls.CancelledError) as info:
            await aq.result(doomed, timeout=WAIT)
        assert not isinstance(info.value, asyncio.CancelledError)
        assert await aq.status(doomed) == "cancelled"
        # And gather joins many, in submission order
        ids = [await aq.submit(pow, i, 2) for i in range(5)]
        assert await asyncio.gather(*(aq.result(i, timeout=WAIT) for i in ids)) == [
            i * i for i in range(5)
        ]

    asyncio.run(scenario())
    assert RAN == []


def test_queue_sync_is_the_blocking_surface_of_the_same_queue(
    dispatch: dls.Dispatch, workers: Callable[..., Any]
) -> None:
    # Given an async handle and its .sync twin
    aq = dls.Queue(QUEUE, dispatch=dispatch)
    sq = aq.sync
    # When one submits and the other waits
    workers()
    inv = sq.submit(pow, 5, 2)
    # Then both see the same invocation
    assert isinstance(sq, dls.SyncQueue)
    assert sq.name == aq.name == QUEUE
    assert asyncio.run(aq.result(inv, timeout=WAIT)) == sq.result(inv, timeout=WAIT) == 25


def test_sync_queue_inside_a_running_event_loop(
    q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given a running event loop (as in Jupyter) and a worker
    workers()

    async def notebook_cell() -> tuple[Any, str, str, str]:
        assert asyncio.get_running_loop().is_running()
        # When the blocking surface is used from inside it
        inv = q.submit(pow, 3, 4)
        value = q.result(inv, timeout=WAIT)
        status = q.status(inv)
        pending = q.submit(record, "never", _delay=WAIT)
        cancelled = q.cancel(pending)
        return value, status, cancelled, q.status(pending)

    # Then every call works (no "event loop is running" error)
    assert asyncio.run(notebook_cell()) == (81, "succeeded", "cancelled", "cancelled")


# --- `_` options ----------------------------------------------------------------------


def test_priority_option(dispatch: dls.Dispatch) -> None:
    # Given a priority queue and three calls with different priorities, no worker yet
    pq = dls.SyncQueue("sdk-priority", dispatch=dispatch, kind="priority")
    low = pq.submit(record, "low", _priority=1)
    high = pq.submit(record, "high", _priority=9)
    mid = pq.submit(record, "mid", _priority=5)
    assert dispatch.transport.get(high).priority == 9.0
    # When a worker runs them one at a time
    for _ in range(3):
        assert dls.run_worker(pq, once=True) == 1
    # Then the highest priority ran first
    assert RAN == ["high", "mid", "low"]
    assert [pq.result(i, timeout=WAIT) for i in (low, high, mid)] == [["low"], ["high"], ["mid"]]


def test_delay_option(
    dispatch: dls.Dispatch, q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given a worker, a call delayed for long and one delayed briefly
    workers()
    later = square.submit(6, _dispatch=dispatch, _delay=WAIT)
    soon = q.submit(record, "soon", _delay=0.05)
    # Then the long one is scheduled, due WAIT seconds after it was submitted
    rec = dispatch.transport.get(later)
    assert q.status(later) == "scheduled"
    assert rec.available_at == pytest.approx(rec.created_at + WAIT)
    # And the brief one runs once due, not before
    assert q.result(soon, timeout=WAIT) == ["soon"]
    done = dispatch.transport.get(soon)
    assert done.started_at is not None and done.started_at >= done.available_at
    # And the long one is still waiting, and can be cancelled
    with pytest.raises(TimeoutError):
        q.result(later, timeout=0.2)
    assert q.status(later) == "scheduled"
    assert q.cancel(later) == "cancelled"


def test_timeout_option_fails_an_overrunning_job(
    q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given one worker and a job that runs for 1 s with a 0.2 s timeout
    workers()
    inv = q.submit(overrun, 1.0, _timeout=0.2)
    # When its result is asked for
    # Then it is dls.InvocationTimeout, as it ran past its timeout
    with pytest.raises(dls.InvocationTimeout):
        q.result(inv, timeout=WAIT)
    assert q.status(inv) == "failed"


def test_timeout_option_fails_a_held_job_while_another_worker_sweeps(
    q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given two workers and a job held running, with a 0.2 s timeout
    workers(n=2)
    gate = Gate()
    inv = q.submit(held, gate.key, "too late", _timeout=0.2)
    gate.wait_started()
    # When its result is asked for while it is still held
    # Then it is dls.InvocationTimeout (the idle worker's sweep timed it out)
    with pytest.raises(dls.InvocationTimeout):
        q.result(inv, timeout=WAIT)
    assert q.status(inv) == "failed"
    # And the late answer is refused when the job finally ends
    gate.release.set()
    after = q.submit(pow, 2, 2)
    assert q.result(after, timeout=WAIT) == 4
    assert q.status(inv) == "failed"


def test_max_attempts_option(clock: FakeClock) -> None:
    # Given a plane on a fake clock, and a call allowed two attempts
    with dls.Dispatch(":memory:", clock=clock) as dp:
        q = dls.SyncQueue(QUEUE, dispatch=dp)
        inv = q.submit(pow, 2, 2, _max_attempts=2)
        default = q.submit(pow, 2, 3)
        assert dp.transport.get(inv).max_attempts == 2
        assert dp.transport.get(default).max_attempts == 3
        t = dp.transport

        # When its worker vanishes twice (claims, then never answers until the lease ends)
        first = t.claim([QUEUE], "lost-1", limit=1, lease_seconds=10)
        assert [c.id for c in first] == [inv]
        clock.advance(11)
        second = t.claim([QUEUE], "lost-2", limit=1, lease_seconds=10)
        assert [(c.id, c.attempt) for c in second] == [(inv, 2)]
        clock.advance(11)
        t.claim([QUEUE], "sweeper", limit=1, lease_seconds=10)  # sweeps, takes `default`

        # Then it is dead, and result() says so
        assert q.status(inv) == "dead"
        with pytest.raises(dls.InvocationDead):
            q.result(inv, timeout=WAIT)


def test_idempotency_key_option(
    dispatch: dls.Dispatch, q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given a call submitted twice under one idempotency key (a retried submit)
    first = q.submit(record, "once", _idempotency_key="job-42")
    again = q.submit(record, "once", _idempotency_key="job-42")
    same_via_udf = square.submit(3, _dispatch=dispatch, _idempotency_key="sq-3")
    # Then both submits name the same invocation, and the plane holds one
    assert first == again
    assert square.submit(3, _dispatch=dispatch, _idempotency_key="sq-3") == same_via_udf
    assert dispatch.transport.get_many([first, again]) == [dispatch.transport.get(first)]
    # And another request under the same key is refused
    with pytest.raises(dls.IdempotencyConflict):
        q.submit(record, "other", _idempotency_key="job-42")
    # When a worker drains the queue (a later job proves it got past any duplicate)
    workers()
    assert q.result(first, timeout=WAIT) == ["once"]
    assert q.result(q.submit(record, "after"), timeout=WAIT) == ["after"]
    # Then the call ran once
    assert RAN == ["once", "after"]
    assert q.result(same_via_udf, timeout=WAIT) == 9


def test_unknown_underscore_option_is_a_type_error(dispatch: dls.Dispatch) -> None:
    aq = dls.Queue(QUEUE, dispatch=dispatch)
    q = aq.sync
    # Given `_`-prefixed keywords, which are Lakeshore's
    # When one is not a Lakeshore option
    # Then every submit refuses it with a TypeError naming it, and submits nothing
    with pytest.raises(TypeError, match="_foo"):
        square.submit(3, _dispatch=dispatch, _foo=1)
    with pytest.raises(TypeError, match="_foo"):
        q.submit(pow, 2, 3, _foo=1)
    with pytest.raises(TypeError, match="_foo"):
        asyncio.run(aq.submit(pow, 2, 3, _foo=1))
    with pytest.raises(TypeError, match="_prority"):
        square.submit(3, _dispatch=dispatch, _prority=1)
    assert dispatch.transport.counts(QUEUE)["pending"] == 0


# --- errors ---------------------------------------------------------------------------


def test_remote_exception_is_reraised_as_its_own_type(
    q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given jobs that raise a builtin and a custom exception
    workers()
    builtin = q.submit(raise_value_error, "bad value 17")
    custom = q.submit(raise_custom, 5)
    # When their results are asked for
    # Then each raises its own type, with the remote traceback attached and as a note
    with pytest.raises(ValueError, match="bad value 17") as info:
        q.result(builtin, timeout=WAIT)
    tb = info.value.remote_traceback
    assert "raise_value_error" in tb and "ValueError: bad value 17" in tb
    assert any("raise_value_error" in note for note in info.value.__notes__)
    with pytest.raises(CustomError, match="custom failure 5") as custom_info:
        q.result(custom, timeout=WAIT)
    assert "raise_custom" in custom_info.value.remote_traceback
    assert q.status(builtin) == q.status(custom) == "failed"


SCRIPT = """\
def check(x):
    if x < 0:
        raise ValueError(f"negative: {x}")
    return x


class Steps:
    @staticmethod
    def run(x):
        return [check(v) for v in (x, -x)]


def train(x):
    return Steps.run(x)
"""


def test_a_remote_traceback_names_the_file_of_a_function_sent_by_value(
    tmp_path: Path, q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given a function from a script (no module a worker could import: sent by value)
    # that fails in a helper, through a method and a comprehension
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    scope: dict[str, Any] = {"__name__": "__main__", "__file__": str(script)}
    exec(compile(SCRIPT, str(script), "exec"), scope)
    workers()
    # When it runs on a worker and fails
    with pytest.raises(ValueError, match="negative: -4") as info:
        q.result(q.submit(scope["train"], 4), timeout=WAIT)
    # Then each of its frames names the script and its line, as it would have run here
    tb = info.value.remote_traceback
    assert "<dynamic-code>" not in tb
    for line, name in [(14, "train"), (10, "run"), (10, "<listcomp>"), (3, "check")]:
        assert f'File "{script}", line {line}, in {name}' in tb, tb
    assert 'raise ValueError(f"negative: {x}")' in tb  # (the worker has the same file)


def test_a_remote_traceback_shows_no_lines_of_another_file_at_the_script_s_path(
    tmp_path: Path, q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given a function sent by value from a script the worker has another version of
    script = tmp_path / "job.py"
    scope: dict[str, Any] = {"__name__": "__main__", "__file__": str(script)}
    exec(compile(SCRIPT, str(script), "exec"), scope)
    script.write_text("\n".join(f"unrelated_{n} = {n}" for n in range(30)) + "\n")
    workers()
    with pytest.raises(ValueError) as info:
        q.result(q.submit(scope["train"], 4), timeout=WAIT)
    # Then its traceback names the file and lines, and shows none of the other file's
    tb = info.value.remote_traceback
    assert f'File "{script}", line 3, in check' in tb
    assert "unrelated_" not in tb


def test_a_function_by_reference_whose_module_holds_a_touchy_proxy_runs(
    tmp_path: Path, q: dls.SyncQueue, workers: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a module (importable on the worker: sent by reference) holding an object
    # whose every attribute lookup raises (a context-bound proxy, as Flask's)
    (tmp_path / "touchy_jobs.py").write_text(
        "class Proxy:\n"
        "    def __getattr__(self, name):\n"
        "        raise RuntimeError('working outside of a context')\n"
        "current = Proxy()\n"
        "def double(x):\n"
        "    return 2 * x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import touchy_jobs  # type: ignore[import-not-found]

    workers()
    # Then it runs as any other
    assert q.result(q.submit(touchy_jobs.double, 21), timeout=WAIT) == 42


def test_exception_that_cannot_be_rebuilt_is_a_remote_error(
    q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given a job raising an exception class whose instances cannot be unpickled
    workers()
    inv = q.submit(raise_needs_two)
    # When its result is asked for
    # Then it is a dls.RemoteError naming the remote type, with its message and traceback
    with pytest.raises(dls.RemoteError) as info:
        q.result(inv, timeout=WAIT)
    err = info.value
    assert err.type_name.endswith(".NeedsTwoArgs")
    assert "needs two: 1, 2" in str(err)
    assert "raise_needs_two" in err.remote_traceback
    assert any("raise_needs_two" in note for note in err.__notes__)


def test_exception_class_missing_on_the_producer_is_a_remote_error(
    tmp_path: Path, q: dls.SyncQueue, workers: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a module whose function raises its own exception class, called by reference
    mod = f"lakeshore_errmod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(
        "class Boom(Exception):\n    pass\n\n\ndef explode(x):\n    raise Boom(f'boom {x}')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    workers()
    inv = q.submit(f"{mod}:explode", 3)
    # When the result is read while the class can be imported here
    # Then it is raised as that class
    with pytest.raises(Exception, match="boom 3") as info:
        q.result(inv, timeout=WAIT)
    assert type(info.value).__qualname__ == "Boom"
    assert type(info.value).__module__ == mod
    # When the module is gone from the producer side (a producer without it)
    sys.path.remove(str(tmp_path))
    del sys.modules[mod]
    importlib.invalidate_caches()
    # Then the same result is a dls.RemoteError naming the remote type
    with pytest.raises(dls.RemoteError, match="boom 3") as remote:
        q.result(inv, timeout=WAIT)
    assert remote.value.type_name == f"{mod}.Boom"
    assert "explode" in remote.value.remote_traceback


def test_a_finished_result_is_returned_with_no_time_to_wait_blocking_or_awaiting(
    dispatch: dls.Dispatch, q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given a finished invocation
    workers()
    inv = q.submit(pow, 2, 5)
    assert q.result(inv, timeout=WAIT) == 32
    # When its result is asked for with no time to wait, blocking and awaiting
    aq = dls.Queue(QUEUE, dispatch=dispatch)
    # Then both return it (the record is there: nothing to wait for)
    assert q.result(inv, timeout=0) == 32
    assert asyncio.run(aq.result(inv, timeout=0)) == 32


def test_result_timeout_leaves_the_invocation_going(
    dispatch: dls.Dispatch, q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    # Given a pending invocation (no worker yet)
    pending = q.submit(pow, 2, 5)
    # When a wait for it runs out
    # Then it is the builtin TimeoutError, and the invocation is still pending
    with pytest.raises(TimeoutError) as info:
        q.result(pending, timeout=0.2)
    assert not isinstance(info.value, dls.LakeshoreError)
    assert q.status(pending) == "pending"
    # And a wait of no time (or less, or not a number) answers at once, the same way
    for no_time in (0, -1, float("nan")):
        with pytest.raises(TimeoutError):
            q.result(pending, timeout=no_time)

    # Given a running invocation
    workers()
    assert q.result(pending, timeout=WAIT) == 32
    # (a finished one answers a wait of any length, one past what a lock can time, too)
    assert q.result(pending, timeout=float("inf")) == q.result(pending, timeout=1e300) == 32
    gate = Gate()
    running = q.submit(held, gate.key, ["eventually"])
    gate.wait_started()
    # When waits for it run out, blocking and awaiting
    with pytest.raises(TimeoutError):
        q.result(running, timeout=0.2)
    aq = dls.Queue(QUEUE, dispatch=dispatch)
    with pytest.raises(TimeoutError):
        asyncio.run(aq.result(running, timeout=0.2))
    # Then it is still running, and its result comes once it finishes
    assert q.status(running) == "running"
    gate.release.set()
    assert q.result(running, timeout=WAIT) == ["eventually"]


def test_unknown_id_is_reported_at_once(dispatch: dls.Dispatch, q: dls.SyncQueue) -> None:
    aq = dls.Queue(QUEUE, dispatch=dispatch)
    q.submit(pow, 1, 1)  # the queue exists; the id does not
    unknown = "01nosuchinvocation00000000"
    # Given an id the plane never had
    # When it is waited for, asked about or cancelled
    # Then each says dls.UnknownInvocation (not a TimeoutError after the wait)
    with pytest.raises(dls.UnknownInvocation):
        q.result(unknown, timeout=WAIT)
    with pytest.raises(dls.UnknownInvocation):
        q.status(unknown)
    with pytest.raises(dls.UnknownInvocation):
        q.cancel(unknown)
    with pytest.raises(dls.UnknownInvocation):
        asyncio.run(aq.result(unknown, timeout=WAIT))
    with pytest.raises(dls.UnknownInvocation):
        asyncio.run(aq.status(unknown))
    with pytest.raises(dls.UnknownInvocation):
        asyncio.run(aq.cancel(unknown))


def test_unpicklable_argument_fails_at_submit(dispatch: dls.Dispatch, q: dls.SyncQueue) -> None:
    aq = dls.Queue(QUEUE, dispatch=dispatch)
    held_udf = dls.udf(queue=QUEUE, dispatch=dispatch)(takes)
    # Given arguments that cannot be pickled: a lock, a generator
    # When they are submitted
    # Then submit() raises dls.SerializationError naming the argument
    with pytest.raises(dls.SerializationError, match="'lock'") as info:
        q.submit(takes, 1, threading.Lock())
    assert isinstance(info.value, dls.ClientError)
    with pytest.raises(dls.SerializationError, match="'items'"):
        q.submit(takes, 1, items=(i for i in range(3)))
    with pytest.raises(dls.SerializationError, match="'lock'"):
        held_udf.submit(1, threading.Lock())
    with pytest.raises(dls.SerializationError, match="'items'"):
        asyncio.run(aq.submit(takes, 1, items=(i for i in range(3))))
    # And a function that captures something unpicklable is refused too
    lock = threading.Lock()

    def holds_lock() -> bool:
        return lock.locked()

    with pytest.raises(dls.SerializationError, match="holds_lock"):
        q.submit(holds_lock)
    # And nothing reached the plane
    assert dispatch.transport.counts(QUEUE)["pending"] == 0


def test_worker_that_cannot_load_the_function_fails_it_and_keeps_going(
    tmp_path: Path, q: dls.SyncQueue, workers: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a function from a module the producer could import, submitted (it pickles
    # by reference: module and name)
    mod = f"lakeshore_gone_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(mod)
    bad = q.submit(module.triple, 2)
    good = q.submit(pow, 2, 6)
    # And a worker that cannot import that module
    sys.path.remove(str(tmp_path))
    del sys.modules[mod]
    importlib.invalidate_caches()
    (thread,) = workers()
    # When it runs both
    # Then the good one succeeds after the bad one: the worker kept going
    assert q.result(good, timeout=WAIT) == 64
    assert thread.is_alive()
    # And the bad one failed for good with the worker's import error
    with pytest.raises(ModuleNotFoundError, match=mod):
        q.result(bad, timeout=WAIT)
    assert q.status(bad) == "failed"
    assert q.dispatch.transport.get(bad).attempt == 1


# --- ref payloads -----------------------------------------------------------------------


def test_ref_payloads(
    dispatch: dls.Dispatch, q: dls.SyncQueue, workers: Callable[..., Any]
) -> None:
    aq = dls.Queue(QUEUE, dispatch=dispatch)
    workers()
    # Given calls by reference, "module:function" with msgpack arguments
    # When they run
    # Then the worker imports and calls the function
    assert q.result(q.submit("math:sqrt", 16.0), timeout=WAIT) == 4.0
    assert q.result(q.submit("builtins:divmod", 17, 5), timeout=WAIT) == [3, 2]

    async def awaited() -> Any:
        return await aq.result(await aq.submit("math:hypot", 3.0, 4.0), timeout=WAIT)

    assert asyncio.run(awaited()) == 5.0
    # And a reference the worker cannot resolve fails that invocation
    with pytest.raises(AttributeError, match="no_such_function"):
        q.result(q.submit("math:no_such_function", 1.0), timeout=WAIT)
    # And a malformed reference or non-msgpack arguments fail at submit
    with pytest.raises(dls.InvalidRequest):
        q.submit("math.sqrt", 16.0)
    with pytest.raises(dls.SerializationError):
        q.submit("math:sqrt", object())
