"""Ids a client makes for many submits come in groups of up to 16 per queue."""

from __future__ import annotations

import threading

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.plane.ids import GROUP_SIZE, group_ids, group_of
from dreamlake.lakeshore.submit import IdGroups, key_id


@dls.udf(queue="ids")
def double(x: int) -> int:
    return 2 * x


def test_each_queue_takes_its_groups_ids_in_order_and_a_new_base_per_group() -> None:
    # Given an allocator
    ids = IdGroups()
    # When 40 ids are made for one queue, interleaved with 3 for another
    a = [ids.next_id("a") for _ in range(20)]
    b = [ids.next_id("b") for _ in range(3)]
    a += [ids.next_id("a") for _ in range(20)]
    # Then queue "a" has groups of 16, 16 and 8, each id the next of its group
    bases = [group_of(a[0]), group_of(a[16]), group_of(a[32])]
    assert len(set(bases)) == 3
    assert a == group_ids(bases[0], 16) + group_ids(bases[1], 16) + group_ids(bases[2], 8)
    # And queue "b" has a group of its own
    assert b == group_ids(group_of(b[0]), 3)
    assert group_of(b[0]) not in bases


def test_grouped_ids_are_of_their_base() -> None:
    ids = IdGroups()
    for _ in range(GROUP_SIZE * 3):
        inv_id = ids.next_id("q")
        base, _, _ = inv_id.partition(".")
        assert len(base) == 26 and group_of(inv_id) == base


def test_ids_are_unique_across_threads() -> None:
    # Given one allocator shared by 8 threads submitting to two queues
    ids = IdGroups()
    made: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def submit(n: int) -> None:
        start.wait()
        made[n].extend(ids.next_id(("dp", n % 2)) for _ in range(1000))

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then no id is handed out twice, and no group holds more than 16
    every = [i for m in made for i in m]
    assert len(set(every)) == 8000
    sizes: dict[str, int] = {}
    for inv_id in every:
        sizes[group_of(inv_id)] = sizes.get(group_of(inv_id), 0) + 1
    assert max(sizes.values()) == GROUP_SIZE
    assert len(sizes) == 2 * -(-4000 // GROUP_SIZE)  # full groups per queue


def test_ids_given_or_keyed_stay_as_they_are_in_a_batch(lakeshore_plane: dls.Dispatch) -> None:
    # When a batch mixes a fixed id, an idempotency key, and ids the client makes
    with dls.batch():
        fixed = double.submit(1, _dispatch=lakeshore_plane, _id="job-1")
        keyed = double.submit(2, _dispatch=lakeshore_plane, _idempotency_key="k-2")
        made = [double.submit(i, _dispatch=lakeshore_plane) for i in range(3)]
    # Then the given and keyed ids are untouched, and the made ones share one group
    assert fixed == "job-1"
    assert keyed == key_id("ids", "k-2")
    assert made == group_ids(group_of(made[0]), 3)


def test_outside_a_batch_ids_are_not_grouped(lakeshore_plane: dls.Dispatch) -> None:
    inv_id = double.submit(1, _dispatch=lakeshore_plane)
    assert group_of(inv_id) == inv_id and len(inv_id) == 26


@pytest.mark.parametrize("plane", ["lakeshore_plane", "lakeshore_server"])
def test_a_given_id_is_one_every_route_can_name(plane: str, request: pytest.FixtureRequest) -> None:
    fixture = request.getfixturevalue(plane)
    dp = fixture if plane == "lakeshore_plane" else fixture.dispatch(role="producer")
    q = dls.SyncQueue("ids", dispatch=dp)
    # Given ids of letters, digits, spaces and the URI's other safe characters
    for fine in ["job 1", "run:7@host", "x%2Fy", "ÿ-ascii-not"]:
        # Then each is taken, and read back by its name
        assert q.status(q.submit("builtins:abs", -1, _id=fine)) == "pending"
    # And ids no route could name are refused at the submit, saying why, not taken and
    # then unreadable
    for bad in ["a/b", "../../etc", "a?b", "a#b", 'a"b', "tab\there", "x" * 129]:
        with pytest.raises(dls.InvalidRequest, match="invocation id must be"):
            q.submit("builtins:abs", -1, _id=bad)
        # and asked about, such an id is no invocation on either plane (not "no route")
        with pytest.raises(dls.UnknownInvocation):
            q.status(bad)
        with pytest.raises(dls.UnknownInvocation):
            q.cancel(bad)
