"""``with dls.batch():`` sends many submits in few requests; the exit is the durability point."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.http.plain import PlainConnection
from dreamlake.lakeshore.plane.ids import group_ids, group_of
from dreamlake.lakeshore.testing import LakeshoreServer


@dls.udf(queue="batched")
def square(x: int) -> int:
    return x * x


class Counter:
    """Counts the HTTP requests this process sends, by method and path."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._orig = PlainConnection.exchange

    def __enter__(self) -> Counter:
        orig, paths = self._orig, self.paths

        def exchange(conn: PlainConnection, method: str, path: str, *a, **k):  # type: ignore[no-untyped-def]
            paths.append(f"{method} {path.split('?')[0]}")
            return orig(conn, method, path, *a, **k)

        PlainConnection.exchange = exchange  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        PlainConnection.exchange = self._orig  # type: ignore[method-assign]

    def count(self, what: str) -> int:
        return sum(1 for p in self.paths if p == what)


@pytest.fixture
def remote(lakeshore_server: LakeshoreServer) -> Iterator[dls.Dispatch]:
    with lakeshore_server.dispatch("admin") as dp:
        yield dp


def test_embedded_batch_submits_everything_by_the_exit() -> None:
    # Given an embedded plane
    with dls.Dispatch(":memory:") as dp:
        # When 1,200 calls are submitted in a batch of 500 per call
        with dls.batch() as b:
            ids = [square.submit(i, _dispatch=dp) for i in range(1200)]
            # (inside, ids come back before the plane has them all)
            assert len(ids) == 1200
        # Then at the exit the plane has each one, in submission order
        assert b.submitted == 1200
        assert dp.transport.counts("batched")["pending"] == 1200
        claims = dp.transport.claim(["batched"], "w", limit=3)
        assert [c.id for c in claims] == ids[:3]


def test_ids_made_in_a_batch_come_in_groups_of_sixteen(
    lakeshore_plane: dls.Dispatch, lakeshore_worker
) -> None:  # type: ignore[no-untyped-def]
    # Given an embedded plane with a worker on the queue
    q = dls.SyncQueue("batched", dispatch=lakeshore_plane)
    lakeshore_worker(q, dispatch=lakeshore_plane)
    # When 40 calls are submitted in a batch
    with dls.batch():
        ids = [square.submit(i, _dispatch=lakeshore_plane) for i in range(40)]
    # Then their ids form three groups, of 16, 16 and 8, in order
    bases = [group_of(ids[0]), group_of(ids[16]), group_of(ids[32])]
    assert len(set(bases)) == 3
    assert ids == group_ids(bases[0], 16) + group_ids(bases[1], 16) + group_ids(bases[2], 8)
    # And every result is right
    assert [q.result(i, timeout=30) for i in ids] == [i * i for i in range(40)]


def test_batch_over_http_sends_few_requests_and_results_arrive(
    remote: dls.Dispatch, lakeshore_worker
) -> None:  # type: ignore[no-untyped-def]
    # Given a served plane with a worker on the queue
    q = dls.SyncQueue("batched", dispatch=remote)
    lakeshore_worker(q, dispatch=remote)
    square.submit(0, _dispatch=remote)  # the queue exists, the function body is uploaded
    # When 1,000 calls are submitted inside a batch
    with Counter() as sent, dls.batch():
        ids = [square.submit(i, _dispatch=remote) for i in range(1000)]
    # Then they took three submit requests (max_batch is 500, cut to 496: 31 whole
    # groups of ids), not a thousand
    assert sent.count("POST /v1/invocations") == 3
    # And every result is right
    assert sum(q.result(i, timeout=60) for i in ids) == sum(i * i for i in range(1000))


def test_result_inside_the_block_sends_what_is_buffered(
    remote: dls.Dispatch, lakeshore_worker
) -> None:  # type: ignore[no-untyped-def]
    q = dls.SyncQueue("batched", dispatch=remote)
    lakeshore_worker(q, dispatch=remote)
    with dls.batch():
        first = square.submit(7, _dispatch=remote)
        # a wait on an id of the block does not hang: the buffer is sent first
        assert q.result(first, timeout=30) == 49
        second = square.submit(8, _dispatch=remote)
    assert q.result(second, timeout=30) == 64


def test_async_batch_and_gather(remote: dls.Dispatch, lakeshore_worker) -> None:  # type: ignore[no-untyped-def]
    q = dls.Queue("batched", dispatch=remote)
    lakeshore_worker(dls.SyncQueue("batched", dispatch=remote), dispatch=remote)

    async def main() -> list[int]:
        async with dls.batch():
            ids = [square.submit(i, _dispatch=remote) for i in range(300)]
        return await asyncio.gather(*(q.result(i, timeout=60) for i in ids))

    assert sum(asyncio.run(main())) == sum(i * i for i in range(300))


def test_a_failed_send_raises_at_the_exit_and_names_what_was_not_submitted(
    remote: dls.Dispatch,
) -> None:
    # Given an invocation already submitted under a fixed id
    square.submit(1, _dispatch=remote, _id="fixed-id")
    # When a batch reuses that id for another call among 25, ten to a request
    with pytest.raises(dls.IdempotencyConflict) as err, dls.batch(size=10):
        for i in range(25):
            square.submit(i, _dispatch=remote, _id="fixed-id" if i == 3 else None)
    # Then the exit raises the plane's refusal, with a note of what was not sent
    notes = " ".join(getattr(err.value, "__notes__", []))
    assert "25 invocations of this batch were not submitted (0 were)" in notes


def test_an_exception_in_the_block_still_sends_what_was_handed_out() -> None:
    with dls.Dispatch(":memory:") as dp:
        with pytest.raises(KeyError), dls.batch():
            ids = [square.submit(i, _dispatch=dp) for i in range(5)]
            raise KeyError("boom")
        assert {r.id for r in dp.transport.get_many(ids)} == set(ids)


def test_a_batch_is_bound_to_its_context() -> None:
    # A thread started inside the block without the context submits directly.
    with dls.Dispatch(":memory:") as dp:
        seen: list[int] = []

        def other() -> None:
            square.submit(1, _dispatch=dp)
            seen.append(dp.transport.counts("batched")["pending"])

        with dls.batch():
            square.submit(0, _dispatch=dp)
            t = threading.Thread(target=other)
            t.start()
            t.join()
            assert seen == [1]  # only the thread's own submit is there yet
        assert dp.transport.counts("batched")["pending"] == 2


def test_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        dls.batch(size=0)
