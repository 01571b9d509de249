"""A result wait parked on ``lakeshore serve`` keeps its watch while it is parked: the
finish of one of its ids wakes it (another id's finish does not) and brings the record
its answer is made from, without a second look at the plane; whatever ends the request
releases the watch."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import pytest
from support import counting_calls, wait_for

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import wire
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.server import LocalServer, PlaneASGI
from dreamlake.lakeshore.stores import SqliteStore


@pytest.fixture
def settled(served: LocalServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """One entry per wake of a parked request at which its kept records were looked at:
    True when they made the answer."""
    assert served.asgi is not None
    made: list[bool] = []
    settle = served.asgi._settled

    def counting(park: Any) -> Any:
        answer = settle(park)
        made.append(answer is not None)
        return answer

    monkeypatch.setattr(served.asgi, "_settled", counting)
    yield made


def _plane(served: LocalServer) -> tuple[Plane, PlaneASGI]:
    assert served.plane is not None and served.asgi is not None and served.admin_token
    return served.plane, served.asgi


def _complete(plane: Plane, inv_id: str, value: Any) -> None:
    """Claim what the queue holds and complete ``inv_id`` (the rest go back)."""
    for claim in plane.claim(["settled"], "w1", limit=10):
        if claim.id == inv_id:
            plane.complete(claim.id, claim.lease_token, wire.encode_result(value)[0])
        else:
            plane.release(claim.id, claim.lease_token)


@contextmanager
def _waiting(served: LocalServer, producers: int = 1) -> Iterator[tuple[str, list[Any]]]:
    """A call on a served plane and ``producers`` threads waiting for its result (parked);
    yields its id and the list their answers land in, and joins them after."""
    _, asgi = _plane(served)
    with dls.Dispatch(served.url, token=served.admin_token) as producer:
        q = dls.SyncQueue("settled", dispatch=producer)
        inv = q.submit(pow, 2, 10)
        got: list[Any] = []
        waiting = [
            threading.Thread(target=lambda: got.append(q.result(inv, timeout=30)))
            for _ in range(producers)
        ]
        for t in waiting:
            t.start()
        wait_for(lambda: asgi.held()[1] == producers, 10, "the waits never parked")
        yield inv, got
        for t in waiting:
            t.join(10)


def test_a_parked_result_wait_is_answered_from_the_finish_that_woke_it(
    served: LocalServer, settled: list[bool]
) -> None:
    # Given a call on a served plane and its producer waiting for the result (parked)
    plane, _ = _plane(served)
    with _waiting(served) as (inv, got):
        # When a worker completes it
        _complete(plane, inv, 1024)
    # Then the wait answers with the result, made from the record the finish brought
    assert got == [1024]
    assert settled[-1] is True


def test_another_calls_finish_does_not_wake_a_parked_result_wait(
    served: LocalServer, settled: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a wait parked on one call, and another call on the plane
    plane, asgi = _plane(served)
    looks: list[int] = []
    resolve = asgi._resolve
    monkeypatch.setattr(asgi, "_resolve", lambda event: looks.append(1) or resolve(event))
    with dls.Dispatch(served.url, token=served.admin_token) as producer:
        q = dls.SyncQueue("settled", dispatch=producer)
        mine, other = q.submit(pow, 2, 3), q.submit(pow, 2, 4)
        got: list[Any] = []
        waiting = threading.Thread(target=lambda: got.append(q.result(mine, timeout=30)))
        waiting.start()
        wait_for(lambda: len(asgi._parked) == 1, 10, "the wait never parked")
        # When the other call finishes: the wait is not woken for it (only its nap,
        # every 0.25 s, looks again), and its kept records are never looked at empty
        before = len(looks)
        woken_before = len(settled)
        _complete(plane, other, 16)
        assert len(settled) == woken_before
        # When its own call finishes
        _complete(plane, mine, 8)
        waiting.join(10)
    # Then it gets its own result, from the record its finish brought
    assert got == [8] and settled[-1] is True
    assert len(looks) - before <= 2 + 4 * 2  # (naps at most, not one per finish)


def test_a_parked_wait_answered_from_its_records_is_answered_as_a_fresh_look_would(
    served: LocalServer,
) -> None:
    # Given a parked wait in each media type on a call that then finishes
    plane, asgi = _plane(served)
    changes = plane.changes
    with dls.Dispatch(served.url, token=served.admin_token) as producer:
        q = dls.SyncQueue("settled", dispatch=producer)
        calls = [q.submit(pow, 2, 5), q.submit(pow, 2, 6)]
    for media, inv in zip(("application/json", "application/msgpack"), calls, strict=True):
        body = {"ids": [inv], "timeout": 20}
        raw = json.dumps(body).encode() if media.endswith("json") else msgpack.packb(body)
        headers = {
            "authorization": f"Bearer {served.admin_token}",
            "content-type": media,
            "accept": media,
        }
        event = apigw.http_event(
            "POST", "/v1/invocations/wait", headers=headers, body=raw, raw_body=True
        )
        with changes.parking() as parked:
            asgi._resolve(event)
        park = parked()
        assert park is not None and park.box == []
        _complete(plane, inv, 32)
        # When its records make the answer, and when the plane is looked at afresh
        from_box = asgi._settled(park)
        assert park.release is not None
        park.release()
        with changes.parking() as parked:
            fresh = asgi._resolve(event)
        assert parked() is None
        # Then both say the same, in the type asked for; the cursor from before the
        # finish (the next wait from it reads that finish again: harmless)
        assert from_box is not None
        assert (from_box[0], dict(from_box[1])) == (fresh[0], dict(fresh[1]))
        decode = json.loads if media.endswith("json") else msgpack.unpackb
        boxed, looked = decode(from_box[2]), decode(fresh[2])
        assert boxed.pop("cursor") < looked.pop("cursor")
        assert boxed == looked and boxed["invocations"][0]["state"] == "succeeded"
    assert not changes._watches


def _raw_wait(served: LocalServer, inv_id: str, timeout: float) -> int:
    """A wait over a plain connection (no retries): the answer's status."""
    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/invocations/wait",
            body=json.dumps({"ids": [inv_id], "timeout": timeout}),
            headers={
                "authorization": f"Bearer {served.admin_token}",
                "content-type": "application/json",
            },
        )
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


@pytest.mark.parametrize("end", ["time is up", "the server stops"])
def test_a_parked_result_wait_on_work_that_never_finishes_keeps_no_watch(
    served: LocalServer, end: str
) -> None:
    # Given a wait parked on a call nobody runs (its watch kept while it is parked)
    plane, asgi = _plane(served)
    with dls.Dispatch(served.url, token=served.admin_token) as producer:
        inv = dls.SyncQueue("settled", dispatch=producer).submit(pow, 2, 3)
    answers: list[int] = []
    waiting = threading.Thread(
        target=lambda: answers.append(_raw_wait(served, inv, 0.7 if end == "time is up" else 20))
    )
    waiting.start()
    wait_for(lambda: len(asgi._parked) == 1, 10, "the wait never parked")
    assert plane.changes._watches  # (the kept watch)
    # When its time runs out (after a few naps), or the server stops
    if end == "the server stops":
        asgi.stop()
    waiting.join(10)
    # Then it is answered, and no watch is left
    assert answers == [200 if end == "time is up" else 503]
    assert not plane.changes._watches


def test_an_idle_parked_result_wait_is_not_looked_at_again_until_its_call_finishes(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given producers waiting (parked) for a call no worker has taken
    plane, _ = _plane(served)
    with _waiting(served, producers=3) as (inv, got):
        wait_for(lambda: plane.changes.polling, 10)  # (its first look: a change, once)
        asked = counting_calls(plane, "wait", monkeypatch)
        # When nothing finishes for over a second (each looked again every 0.25 s before;
        # this is the time the test watches)
        time.sleep(1.2)
        # Then none was looked at again
        assert asked == []
        # When the call finishes, every wait answers with its result
        _complete(plane, inv, 1024)
    assert got == [1024, 1024, 1024]


def test_a_parked_result_wait_hears_of_a_finish_written_by_another_process(
    served: LocalServer,
) -> None:
    # Given a producer waiting (parked) for a call on a served plane file
    with _waiting(served) as (_, got):
        # When another plane on the same file (as another process would) completes it
        began = time.monotonic()
        other = Plane(SqliteStore(served.plane_path))
        try:
            (claim,) = other.claim(["settled"], "elsewhere")
            other.complete(claim.id, claim.lease_token, wire.encode_result(1024)[0])
        finally:
            other.close()
    # Then the wait answers with the result at once (the server's poller saw the write)
    assert got == [1024]
    assert time.monotonic() - began < 5
