"""An idle worker's claim parked on ``lakeshore serve`` costs the server nothing until
work arrives: it is looked at again when work is submitted, when scheduled work comes
due, when a paused queue it names is resumed, and when the sweep (which the server runs
while claims are parked) hands on a lease that ran out — not on a timer of its own."""

from __future__ import annotations

import functools
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import counting_calls, role_token, wait_for
from support import parked_claims_settled as _settled

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.plane import Plane, QueueSpec, Submission
from dreamlake.lakeshore.plane.model import Claim
from dreamlake.lakeshore.server import LocalServer, PlaneASGI
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.submit import new_id
from dreamlake.lakeshore.wire import encode_ref_call

PAYLOAD = encode_ref_call("math:sqrt", (4.0,), {}).payload


@pytest.fixture
def claiming(served: LocalServer) -> Iterator[Callable[[list[str], float], list[list[Claim]]]]:
    """Starts a worker's claim (over HTTP, in a thread) on queues, waiting up to a time;
    its answer lands in the list returned."""
    token = role_token(served, "worker")
    threads: list[threading.Thread] = []

    def start(queues: list[str], wait: float) -> list[list[Claim]]:
        got: list[list[Claim]] = []

        def claim() -> None:
            with dls.Dispatch(served.url, token=token) as dp:
                got.append(dp.transport.claim(queues, "w", limit=1, wait=wait))

        threads.append(threading.Thread(target=claim))
        threads[-1].start()
        return got

    yield start
    for t in threads:
        t.join(30)


def _submit(served: LocalServer, queue: str, **options: Any) -> str:
    assert served.admin_token is not None
    with dls.Dispatch(served.url, token=served.admin_token) as producer:
        return dls.SyncQueue(queue, dispatch=producer).submit(pow, 2, 8, **options)


def test_idle_parked_claims_are_not_looked_at_again_until_work_arrives(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given three idle workers' claims parked on the server
    plane, asgi = parts
    _submit(served, "idle")  # (the queue exists: its one call is taken first)
    assert plane.claim(["idle"], "other")
    answers = [claiming(["idle"], 20.0) for _ in range(3)]
    _settled(plane, asgi, 3)
    asked = counting_calls(plane, "claim", monkeypatch)
    # When nothing happens for over a second (a parked claim was looked at again every
    # 0.25 s before: twelve looks here; this is the time the test watches)
    time.sleep(1.2)
    # Then none was looked at again
    assert asked == []
    # When a call is submitted, one of them takes it at once
    inv = _submit(served, "idle")
    wait_for(lambda: any(answers), 10, "no parked claim took the new call")
    assert [c.id for got in answers for c in (got[0] if got else [])] == [inv]
    assert asgi.held()[0] == 2


def test_a_lease_that_runs_out_while_every_claim_is_parked_is_handed_on(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
) -> None:
    # Given a call whose worker was lost (its 1 s lease is never renewed)
    plane, _ = parts
    inv = _submit(served, "lost")
    (lost,) = plane.claim(["lost"], "gone", lease_seconds=1.0)
    assert lost.id == inv
    # When the only other worker's claim is parked, waiting up to 20 s
    started = time.monotonic()
    got = claiming(["lost"], 20.0)
    # Then it gets the call again soon after the lease ran out (the server sweeps while
    # claims are parked), its second attempt
    wait_for(lambda: bool(got), 10, "the expired lease was not handed on")
    assert time.monotonic() - started < 5.0
    (again,) = got[0]
    assert (again.id, again.attempt) == (inv, 2)


def test_a_parked_claim_takes_a_delayed_call_when_it_comes_due(
    served: LocalServer, claiming: Callable[[list[str], float], list[list[Claim]]]
) -> None:
    # Given a parked claim and a call submitted with a 1 s delay
    got = claiming(["later"], 20.0)
    assert served.asgi is not None
    wait_for(lambda: served.asgi is not None and served.asgi.held()[0] == 1, 10)
    submitted = time.monotonic()
    inv = _submit(served, "later", _delay=1.0)
    # Then the claim takes it once due, not at the end of its wait
    wait_for(lambda: bool(got), 10, "the delayed call was not claimed when due")
    took = time.monotonic() - submitted
    assert 0.9 <= took < 5.0
    assert [c.id for c in got[0]] == [inv]


def test_a_parked_claim_takes_the_work_of_a_queue_resumed_meanwhile(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
) -> None:
    # Given a paused queue holding a call, and a claim parked on it and an open queue
    plane, asgi = parts
    assert served.admin_token is not None
    with dls.Dispatch(served.url, token=served.admin_token) as admin:
        inv = _submit(served, "held")
        admin.transport.update_queue("held", paused=True)  # type: ignore[attr-defined]
        _submit(served, "open")
        assert plane.claim(["open"], "other")
        got = claiming(["open", "held"], 20.0)
        wait_for(lambda: asgi.held()[0] == 1, 10, "the claim never parked")
        # When the queue is resumed
        admin.transport.update_queue("held", paused=False)  # type: ignore[attr-defined]
    # Then the parked claim takes its call at once
    wait_for(lambda: bool(got), 5, "the resumed queue's call was not claimed")
    assert [c.id for c in got[0]] == [inv]


def _in_the_parking_window(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]
) -> None:
    """Run ``act`` (once) after a claim's look and before its park is held: the window in
    which a change can slip past a park."""
    changes = plane.changes
    hold = changes.hold
    done: list[bool] = []

    def late_hold(park: Any) -> None:
        if not done:
            done.append(True)
            acting = threading.Thread(target=act)  # (another request's thread)
            acting.start()
            acting.join()
        hold(park)

    monkeypatch.setattr(changes, "hold", late_hold)


def test_a_slot_freed_as_a_capped_claim_parks_is_not_missed(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a queue capped at one running call, its slot held, a second call waiting
    plane, _ = parts
    plane.ensure_queue(QueueSpec("capped", elasticity={"kind": "fixed", "max": 1}))
    _submit(served, "capped")
    second = _submit(served, "capped")
    (running,) = plane.claim(["capped"], "w1")
    # (a claim parked elsewhere keeps the server's poller running, its first look done:
    # that look's wake would otherwise hide the window)
    claiming(["elsewhere"], 6.0)
    _settled(plane, parts[1], 1)
    # When the running call finishes just as another worker's claim parks (held back by
    # the cap)
    finish = functools.partial(plane.complete, running.id, running.lease_token, b"\x00done")
    _in_the_parking_window(plane, monkeypatch, finish)
    started = time.monotonic()
    got = claiming(["capped"], 20.0)
    # Then that claim takes the second call at once, not at the end of its wait
    wait_for(lambda: bool(got), 10, "the freed slot was not noticed")
    assert time.monotonic() - started < 3.0
    assert [c.id for c in got[0]] == [second]


def test_another_process_write_as_a_claim_parks_is_not_missed(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a served plane nobody waits on (its poller of the file has stopped)
    plane, _ = parts
    plane.ensure_queue(QueueSpec("shared"))
    other = Plane(SqliteStore(served.plane_path))  # as another process would
    wait_for(lambda: plane.changes._poller is None, 10, "the poller never stopped")
    # When another process submits just as a worker's claim parks
    submission = Submission(
        id=new_id(), queue="shared", payload=encode_ref_call("math:sqrt", (4.0,), {}).payload
    )
    _in_the_parking_window(plane, monkeypatch, lambda: other.submit([submission]))
    started = time.monotonic()
    got = claiming(["shared"], 20.0)
    # Then the claim takes it at once (the poller's first look counts as a change)
    wait_for(lambda: bool(got), 10, "the other process's call was not noticed")
    other.close()
    assert time.monotonic() - started < 3.0
    assert [c.id for c in got[0]] == [submission.id]


def test_a_call_coming_due_during_a_claims_look_is_not_missed(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a call delayed 0.3 s, and a claim whose look finds it not yet due but which
    # (held up) reckons its next look after the call came due
    plane, _ = parts
    claiming(["elsewhere"], 6.0)  # (the server's poller running, its first look done)
    _settled(plane, parts[1], 1)
    inv = _submit(served, "soon", _delay=0.3)
    reckon = plane._next_due
    held_up: list[bool] = []

    def late(queues: Any, looked_at: float) -> tuple[float, bool]:
        if list(queues) == ["soon"] and not held_up:
            held_up.append(True)
            due = plane.store.next_available_at("soon")
            assert due is not None
            # the look took until just past the call's time (the plane's clock says so)
            monkeypatch.setattr(plane, "clock", FakeClock(due + 0.01))
        return reckon(queues, looked_at)

    monkeypatch.setattr(plane, "_next_due", late)
    started = time.monotonic()
    got = claiming(["soon"], 20.0)
    # Then it looks again at once and takes the call
    wait_for(lambda: bool(got), 10, "the call that came due was not claimed")
    assert held_up and time.monotonic() - started < 2.0
    assert [c.id for c in got[0]] == [inv]


def test_a_claim_naming_a_paused_queue_answers_by_the_pause_recheck(
    served: LocalServer,
) -> None:
    # Given a paused queue and an open one, both empty
    assert served.admin_token is not None
    with dls.Dispatch(served.url, token=served.admin_token) as admin:
        for name in ("paused", "open"):
            admin.transport.ensure_queue(QueueSpec(name))  # type: ignore[attr-defined]
        admin.transport.update_queue("paused", paused=True)  # type: ignore[attr-defined]
    # When a worker claims on both, waiting up to 20 s (one request: the SDK would ask
    # again after an empty answer)
    body = json.dumps({"queues": ["open", "paused"], "worker": "w", "wait": 20}).encode()
    request = urllib.request.Request(
        f"{served.url}/v1/claims",
        data=body,
        headers={
            "Authorization": f"Bearer {role_token(served, 'worker')}",
            "Content-Type": "application/json",
        },
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=30) as answer:
        claims = json.load(answer)["claims"]
    # Then it answers (empty) by about the recheck, so the worker's next claim sees a
    # resume made meanwhile by another server process (which wakes nothing here)
    assert claims == [] and time.monotonic() - started < 3.0


def test_finishes_wake_only_the_capped_claims_they_may_free_a_slot_for(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given five idle claims parked on one queue and one held back by a full cap
    plane, asgi = parts
    plane.ensure_queue(QueueSpec("capped", elasticity={"kind": "fixed", "max": 1}))
    for name in ("idle", "busy"):
        plane.ensure_queue(QueueSpec(name))
    _submit(served, "capped")
    _submit(served, "capped")
    (hog,) = plane.claim(["capped"], "hog")
    for _ in range(5):
        claiming(["idle"], 6.0)
    capped = claiming(["capped"], 6.0)
    _settled(plane, asgi, 6)
    calls = [_submit(served, "busy") for _ in range(5)]
    asked = counting_calls(plane, "claim", monkeypatch)
    # When calls of another queue finish, one after another
    for inv in calls:
        (claim,) = plane.claim(["busy"], "w")
        assert claim.id == inv
        plane.complete(claim.id, claim.lease_token, b"\x00done")
        _settled(plane, asgi, 6)  # (each wake answered before the next finish)
    # Then no parked claim looks again: the idle ones wait for work, and the capped one
    # for a slot on its own queue (5 of the claims asked for are the test's own)
    assert len(asked) == 5
    # When the call holding the capped queue's slot finishes
    plane.complete(hog.id, hog.lease_token, b"\x00done")
    # Then the capped claim takes the call the cap held back, at once
    wait_for(lambda: bool(capped), 10, "the capped claim was not woken for its slot")
    assert [c.queue for c in capped[0]] == ["capped"]


def test_a_wake_a_claim_could_not_use_passes_only_to_claims_on_its_queues(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given five idle claims parked on one queue and two on another
    plane, asgi = parts
    for name in ("idle", "work"):
        plane.ensure_queue(QueueSpec(name))
    idle = [claiming(["idle"], 6.0) for _ in range(5)]
    work = [claiming(["work"], 6.0) for _ in range(2)]
    _settled(plane, asgi, 7)
    asked = counting_calls(plane, "claim", monkeypatch)
    # When a call on the second queue is taken by another worker before the woken claim
    # looks (the store is held: the woken claim's look waits for the theft)
    submission = Submission(
        id=new_id(), queue="work", payload=encode_ref_call("math:sqrt", (4.0,), {}).payload
    )
    with plane.store.transaction():  # type: ignore[attr-defined]
        plane.submit([submission])
        (stolen,) = plane.claim(["work"], "thief")
    assert stolen.id == submission.id
    _settled(plane, asgi, 7)
    # Then the woken claim passed the wake to the other claim on its queue, and no
    # claim idle on the first queue looked (each did, one after another, before): the
    # thief's claim and two looks
    assert len(asked) == 1 + 2
    assert not any(idle) and not any(work)


def test_a_claim_on_two_queues_that_takes_the_other_queues_call_passes_its_wake_on(
    served: LocalServer, parts: tuple[Plane, PlaneASGI]
) -> None:
    # Given claims parked in this order: X on [b, a], Z on [b], W on [a]
    plane, asgi = parts
    for name in ("a", "b"):
        plane.ensure_queue(QueueSpec(name))
    token = role_token(served, "worker")
    got: dict[str, tuple[list[Claim], float]] = {}
    threads = []
    for name, queues in (("x", ["b", "a"]), ("z", ["b"]), ("w", ["a"])):

        def claim(name: str = name, queues: list[str] = queues) -> None:
            with dls.Dispatch(served.url, token=token) as dp:
                claims = dp.transport.claim(queues, name, limit=1, wait=4)
                got[name] = (claims, time.monotonic())

        threads.append(threading.Thread(target=claim))
        threads[-1].start()
        _settled(plane, asgi, len(threads))
    # When a call on a wakes X and, before X looks, a call on b is submitted (the store
    # is held: X's look waits; the wake for b, to Z, comes after it)
    with plane.store.transaction():  # type: ignore[attr-defined]
        plane.submit([Submission(new_id(), "a", PAYLOAD)])
        wait_for(lambda: asgi.held()[0] == 2, 5, "the call on a woke no claim")
        plane.submit([Submission(new_id(), "b", PAYLOAD)])
    began = time.monotonic()
    for t in threads:
        t.join(20)
    # Then X takes the b call (its first queue), Z finds nothing, and W still takes the
    # a call at once: X passed on the wake for a it did not use (Z's pass-on, for b,
    # does not reach W)
    assert [c.queue for c in got["x"][0]] == ["b"] and got["z"][0] == []
    assert [c.queue for c in got["w"][0]] == ["a"]
    assert got["w"][1] - began < 1.0


def test_a_claim_on_two_queues_that_takes_the_call_it_was_woken_for_passes_nothing_on(
    served: LocalServer,
    parts: tuple[Plane, PlaneASGI],
    claiming: Callable[[list[str], float], list[list[Claim]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given five workers' claims on [a, b] parked
    plane, asgi = parts
    for name in ("a", "b"):
        plane.ensure_queue(QueueSpec(name))
    got = [claiming(["a", "b"], 6.0) for _ in range(5)]
    _settled(plane, asgi, 5)
    asked = counting_calls(plane, "claim", monkeypatch)
    # When a call on a is submitted (by another thread than the server's loop: an HTTP
    # submit would hand it to the oldest claim without waking any, test_handoff.py)
    plane.submit([Submission(new_id(), "a", PAYLOAD)])
    wait_for(lambda: sum(bool(g and g[0]) for g in got) == 1, 5, "no claim took the call")
    _settled(plane, asgi, 4)
    # Then the claim woken for it took it and woke no other (each looked in turn when
    # the claim passed on a wake it had used)
    assert len(asked) == 1
