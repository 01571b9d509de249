"""A submit made while a claim is parked for work on its queue hands the new record to
that claim: written already leased to its worker, the claim answered without looking at
the store again (``lakeshore serve``'s parked claims; the plane's rule in
``WorkerOps._hand_over``). So does a submit in the process of a claim blocking in a
thread (an embedded plane's workers). What a look would not hand out — work held back by a running
cap, Boltzmann sampling, a call not due yet, a replayed id — is not handed either, and
claims a holder cannot deliver go back to pending."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
from support import counting_calls, parked_claims_settled, role_token, threads_of, wait_for

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.plane import Plane, QueueSpec, Submission
from dreamlake.lakeshore.plane import changes as changes_module
from dreamlake.lakeshore.plane import workers as workers_module
from dreamlake.lakeshore.plane.model import Claim, State
from dreamlake.lakeshore.server import LocalServer, PlaneASGI
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.submit import new_id
from dreamlake.lakeshore.wire import encode_ref_call

PAYLOAD = encode_ref_call("math:sqrt", (4.0,), {}).payload


@pytest.fixture
def claiming(served: LocalServer) -> Iterator[Callable[..., list[list[Claim]]]]:
    """Starts worker ``worker``'s claim (over HTTP, in a thread); its answer lands in the
    list returned."""
    token = role_token(served, "worker")
    threads: list[threading.Thread] = []
    errors: list[Exception] = []

    def start(queues: list[str], worker: str = "w", wait: float = 10.0) -> list[list[Claim]]:
        got: list[list[Claim]] = []

        def claim() -> None:
            with dls.Dispatch(served.url, token=token) as dp:
                try:
                    got.append(dp.transport.claim(queues, worker, limit=1, wait=wait))
                except dls.LakeshoreError as exc:  # (a stopping server's 503)
                    errors.append(exc)

        threads.append(threading.Thread(target=claim))
        threads[-1].start()
        return got

    yield start
    for t in threads:
        t.join(30)


def _parked(plane: Plane, asgi: PlaneASGI, claims: int) -> None:
    """Wait until ``claims`` claims are parked and on the plane's books for a hand-over."""
    parked_claims_settled(plane, asgi, claims, handed_to=True)


def _submit(served: LocalServer, queue: str, *args: Any, **options: Any) -> str:
    assert served.admin_token is not None
    with dls.Dispatch(served.url, token=served.admin_token) as producer:
        return dls.SyncQueue(queue, dispatch=producer).submit(pow, 2, 8, *args, **options)


def _claimed_total(served: LocalServer, queue: str) -> float:
    req = urllib.request.Request(
        f"{served.url}/metrics", headers={"Authorization": f"Bearer {served.admin_token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as answer:
        text = answer.read().decode()
    series = f'lakeshore_invocations_claimed_total{{queue="{queue}"}} '
    lines = [line for line in text.splitlines() if line.startswith(series)]
    return float(lines[0].split()[-1]) if lines else 0.0


def _parked_on_h(
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[..., list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[list[Claim]], list[float]]:
    """Worker gpu-1's claim parked on the empty queue h: what it gets, and the plane's
    looks (claims) from then on."""
    plane, asgi = parts
    plane.ensure_queue(QueueSpec("h"))
    got = claiming(["h"], "gpu-1")
    _parked(plane, asgi, 1)
    return got, counting_calls(plane, "claim", monkeypatch)


def test_a_call_submitted_while_a_claim_is_parked_is_handed_to_it_without_a_look(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[..., list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a worker's claim parked on an empty queue
    plane = parts[0]
    got, looks = _parked_on_h(parts, claiming, monkeypatch)
    # When a call is submitted over HTTP
    inv = _submit(served, "h")
    # Then the claim gets it without looking at the store again
    wait_for(lambda: bool(got), 10, "the parked claim got nothing")
    (claim,) = got[0]
    assert claim.id == inv and claim.attempt == 1
    assert looks == []
    # ... and the record was written leased to that worker, as a look would lease it
    rec = plane.get(inv)
    assert rec.state is State.RUNNING and rec.worker == "gpu-1" and rec.attempt == 1
    assert rec.lease_token == claim.lease_token
    assert rec.lease_expires_at == claim.lease_expires_at
    assert rec.started_at is not None and rec.lease_expires_at > rec.started_at
    assert _claimed_total(served, "h") == 1
    # ... and its lease is the worker's to complete
    plane.complete(inv, claim.lease_token, b"\x01")
    assert plane.get(inv).state is State.SUCCEEDED


def test_a_submit_carrying_a_large_argument_hands_its_call_over_too(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[..., list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a worker's claim parked on an empty queue
    plane = parts[0]
    got, looks = _parked_on_h(parts, claiming, monkeypatch)
    ran_on = {name: threads_of(plane, name, monkeypatch) for name in ("put_blobs", "submit")}
    # When a call whose argument is carried in its submit, too large for the event loop
    # (a 300 KiB blob in a body over 64 KiB), is submitted over HTTP
    arg = b"x" * (300 * 1024)
    assert served.admin_token is not None
    with dls.Dispatch(served.url, token=served.admin_token) as producer:
        inv = dls.SyncQueue("h", dispatch=producer).submit(len, arg)
    # Then its blob was checked and stored on a request thread, its record made on the
    # event loop, and the parked claim was handed the call without a look
    assert [name.startswith("lakeshore-api") for name in ran_on["put_blobs"]] == [True]
    assert ran_on["submit"] == ["lakeshore-serve"]
    wait_for(lambda: bool(got), 10, "the parked claim got nothing")
    assert [c.id for c in got[0]] == [inv] and looks == []
    rec = plane.get(inv)
    assert rec.state is State.RUNNING and rec.worker == "gpu-1"
    assert arg in plane.get_blob(msgpack.unpackb(rec.payload)["args_ref"])


def test_a_hand_over_wakes_no_other_claim(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[..., list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given one claim parked on q and four on r
    plane, asgi = parts
    for name in ("q", "r"):
        plane.ensure_queue(QueueSpec(name))
    got = claiming(["q"], wait=8.0)
    others = [claiming(["r"], wait=8.0) for _ in range(4)]
    _parked(plane, asgi, 5)
    looks = counting_calls(plane, "claim", monkeypatch)
    # When a call on q is submitted over HTTP
    inv = _submit(served, "q")
    # Then the claim on q is handed it, and no claim looked at the store at all
    wait_for(lambda: bool(got), 10, "the parked claim got nothing")
    assert [c.id for c in got[0]] == [inv]
    parked_claims_settled(plane, asgi, 4)  # (every wake the submit made, answered)
    assert looks == [] and not any(others)
    for _ in others:  # (the others' calls, one each: they end at once)
        _submit(served, "r")
    wait_for(lambda: all(others), 10, "the other claims got nothing")


@pytest.mark.parametrize("cut", ["server-stops", "connection-closes"])
def test_a_claim_cut_as_it_is_handed_a_call_hands_the_call_back(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[..., list[list[Claim]]],
    cut: str,
) -> None:
    # Given a claim parked on the server (on its short lane)
    plane, asgi = parts
    plane.ensure_queue(QueueSpec("cut"))
    got = claiming(["cut"], wait=3.0)
    _parked(plane, asgi, 1)
    sub = Submission(new_id(), "cut", PAYLOAD)
    done = threading.Event()
    assert served.uvicorn is not None
    connections = served.uvicorn.server_state.connections

    def on_loop() -> None:
        # When, in one turn of the loop, the claim is cut — the server stops (the parked
        # claim is answered 503), or its connection is closed (the loss is told at the
        # next turn) — and then a call is submitted there, which hands it to that claim
        if cut == "server-stops":
            asgi._stopping = True
            asgi._cut_waits()
        else:
            (held,) = [
                c for c in connections if type(getattr(c, "cycle", None)).__name__ == "_Held"
            ]
            held.transport.close()
        plane.submit([sub])
        done.set()

    assert asgi._loop is not None
    asgi._loop.call_soon_threadsafe(on_loop)
    assert done.wait(10)
    # Then the claim answers no call, and the call is pending again, its attempt not
    # counted (handed back by the park's release), for the next worker
    wait_for(lambda: plane.get(sub.id).state is State.PENDING, 10, "never handed back")
    rec = plane.get(sub.id)
    assert (rec.state, rec.attempt, rec.worker) == (State.PENDING, 0, None)
    (claim,) = plane.claim(["cut"], "next")
    assert (claim.id, claim.attempt) == (sub.id, 1)
    assert not any(got)


@pytest.mark.parametrize(
    ("spec", "options"),
    [
        (QueueSpec("capped", elasticity={"kind": "fixed", "min": 1, "max": 2}), {}),
        (QueueSpec("sampled", kind="boltzmann", temperature=1.0), {}),
        (QueueSpec("later"), {"_delay": 0.6}),
    ],
    ids=["running-cap", "boltzmann", "delayed"],
)
def test_work_a_look_decides_on_is_not_handed_over(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[..., list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
    spec: QueueSpec,
    options: dict[str, Any],
) -> None:
    # Given a claim parked on a queue with a running cap, a Boltzmann queue, or one
    # that is sent a call due later
    plane, asgi = parts
    plane.ensure_queue(spec)
    got = claiming([spec.name])
    wait_for(lambda: asgi.held()[0] == 1, 10, "the claim never parked")
    looks = counting_calls(plane, "claim", monkeypatch)
    # When a call is submitted
    inv = _submit(served, spec.name, **options)
    # Then the claim takes it by a look of its own (the cap counted, the sample drawn,
    # the call due), not by a hand-over
    wait_for(lambda: bool(got), 10, "the parked claim got nothing")
    assert [c.id for c in got[0]] == [inv]
    assert looks
    rec = plane.get(inv)
    assert rec.started_at is not None and rec.started_at >= rec.available_at


def test_a_claim_on_a_queue_paused_while_it_waited_is_not_handed_its_call(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[..., list[list[Claim]]],
) -> None:
    # Given a claim parked on a queue that is then paused (the pause takes it off the
    # books; the submit wakes it to look, and it waits out the pause as a new claim would)
    plane, asgi = parts
    plane.ensure_queue(QueueSpec("p"))
    got = claiming(["p"], wait=2.0)
    _parked(plane, asgi, 1)
    assert served.admin_token is not None
    with dls.Dispatch(served.url, token=served.admin_token) as admin:
        admin.transport.update_queue("p", paused=True)  # type: ignore[attr-defined]
    # When a call is submitted
    inv = _submit(served, "p")
    # Then the claim answers without it, and the call waits, untried, for the resume
    wait_for(lambda: bool(got), 10, "the claim never answered")
    assert got[0] == []
    rec = plane.get(inv)
    assert rec.state is State.PENDING and rec.attempt == 0 and rec.worker is None
    assert rec.started_at is None  # (never leased: not handed over, then handed back)


# --- the plane's rule, on one thread (the holder's, as an event loop's) -------------------


@pytest.fixture
def plane() -> Iterator[Plane]:
    p = Plane(SqliteStore(":memory:"))
    p.ensure_queue(QueueSpec("q"))
    yield p
    p.close()


def _park(plane: Plane, limit: int = 1) -> Any:
    """A claim parked and held on this thread, as ``lakeshore serve`` holds one."""
    with plane.changes.parking() as parked:
        assert plane.claim(["q"], "w", limit=limit, wait=5.0) == []
    park = parked()
    assert park is not None and park.taker is not None
    woken: list[bool] = []
    park.taker.on_handed = lambda: woken.append(True)
    plane.changes.hold(park)
    return park, woken


def test_a_handed_claim_its_holder_cannot_deliver_goes_back_to_pending(plane: Plane) -> None:
    # Given a claim parked and held, and a call submitted on the holder's thread
    park, woken = _park(plane)
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    # Then the claim was handed it and its holder woken
    assert woken == [True] and [c.id for c in park.box] == [inv]
    assert plane.get(inv).state is State.RUNNING
    # When the holder lets the park go without answering (its client went away)
    plane.changes.unhold(park)
    park.release()
    # Then the call is pending again, its attempt not counted, and a look takes it
    rec = plane.get(inv)
    assert (rec.state, rec.attempt, rec.worker, rec.lease_token) == (State.PENDING, 0, None, None)
    (claim,) = plane.claim(["q"], "other")
    assert (claim.id, claim.attempt) == (inv, 1)


def test_only_a_submit_on_the_holders_thread_hands_over(plane: Plane) -> None:
    # Given a claim parked and held on this thread
    park, woken = _park(plane)
    # When a call is submitted from another thread
    other = threading.Thread(target=plane.submit, args=([Submission(new_id(), "q", PAYLOAD)],))
    other.start()
    other.join(10)
    # Then nothing was handed over (the claim is woken to look, as before), and the
    # claim is still on the books
    assert park.box == [] and woken == []
    assert plane.changes.takers
    plane.changes.unhold(park)
    assert not plane.changes.takers


def test_a_replayed_id_is_not_handed_and_the_claim_stays_on_the_books(plane: Plane) -> None:
    # Given a call submitted, and taken, before a claim parked
    first = Submission(new_id(), "q", PAYLOAD)
    plane.submit([first])
    (taken,) = plane.claim(["q"], "other")
    park, woken = _park(plane)
    # When the same submission is replayed
    assert plane.submit([first]) == [first.id]
    # Then the replay hands nothing over (the record is the first submit's, leased to
    # the other worker as before) and the claim is still on the books
    assert park.box == [] and woken == []
    assert plane.changes.takers
    assert plane.get(first.id).lease_token == taken.lease_token
    plane.changes.unhold(park)
    # ... and a claim parked afresh is handed the next new call
    park, woken = _park(plane)
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    assert [c.id for c in park.box] == [inv] and woken == [True]
    plane.changes.unhold(park)


@pytest.mark.parametrize(
    ("kind", "queues", "batch", "first"),
    [
        ("fifo", ["k"], [("k", 0.0), ("k", 0.0)], 0),
        ("priority", ["k"], [("k", 0.0), ("k", 10.0)], 1),
        ("filo", ["k"], [("k", 0.0), ("k", 0.0)], 1),
        ("fifo", ["k", "r"], [("r", 0.0), ("k", 0.0)], 1),
    ],
    ids=["fifo", "priority", "filo", "two-queues"],
)
def test_a_batch_is_not_handed_over_its_claim_looks_in_the_queues_order(
    plane: Plane, kind: str, queues: list[str], batch: list[tuple[str, float]], first: int
) -> None:
    # Given a claim parked and held (on a queue of each kind, or on two queues)
    plane.ensure_queue(QueueSpec("k", kind=kind))
    plane.ensure_queue(QueueSpec("r"))
    with plane.changes.parking() as parked:
        assert plane.claim(queues, "w", limit=1, wait=5.0) == []
    park = parked()
    assert park is not None and park.taker is not None
    plane.changes.hold(park)
    # When a batch of calls is submitted on the holder's thread
    ids = plane.submit([Submission(new_id(), q, PAYLOAD, priority=p) for q, p in batch])
    # Then none is handed over: the claim looks, and takes the one its queues' order puts
    # first (a hand-over in the batch's order took the other)
    assert park.box == [] and all(plane.get(i).state is State.PENDING for i in ids)
    plane.changes.unhold(park)
    assert [c.id for c in plane.claim(queues, "w")] == [ids[first]]


def test_nothing_is_handed_over_once_a_change_since_the_claims_look_was_told(
    plane: Plane,
) -> None:
    # Given a claim parked and held, and a call another worker holds
    old = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    (held,) = plane.claim(["q"], "other")
    park, woken = _park(plane)
    # When that call is handed back (pending again: older than any new one), then a new
    # call is submitted on the holder's thread
    plane.release(held.id, held.lease_token)
    new = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    # Then the new call is not handed over past the older one: the claim looks
    assert park.box == [] and woken == []
    plane.changes.unhold(park)
    assert [c.id for c in plane.claim(["q"], "w")] == [old]
    assert plane.get(new).state is State.PENDING


def test_nothing_is_handed_over_once_the_claims_scheduled_work_is_due() -> None:
    # Given a call due in 1 s of plane time, and a claim parked (to look again when it
    # comes due)
    clock = FakeClock()
    plane = Plane(SqliteStore(":memory:"), clock=clock)
    try:
        plane.ensure_queue(QueueSpec("q"))
        later = plane.submit([Submission(new_id(), "q", PAYLOAD, delay=1.0)])[0]
        park, woken = _park(plane)
        # When it has come due (its holder has not looked again yet) and a call is
        # submitted
        clock.advance(1.1)
        now = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
        # Then the new call is not handed over past the one come due
        assert park.box == [] and woken == []
        plane.changes.unhold(park)
        assert [c.id for c in plane.claim(["q"], "w")] == [later]
        assert plane.get(now).state is State.PENDING
    finally:
        plane.close()


def test_nothing_is_handed_over_after_another_process_wrote_the_plane_file(
    tmp_path: Any,
) -> None:
    # Given a plane file served here, a claim parked and held on it
    here = Plane(SqliteStore(tmp_path / "plane.db"))
    elsewhere = Plane(SqliteStore(tmp_path / "plane.db"))
    try:
        here.ensure_queue(QueueSpec("q"))
        park, woken = _park(here)
        # When another process submits a call, then this one does before its poller
        # has seen the other's write
        first = elsewhere.submit([Submission(new_id(), "q", PAYLOAD)])[0]
        second = here.submit([Submission(new_id(), "q", PAYLOAD)])[0]
        # Then the second is not handed over past the first: the claim looks
        assert park.box == [] and woken == []
        here.changes.unhold(park)
        assert [c.id for c in here.claim(["q"], "w")] == [first]
        assert here.get(second).state is State.PENDING
    finally:
        elsewhere.close()
        here.close()


def test_a_submit_that_fails_after_its_write_still_delivers_the_handed_call(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim parked and held, and a store whose queue bookkeeping fails after the
    # record is written
    park, woken = _park(plane)
    plane._touched.clear()

    def broken(*args: Any) -> None:
        raise OSError("disk I/O error")

    monkeypatch.setattr(plane.store, "touch_queue", broken)
    sub = Submission(new_id(), "q", PAYLOAD)
    # When the submit fails after the write
    with pytest.raises(OSError):
        plane.submit([sub])
    # Then the call written leased is in the claim's box and its holder woken (not left
    # leased to nobody until its lease runs out)
    assert [c.id for c in park.box] == [sub.id] and woken == [True]
    assert plane.get(sub.id).lease_token == park.box[0].lease_token
    plane.changes.unhold(park)


def test_a_submit_that_fails_puts_the_claim_back_on_the_books(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim parked and held, and a store whose next write fails
    park, woken = _park(plane)

    def broken(invs: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(plane.store, "insert_many", broken)
    # When a submit fails
    with pytest.raises(OSError):
        plane.submit([Submission(new_id(), "q", PAYLOAD)])
    monkeypatch.undo()
    # Then the claim was handed nothing and is on the books for the next one
    assert park.box == [] and woken == [] and plane.changes.takers
    started = time.monotonic()
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    assert [c.id for c in park.box] == [inv] and time.monotonic() - started < 5
    plane.changes.unhold(park)


def test_a_queue_capped_since_the_claim_parked_is_not_handed_over(plane: Plane) -> None:
    # Given a claim parked and held on an uncapped queue, which is then given a running
    # cap of 1 while another worker runs one of its calls
    plane.submit([Submission(new_id(), "q", PAYLOAD)])
    assert plane.claim(["q"], "other")
    park, woken = _park(plane)
    plane.update_queue("q", elasticity={"kind": "fixed", "min": 0, "max": 1})
    # When a call is submitted on the holder's thread
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    # Then it is not handed over past the cap: it waits, pending
    assert park.box == [] and woken == []
    assert plane.get(inv).state is State.PENDING
    plane.changes.unhold(park)


def test_a_hand_back_that_fails_is_logged_and_lets_the_holder_go_on(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a claim handed a call, whose holder cannot deliver it, on a store that fails
    park, _ = _park(plane)
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    plane.changes.unhold(park)

    def broken(*args: Any) -> None:
        raise OSError("disk I/O error")

    monkeypatch.setattr(plane, "release", broken)
    # When the park is let go
    park.release()
    # Then the failure is logged, not raised (the call stays leased until its lease runs
    # out, and the sweep hands it on)
    assert "handing back claim" in caplog.text and inv in caplog.text
    assert park.box == []


def test_a_claim_whose_look_lost_a_race_is_not_handed_a_newer_call(tmp_path: Any) -> None:
    # Given three pending calls on a plane file, and a claim whose look reads the first
    # two while a claim on another thread leases both before it can
    plane = Plane(SqliteStore(tmp_path / "plane.db"))
    try:
        plane.ensure_queue(QueueSpec("q"))
        a, b, c = (plane.submit([Submission(new_id(), "q", PAYLOAD)])[0] for _ in range(3))
        real = plane.store.pending

        def racing(*args: Any) -> Any:
            got = real(*args)
            plane.store.pending = real  # type: ignore[method-assign]
            other = threading.Thread(target=plane.claim, args=(["q"], "t"), kwargs={"limit": 2})
            other.start()
            other.join(10)
            return got

        plane.store.pending = racing  # type: ignore[method-assign]
        with plane.changes.parking() as parked:
            assert plane.claim(["q"], "w", wait=5.0) == []
        park = parked()
        assert park is not None
        # Then it parks off the books (its look left c pending), and a new call is not
        # handed to it past c
        assert park.taker is None
        plane.changes.hold(park)
        new = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
        assert plane.get(new).state is State.PENDING
        plane.changes.unhold(park)
        assert [x.id for x in plane.claim(["q"], "w")] == [c]
        assert {plane.get(i).worker for i in (a, b)} == {"t"}
    finally:
        plane.close()


# --- claims blocking in a thread (an embedded plane: run_worker, a process worker's fetcher)


@pytest.fixture
def no_naps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocking claims do not look again every 0.25 s (only a wake, or their time, ends
    their wait): a look these tests count is one a wake or a hand-over caused."""
    monkeypatch.setattr(workers_module, "LOOK_AGAIN", 60.0)


def _blocking(
    plane: Plane,
    worker: str = "w",
    *,
    wait: float = 10.0,
    queues: tuple[str, ...] = ("q",),
    capped: bool = False,
) -> tuple[threading.Thread, list[list[Claim]]]:
    """Worker ``worker``'s claim blocking in a thread of this process, asleep (on the
    books for a hand-over, unless ``capped``) once this returns: its thread, and what
    it gets."""
    got: list[list[Claim]] = []
    before = len(plane.changes._sleepers)
    books = len(plane.changes._takers) + (0 if capped else 1)

    def claim() -> None:
        got.append(plane.claim(list(queues), worker, wait=wait))

    thread = threading.Thread(target=claim, name=f"claim-{worker}")
    thread.start()
    wait_for(lambda: len(plane.changes._sleepers) > before, 5, "the claim did not wait")
    assert len(plane.changes._takers) == books
    return thread, got


def test_a_call_submitted_while_a_claim_blocks_in_a_thread_is_handed_to_it_without_a_look(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, no_naps: None
) -> None:
    # Given a worker's claim blocking in a thread on an empty queue
    thread, got = _blocking(plane, "gpu-1")
    looks = counting_calls(plane, "_claim_now", monkeypatch)
    # When a call is submitted on another thread
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    # Then the claim gets it without looking at the store again
    thread.join(10)
    (claim,) = got[0]
    assert claim.id == inv and claim.attempt == 1 and looks == []
    # ... the record written leased to that worker, its lease the worker's to complete
    rec = plane.get(inv)
    assert rec.state is State.RUNNING and rec.worker == "gpu-1"
    assert rec.lease_token == claim.lease_token
    plane.complete(inv, claim.lease_token, b"\x01")
    assert plane.get(inv).state is State.SUCCEEDED


def test_a_hand_over_to_a_blocking_claim_wakes_no_other(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, no_naps: None
) -> None:
    # Given a claim blocking on q, then two on r
    plane.ensure_queue(QueueSpec("r"))
    thread, got = _blocking(plane, "on-q")
    others = [_blocking(plane, f"on-r-{n}", queues=("r",)) for n in range(2)]
    looks = counting_calls(plane, "_claim_now", monkeypatch)
    # When a call on q is submitted
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    # Then the claim on q is handed it, and the others sleep on, not woken to look
    thread.join(10)
    assert [c.id for c in got[0]] == [inv]
    assert len(plane.changes._sleepers) == 2 and looks == []
    # ... and each call on r goes to one of them, oldest first
    on_r = [plane.submit([Submission(new_id(), "r", PAYLOAD)])[0] for _ in others]
    for t, _ in others:
        t.join(10)
    assert [[c.id for c in got_r[0]] for _, got_r in others] == [[i] for i in on_r]
    assert looks == []


def _handed_in_a_slow_write(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, written_once: Callable[[Any], bool]
) -> tuple[str, list[list[Claim]]]:
    """A claim blocking on an empty queue for 0.3 s is handed a call whose write waits
    until ``written_once(taker)`` holds of the claim's books entry (the submit returns
    once it is written): the call's id, and what the claim answered."""
    monkeypatch.setattr(workers_module, "LOOK_AGAIN", 5.0)
    thread, got = _blocking(plane, "w", wait=0.3)
    reserved: list[Any] = []
    reserve, insert_many = plane.changes.reserve, plane.store.insert_many

    def reserving(*args: Any) -> Any:
        taker = reserve(*args)
        reserved.append(taker)
        return taker

    def slow(invs: Any) -> Any:
        wait_for(lambda: written_once(reserved[0]), 10, "the claim never got there")
        return insert_many(invs)

    monkeypatch.setattr(plane.changes, "reserve", reserving)
    monkeypatch.setattr(plane.store, "insert_many", slow)
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    thread.join(10)
    return inv, got


def test_a_blocking_claim_whose_time_runs_out_while_a_call_is_handed_to_it_takes_it(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim blocking for 0.3 s, when a call is handed to it and written only once
    # the claim's time has run out (it has left its wait, and waits for the submit)
    inv, got = _handed_in_a_slow_write(plane, monkeypatch, lambda taker: taker.thread == 0)
    # Then the claim answered with the call (it is leased to its worker: not left to a
    # claim that is gone, until its lease runs out)
    assert [c.id for c in got[0]] == [inv]
    assert plane.get(inv).worker == "w"
    assert not plane.changes.takers


def test_a_blocking_claim_that_gives_up_on_a_slow_hand_over_leaves_the_call_pending(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a claim blocking for 0.3 s that waits at most 0.2 s for a submit that
    # reserved it, when a call is handed to it and written after it gave up on it
    monkeypatch.setattr(changes_module, "_RESERVED_WAIT", 0.2)
    inv, got = _handed_in_a_slow_write(plane, monkeypatch, lambda taker: taker.abandoned)
    # Then the claim answered nothing, and the call was handed back: pending, untried
    # (not leased to a claim that is gone until its lease runs out)
    assert got == [[]]
    rec = plane.get(inv)
    assert (rec.state, rec.attempt, rec.worker) == (State.PENDING, 0, None)
    (claim,) = plane.claim(["q"], "other")
    assert (claim.id, claim.attempt) == (inv, 1)


def test_a_claim_handed_a_call_takes_no_wake_meant_for_another(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, no_naps: None
) -> None:
    # Given three claims blocking on q, and a lone call handed to the first whose write
    # waits until the batch below is in
    claims = [_blocking(plane, f"w{n}", wait=30.0) for n in range(3)]
    real = plane.store.insert_many
    writing, batch_in = threading.Event(), threading.Event()

    def slow(invs: Any) -> Any:
        if len(invs) == 1:
            writing.set()
            assert batch_in.wait(10)
        return real(invs)

    monkeypatch.setattr(plane.store, "insert_many", slow)
    lone = threading.Thread(target=plane.submit, args=([Submission("lone", "q", PAYLOAD)],))
    lone.start()
    assert writing.wait(5)
    # When a batch of two calls is submitted meanwhile (two wakes)
    plane.submit([Submission(f"batch-{n}", "q", PAYLOAD) for n in range(2)])
    batch_in.set()
    lone.join(10)
    # Then each claim gets a call at once: the batch's wakes went to the two claims not
    # handed the lone one (a wake taken by that one would leave a call to a nap)
    for thread, _ in claims:
        thread.join(5)
        assert not thread.is_alive()
    ids = [[c.id for c in got[0]] for _, got in claims]
    assert ids[0] == ["lone"] and sorted(ids[1] + ids[2]) == ["batch-0", "batch-1"]


def test_a_wake_goes_to_the_claims_asleep_oldest_first_handed_or_not(
    plane: Plane, no_naps: None
) -> None:
    # Given claims blocking on a and b (on the books for a hand-over), then one on a
    # capped queue x (not on the books: a look counts its cap)
    for name in ("a", "b"):
        plane.ensure_queue(QueueSpec(name))
    plane.ensure_queue(QueueSpec("x", elasticity={"kind": "fixed", "min": 0, "max": 1}))
    others = [_blocking(plane, f"on-{name}", queues=(name,), wait=30.0) for name in ("a", "b")]
    thread, got = _blocking(plane, "on-x", queues=("x",), capped=True, wait=30.0)
    # When a call on x is submitted (not handed over: one wake)
    inv = plane.submit([Submission(new_id(), "x", PAYLOAD)])[0]
    # Then the wake went to the claim on a, which passed it on to the one on b, which
    # passed it on to the one on x (each woken claim that sleeps again goes to the end
    # of the line), and that one takes the call at once
    thread.join(5)
    assert not thread.is_alive() and [c.id for c in got[0]] == [inv]
    for name, (t, _) in zip(("a", "b"), others, strict=True):
        plane.submit([Submission(new_id(), name, PAYLOAD)])
        t.join(10)


def test_a_submit_that_fails_puts_the_blocking_claim_back_on_the_books(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, no_naps: None
) -> None:
    # Given a claim blocking on an empty queue, and a store whose next write fails
    thread, got = _blocking(plane, "w")
    looks = counting_calls(plane, "_claim_now", monkeypatch)
    real = plane.store.insert_many

    def broken(invs: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(plane.store, "insert_many", broken)
    # When a submit fails
    with pytest.raises(OSError):
        plane.submit([Submission(new_id(), "q", PAYLOAD)])
    monkeypatch.setattr(plane.store, "insert_many", real)
    # Then the claim was handed nothing, sleeps on, and is on the books for the next call
    assert got == [] and plane.changes.takers and thread.is_alive()
    inv = plane.submit([Submission(new_id(), "q", PAYLOAD)])[0]
    thread.join(10)
    assert [c.id for c in got[0]] == [inv] and looks == []


def test_nothing_is_handed_to_a_blocking_claim_after_another_process_wrote_the_plane_file(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, no_naps: None
) -> None:
    # Given a plane file, and a claim blocking on it in a thread of this process (whose
    # poller is not running: it would see another process's write, and wake the claim
    # to look, before a submit here)
    here = Plane(SqliteStore(tmp_path / "plane.db"))
    elsewhere = Plane(SqliteStore(tmp_path / "plane.db"))
    monkeypatch.setattr(here.changes, "_ensure_poller", lambda: None)
    try:
        here.ensure_queue(QueueSpec("q"))
        thread, got = _blocking(here, "w")
        # When another process submits a call, then this one does
        first = elsewhere.submit([Submission(new_id(), "q", PAYLOAD)])[0]
        second = here.submit([Submission(new_id(), "q", PAYLOAD)])[0]
        # Then the second is not handed over past the first: the claim takes the first
        thread.join(10)
        assert [c.id for c in got[0]] == [first]
        assert here.get(second).state is State.PENDING
    finally:
        elsewhere.close()
        here.close()


def test_a_batch_is_not_handed_to_a_blocking_claim_it_looks(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, no_naps: None
) -> None:
    # Given a claim blocking on an empty queue
    thread, got = _blocking(plane, "w")
    looks = counting_calls(plane, "_claim_now", monkeypatch)
    # When a batch of two calls is submitted
    ids = plane.submit([Submission(new_id(), "q", PAYLOAD) for _ in range(2)])
    # Then the claim is woken, looks, and takes the first
    thread.join(10)
    assert [c.id for c in got[0]] == ids[:1] and len(looks) == 1
    assert plane.get(ids[1]).state is State.PENDING
