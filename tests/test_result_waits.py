"""Awaited results begun together share one watch (queue.py ``_Watching``), and each
still behaves as if it had waited alone: its own value, its own error, its own timeout.
On the embedded plane and over HTTP (``lakeshore serve``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import counting_calls, role_token, wait_for

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.errors import UnknownInvocation
from dreamlake.lakeshore.server import LocalServer
from dreamlake.lakeshore.wire import encode_result


@pytest.fixture(params=["embedded", "serve"])
def dp(request: pytest.FixtureRequest) -> Iterator[dls.Dispatch]:
    if request.param == "embedded":
        with dls.Dispatch(":memory:") as embedded:
            yield embedded
        return
    served: LocalServer = request.getfixturevalue("served")
    with dls.Dispatch(served.url, token=role_token(served, "admin")) as remote:
        yield remote


def finish(dp: dls.Dispatch, ids: list[str]) -> None:
    """Run the calls ``ids`` by hand: each returns its position in ``ids``."""
    claims = {c.id: c for c in dp.transport.claim(["w"], "hand", limit=len(ids), wait=0)}
    dp.transport.complete_many(
        [
            (i, claims[i].lease_token, encode_result(k, prefer_msgpack=True)[0])
            for k, i in enumerate(ids)
        ]
    )


def done_calls(dp: dls.Dispatch, n: int) -> tuple[dls.Queue, dls.SyncQueue, list[str]]:
    """The queue ``w``'s two surfaces and ``n`` calls on it run by hand (see finish)."""
    q, sq = dls.Queue("w", dispatch=dp), dls.SyncQueue("w", dispatch=dp)
    ids = [sq.submit("builtins:abs", -k) for k in range(n)]
    finish(dp, ids)
    return q, sq, ids


def watches_of(dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The id lists of every ``dp.transport.watch`` from now on."""
    seen: list[list[str]] = []
    real = dp.transport.watch

    def watch(ids: Any, callback: Any) -> Any:
        seen.append(list(ids))
        return real(ids, callback)

    monkeypatch.setattr(dp.transport, "watch", watch)
    return seen


def test_a_gather_of_many_results_makes_one_watch(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = dls.Queue("w", dispatch=dp)
    sq = dls.SyncQueue("w", dispatch=dp)
    ids = [sq.submit("builtins:abs", -k) for k in range(200)]
    seen = watches_of(dp, monkeypatch)

    async def gather() -> list[Any]:
        waits = asyncio.gather(*(q.result(i, timeout=30) for i in ids))
        await asyncio.sleep(0)  # (every wait has begun)
        await asyncio.to_thread(finish, dp, ids)
        return list(await waits)

    # When 200 results are awaited together, each gets its own value
    assert asyncio.run(gather()) == list(range(200))
    # through one watch of all their ids
    assert seen == [ids]


def test_an_unknown_id_fails_its_own_wait_only(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, _, ids = done_calls(dp, 3)
    stranger = "01" + "x" * 24

    async def gather() -> list[Any]:
        return list(
            await asyncio.gather(
                *(q.result(i, timeout=5) for i in [ids[0], stranger, ids[1], ids[2]]),
                return_exceptions=True,
            )
        )

    # When a wait on an id the plane never had is begun with others
    first, unknown, *rest = asyncio.run(gather())
    # Then that one raises as it would alone, and the others have their values
    assert isinstance(unknown, UnknownInvocation)
    assert [first, *rest] == [0, 1, 2]

    async def twice() -> list[Any]:
        waits = (q.result(stranger, timeout=5) for _ in range(2))
        return list(await asyncio.gather(*waits, return_exceptions=True))

    # And two waits on it raise an exception each (one raised twice would gather both
    # tracebacks)
    one, other = asyncio.run(twice())
    assert isinstance(one, UnknownInvocation) and isinstance(other, UnknownInvocation)
    assert one is not other


def test_an_id_whose_wait_gave_up_is_unwatched_while_others_of_its_turn_wait(
    dp: dls.Dispatch,
) -> None:
    q, sq = dls.Queue("w", dispatch=dp), dls.SyncQueue("w", dispatch=dp)
    # (none of these is due: nobody runs them)
    a, b, c = (sq.submit("builtins:abs", -k, _delay=3600) for k in range(3))

    async def scenario() -> tuple[list[str], list[str]]:
        # Given three waits begun in one turn, two of which give up soon
        waits = [
            asyncio.ensure_future(q.result(i, timeout=t)) for i, t in ((a, 0.1), (b, 0.1), (c, 30))
        ]
        await asyncio.wait(waits[:2])
        # Then only the id still awaited is watched
        still = await asyncio.to_thread(watched, dp)
        waits[2].cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        # and nothing once the last wait is over
        return still, await asyncio.to_thread(watched, dp)

    still, after = asyncio.run(scenario())
    assert still == [c] and after == []


def test_a_wait_that_gives_up_leaves_the_others_and_is_unwatched_with_them(
    dp: dls.Dispatch,
) -> None:
    q, sq = dls.Queue("w", dispatch=dp), dls.SyncQueue("w", dispatch=dp)
    ids = [sq.submit("builtins:abs", -k) for k in range(3)]
    never = sq.submit("builtins:abs", -9, _delay=3600)  # (not due: nobody runs it)

    async def gather() -> list[Any]:
        first = asyncio.ensure_future(q.result(never, timeout=0.2))
        rest = [asyncio.ensure_future(q.result(i, timeout=30)) for i in ids]
        # When the first gives up before the others' results come
        await asyncio.wait([first])
        await asyncio.to_thread(finish, dp, ids)
        return list(await asyncio.gather(first, *rest, return_exceptions=True))

    timed_out, *values = asyncio.run(gather())
    # Then it raised TimeoutError, and the others have their values
    assert isinstance(timed_out, TimeoutError) and values == [0, 1, 2]
    # And once every wait is over, nothing is watched any more
    wait_for(lambda: not watched(dp))


def watched(dp: dls.Dispatch) -> list[str]:
    """The ids the transport still watches."""
    hub = getattr(dp.transport, "_watches", None)
    if hub is not None:  # over HTTP: the poller's books
        with hub.cond:
            return list(hub.entries)
    changes = dp.transport._changes  # type: ignore[attr-defined]
    with changes._cond:
        return [i for i, entries in changes._watches.items() if entries]


def test_a_result_finished_before_a_zero_timeout_wait_is_returned(dp: dls.Dispatch) -> None:
    q, _, ids = done_calls(dp, 4)

    async def gather() -> list[Any]:
        return list(await asyncio.gather(*(q.result(i, timeout=0) for i in ids)))

    assert asyncio.run(gather()) == [0, 1, 2, 3]


def test_a_blocking_wait_takes_any_timeout_a_number_can_say(dp: dls.Dispatch) -> None:
    """result() of a finished call answers whatever the timeout, one past what a clock
    or a lock can time too; a pending one gives up at once for no time, less, or NaN."""
    _, sq, (done,) = done_calls(dp, 1)
    for forever in (float("inf"), 1e300, None):
        assert sq.result(done, timeout=forever) == 0
    pending = sq.submit("builtins:abs", -1)
    for no_time in (0, -1.0, float("nan")):
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            sq.result(pending, timeout=no_time)
        assert time.monotonic() - began < 5  # (NaN once polled the plane forever)


def test_waits_with_no_time_to_wait_read_the_plane_once_a_turn(
    dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, sq, ids = done_calls(dp, 3)
    late = [sq.submit("builtins:abs", -9, _delay=3600) for _ in range(2)]  # (not due)
    reads: list[list[str]] = []
    real = getattr(dp.transport, "finished_now", None)
    if real is not None:  # over HTTP: what the turn asks the plane for
        monkeypatch.setattr(
            dp.transport, "finished_now", lambda i: reads.append(list(i)) or real(i)
        )
    gets = counting_calls(dp.transport, "get", monkeypatch)

    async def gather() -> list[Any]:
        waits = (q.result(i, timeout=0) for i in [*ids, *late])
        return list(await asyncio.gather(*waits, return_exceptions=True))

    # When five waits with no time to wait are begun together, three on finished calls
    *values, first_late, second_late = asyncio.run(gather())
    # Then the finished ones have their values and the others time out
    assert values == [0, 1, 2]
    assert isinstance(first_late, TimeoutError) and isinstance(second_late, TimeoutError)
    # with no read of each, and over HTTP one read for them all
    assert gets == []
    assert reads == ([[*ids, *late]] if real is not None else [])
    # and nothing left watched
    wait_for(lambda: not watched(dp))


def zero_second_waits(dp: dls.Dispatch, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The id lists of every zero-second wait ``dp`` (over HTTP) asks the plane from now
    on."""
    asked: list[list[str]] = []
    real = dp.transport._wait  # type: ignore[attr-defined]

    def zero_second_wait(ids: list[str], timeout: float) -> Any:
        if timeout == 0:
            asked.append(list(ids))
        return real(ids, timeout)

    monkeypatch.setattr(dp.transport, "_wait", zero_second_wait)
    return asked


def test_another_clients_waits_with_no_time_to_wait_ask_the_plane_once(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = role_token(served, "admin")
    with dls.Dispatch(served.url, token=token) as producer:
        _, sq, ids = done_calls(producer, 2)
        late = sq.submit("builtins:abs", -9, _delay=3600)  # (not due)
    # Given a client that has not seen these ids (it did not submit them)
    with dls.Dispatch(served.url, token=token) as dp:
        asked = zero_second_waits(dp, monkeypatch)
        q = dls.Queue("w", dispatch=dp)

        async def gather() -> list[Any]:
            waits = (q.result(i, timeout=0) for i in [*ids, late])
            return list(await asyncio.gather(*waits, return_exceptions=True))

        # When it waits on them with no time to wait, two finished and one not due
        *values, not_yet = asyncio.run(gather())
        # Then the finished ones have their values and the other times out
        assert values == [0, 1] and isinstance(not_yet, TimeoutError)
        # having asked the plane once for them all (not once more for the unfinished)
        assert asked == [[*ids, late]]
        wait_for(lambda: not watched(dp))


def test_a_finished_result_awaited_again_is_returned_again(dp: dls.Dispatch) -> None:
    q, sq = dls.Queue("w", dispatch=dp), dls.SyncQueue("w", dispatch=dp)
    x = sq.submit("builtins:abs", -7)
    finish(dp, [x])

    async def twice() -> tuple[Any, Any]:
        # (the second while the poller still lingers after the first's answer: its
        # cursor is from after x finished, so a poll since it would never report x)
        first = await q.result(x, timeout=10)
        return first, await q.result(x, timeout=10)

    assert asyncio.run(twice()) == (0, 0)


@pytest.mark.parametrize(
    "timeouts", [(None, None, None), (0, 30)], ids=["no timeout", "zero and 30 s"]
)
def test_an_unreachable_plane_fails_each_wait_once(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch, timeouts: tuple[float | None, ...]
) -> None:
    with dls.Dispatch(served.url, token=role_token(served, "admin")) as producer:
        sq = dls.SyncQueue("w", dispatch=producer)
        ids = [sq.submit("builtins:abs", -k) for k in range(len(timeouts))]
    # Given a client that never saw these ids, and a plane that is gone
    with dls.Dispatch(served.url, token=role_token(served, "admin"), backoff=0.01) as dp:
        q = dls.Queue("w", dispatch=dp)
        served.stop()
        seen = watches_of(dp, monkeypatch)
        tries = counting_calls(dp.transport, "finished_now", monkeypatch)

        async def gather() -> list[Any]:
            waits = (q.result(i, timeout=t) for i, t in zip(ids, timeouts, strict=True))
            return list(await asyncio.gather(*waits, return_exceptions=True))

        # When waits on them are begun together (with no time to wait, or some)
        errors = asyncio.run(gather())
    # Then each raises the plane's absence, its own exception, after one try: not one
    # more for each id, nor one for the watch after the zero-timeout waits' read (which
    # then watches nothing)
    assert all(isinstance(e, dls.Unavailable) for e in errors), errors
    assert len({id(e) for e in errors}) == len(ids)
    assert len(tries) == 1
    assert seen == ([] if 0 in timeouts else [ids])


def test_zero_timeout_waits_beside_an_unknown_id_ask_for_each_id_once_at_most(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = role_token(served, "admin")
    with dls.Dispatch(served.url, token=token) as producer:
        _, sq, (done,) = done_calls(producer, 1)
        late = sq.submit("builtins:abs", -9, _delay=3600)  # (not due)
    # Given a client that has not seen these ids, and one id the plane does not have
    with dls.Dispatch(served.url, token=token) as dp:
        asked = zero_second_waits(dp, monkeypatch)
        q = dls.Queue("w", dispatch=dp)
        nope = "01" + "x" * 24

        async def gather() -> list[Any]:
            waits = [
                q.result(done, timeout=0),
                q.result(nope, timeout=0),
                q.result(nope, timeout=5),
                q.result(late, timeout=0.2),
            ]
            return list(await asyncio.gather(*waits, return_exceptions=True))

        # When they are awaited together
        value, unknown, unknown_too, not_yet = asyncio.run(gather())
        # Then each has its own answer
        assert value == 0 and isinstance(not_yet, TimeoutError)
        assert isinstance(unknown, UnknownInvocation) and isinstance(unknown_too, UnknownInvocation)
        # after one zero-second wait for them all and then one for each alone (the
        # unknown id failed the first), and none more for the watch
        assert asked == [[done, nope, late], [done], [nope], [late]]
        wait_for(lambda: not watched(dp))
