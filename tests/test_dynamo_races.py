"""Races on the DynamoDB store (under moto, requests serialised as the real service
makes each conditional write atomic): two sweepers and a worker answering at once on
expired leases; three workers claiming and completing the jobs of the same id groups
(every write of a group item races the others'; a lost race re-reads and re-checks).
Each invocation ends with exactly one recorded outcome."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.errors import LeaseLost
from dreamlake.lakeshore.plane import Plane, QueueSpec, State, Submission
from dreamlake.lakeshore.stores.dynamo import DynamoStore
from infra.tables import moto_stack

JOBS = 30


@pytest.fixture
def planes() -> Iterator[tuple[Plane, Plane, Plane, FakeClock]]:
    clock = FakeClock()
    with moto_stack() as (resources, ddb, s3):

        def plane() -> Plane:
            return Plane(DynamoStore(resources, dynamodb=ddb, s3=s3), clock=clock, lease_seconds=10)

        yield plane(), plane(), plane(), clock


def test_two_sweepers_and_a_late_worker_record_one_outcome_each(
    planes: tuple[Plane, Plane, Plane, FakeClock],
) -> None:
    worker, sweeper_a, sweeper_b, clock = planes
    worker.ensure_queue(QueueSpec("q"))
    worker.submit(
        [Submission(id=f"j{i}", queue="q", payload=b"x", max_attempts=1) for i in range(JOBS)]
    )
    claims = worker.claim(["q"], "w", limit=JOBS)
    assert len(claims) == JOBS
    # When every lease has expired and two sweepers race the worker's late answers
    clock.advance(11)
    refused: list[str] = []
    barrier = threading.Barrier(3)

    def sweep(plane: Plane) -> None:
        barrier.wait(timeout=30)
        plane.sweep()

    def answer() -> None:
        barrier.wait(timeout=30)
        for c in claims:
            try:
                worker.complete(c.id, c.lease_token, b"late")
            except LeaseLost:
                refused.append(c.id)

    threads = [
        threading.Thread(target=sweep, args=(sweeper_a,)),
        threading.Thread(target=sweep, args=(sweeper_b,)),
        threading.Thread(target=answer),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # Then each invocation has one outcome: the worker's result, or dead (max_attempts=1)
    records = worker.get_many([c.id for c in claims])
    assert len(records) == JOBS
    states = {r.id: r.state for r in records}
    assert set(states.values()) <= {State.SUCCEEDED, State.DEAD}
    for r in records:
        if r.state is State.SUCCEEDED:
            assert r.id not in refused and r.result == b"late"
        else:
            assert r.id in refused and r.result is None
    print(
        f"\n{JOBS} expired leases: {len(refused)} swept dead, {JOBS - len(refused)} completed late"
    )


def test_workers_racing_on_the_jobs_of_one_group_each_claim_and_record_once(
    planes: tuple[Plane, Plane, Plane, FakeClock],
) -> None:
    # Given 48 jobs in three id groups of 16, and three planes (three Lambda instances)
    # whose workers claim one job at a time, all at once: every claim and completion is
    # a read-modify-write of a group item that the others are writing too
    from dreamlake.lakeshore.plane.ids import group_ids
    from dreamlake.lakeshore.submit import new_id

    first = planes[0]
    first.ensure_queue(QueueSpec("q"))
    ids = [i for _ in range(3) for i in group_ids(new_id(), 16)]
    first.submit([Submission(id=i, queue="q", payload=i.encode()) for i in ids])
    claimed: dict[str, list[str]] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def work(plane: Plane, name: str) -> None:
        barrier.wait(timeout=30)
        while True:
            got = plane.claim(["q"], name, limit=1)
            if not got:
                return
            (c,) = got
            assert c.payload == c.id.encode()
            with lock:
                claimed.setdefault(c.id, []).append(name)
            plane.complete(c.id, c.lease_token, name.encode())

    threads = [threading.Thread(target=work, args=(p, f"w{n}")) for n, p in enumerate(planes[:3])]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave between a group's read and its write
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(switch)
    # Then each job was claimed once and its result is its one claimer's
    assert sorted(claimed) == sorted(ids)
    assert all(len(by) == 1 for by in claimed.values())
    records = {r.id: r for r in first.get_many(ids)}
    assert {i: (r.state, r.result) for i, r in records.items()} == {
        i: (State.SUCCEEDED, by[0].encode()) for i, by in claimed.items()
    }
    print(f"\nclaims per worker: {sorted(Counter(b[0] for b in claimed.values()).values())}")
