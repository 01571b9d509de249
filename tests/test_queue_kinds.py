"""Typed queue classes, the direct-import patterns, namespacing and live changes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import config
from dreamlake.lakeshore import queue as queue_module


def work(x: int, p: int = 0) -> int:
    return x


@pytest.fixture
def default_dispatch(dispatch: dls.Dispatch) -> Iterator[dls.Dispatch]:
    """Make ``dispatch`` the process default for handles that name none."""
    config.configure(dispatch=dispatch)
    yield dispatch
    config.configure(url=None)  # drops the default again


def claim_order(dp: dls.Dispatch, queue: str, ids: list[str]) -> list[int]:
    order = []
    while claims := dp.transport.claim([queue], "w"):
        order.append(ids.index(claims[0].id))
    return order


# --- typed classes ------------------------------------------------------------------


def test_every_typed_class_is_a_queue() -> None:
    handles = [
        dls.Queue("a"),
        dls.PriorityQueue("b"),
        dls.BoltzmannQueue("c", temperature=0.5),
        dls.FILOQueue("d"),
    ]
    assert all(isinstance(h, dls.Queue) for h in handles)
    assert [h.kind for h in handles] == ["fifo", "priority", "boltzmann", "filo"]
    assert isinstance(dls.BoltzmannQueue("e"), dls.PriorityQueue)


def test_sync_surface_exists_for_every_kind() -> None:
    assert isinstance(dls.PriorityQueue("p").sync, dls.SyncPriorityQueue)
    assert isinstance(dls.BoltzmannQueue("b").sync, dls.SyncBoltzmannQueue)
    assert isinstance(dls.FILOQueue("f").sync, dls.SyncFILOQueue)
    assert isinstance(dls.SyncFILOQueue("f"), dls.SyncQueue)
    assert dls.SyncQueue("k", kind="priority", priority_field="p").kind == "priority"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: dls.Queue("x", temperature=0.5), "temperature= applies to BoltzmannQueue"),
        (lambda: dls.Queue("x", priority_field="p"), "priority_field= applies to PriorityQueue"),
        (lambda: dls.PriorityQueue("x", anneal={}), "anneal= applies to BoltzmannQueue"),
        (lambda: dls.FILOQueue("x", priority_field="p"), "applies to PriorityQueue"),
        (lambda: dls.SyncQueue("x", temperature=1.0), "applies to BoltzmannQueue"),
        (lambda: dls.FILOQueue("x", kind="fifo"), "FILOQueue is always kind='filo'"),
        (lambda: dls.Queue("x", kind="lifo"), "unknown queue kind 'lifo'"),
        (lambda: dls.Queue("x", colour="red"), "unexpected keyword argument 'colour'"),
    ],
)
def test_a_wrong_keyword_is_a_type_error_naming_its_class(make: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        make()  # type: ignore[operator]


def test_queue_with_kind_takes_that_kinds_options() -> None:
    q = dls.Queue("x", kind="boltzmann", temperature=0.5, priority_field="p")
    assert q.spec.temperature == 0.5
    assert q.spec.priority_field == "p"


def test_reexported_from_the_queue_submodule() -> None:
    from dreamlake.lakeshore.queue import BoltzmannQueue, FILOQueue, PriorityQueue, Queue

    assert (Queue, PriorityQueue, BoltzmannQueue, FILOQueue) == (
        dls.Queue,
        dls.PriorityQueue,
        dls.BoltzmannQueue,
        dls.FILOQueue,
    )


# --- the plane enforces kinds; handles are checked against it ------------------------------


def test_priority_comes_from_the_priority_field_then_priority_option(
    dispatch: dls.Dispatch,
) -> None:
    # Given a priority queue whose priority field is "p"
    q = dls.SyncPriorityQueue("urgent", dispatch=dispatch, priority_field="p")
    # When calls are submitted with p=, with _priority= and with neither
    ids = [
        q.submit(work, 0, p=1),
        q.submit(work, 1, _priority=5),
        q.submit(work, 2),
        q.submit(work, 3, p=9),
        q.submit(work, 4, p=1),
    ]
    # Then the plane hands them out highest first, FIFO among equals
    assert claim_order(dispatch, "urgent", ids) == [3, 1, 0, 4, 2]


def test_the_priority_field_still_reaches_the_function(dispatch: dls.Dispatch) -> None:
    q = dls.SyncPriorityQueue("pf", dispatch=dispatch, priority_field="p")
    inv = q.submit(work, 7, p=3)
    dls.run_worker(q, once=True)
    assert q.result(inv, timeout=10) == 7


def test_filo_queue_hands_out_the_newest_first(dispatch: dls.Dispatch) -> None:
    q = dls.SyncFILOQueue("stack", dispatch=dispatch)
    ids = [q.submit(work, i) for i in range(4)]
    assert claim_order(dispatch, "stack", ids) == [3, 2, 1, 0]


def test_a_queue_with_another_kind_is_a_clear_error(dispatch: dls.Dispatch) -> None:
    # Given a priority queue on the plane
    dls.SyncPriorityQueue("jobs", dispatch=dispatch).submit(work, 1)
    # When a FILO handle or a fifo-asking handle submits to it
    # Then it is refused at first use, naming both kinds
    with pytest.raises(dls.QueueMismatch, match=r"kind='priority'.*'filo'"):
        dls.SyncFILOQueue("jobs", dispatch=dispatch).submit(work, 1)
    with pytest.raises(dls.QueueMismatch):
        dls.SyncQueue("jobs", dispatch=dispatch, kind="fifo").submit(work, 1)
    # And a bare handle adopts the queue as it is
    dls.SyncQueue("jobs", dispatch=dispatch).submit(work, 1)


def test_other_settings_than_the_handle_asks_are_a_clear_error(dispatch: dls.Dispatch) -> None:
    dls.SyncBoltzmannQueue("r", dispatch=dispatch, temperature=0.5).submit(work, 1)
    with pytest.raises(dls.QueueMismatch, match="temperature"):
        dls.SyncBoltzmannQueue("r", dispatch=dispatch, temperature=2.0).submit(work, 1)


def test_pool_is_deprecated_and_equals_a_capped_queue() -> None:
    with pytest.warns(DeprecationWarning, match="Pool is deprecated"):
        pool = dls.Pool("gpu", size=4)
    assert pool == dls.Queue("gpu", elasticity={"kind": "fixed", "max": 4})
    assert pool != dls.Queue("gpu", elasticity={"kind": "fixed", "max": 2})


def test_elasticity_caps_running_invocations(dispatch: dls.Dispatch) -> None:
    q = dls.SyncQueue("capped", dispatch=dispatch, elasticity={"kind": "fixed", "max": 2})
    for i in range(5):
        q.submit(work, i)
    got = dispatch.transport.claim(["capped"], "w1", limit=5)
    assert len(got) == 2
    assert dispatch.transport.claim(["capped"], "w2", limit=5) == []
    dispatch.transport.complete(got[0].id, got[0].lease_token, dls_result())
    assert len(dispatch.transport.claim(["capped"], "w2", limit=5)) == 1


def dls_result() -> bytes:
    from dreamlake.lakeshore.wire import encode_result

    return encode_result(None)[0]


# --- pattern A: string-as-queue in @udf ------------------------------------------------


def test_udf_string_and_kwargs_pick_the_class() -> None:
    @dls.udf(queue="tutorial")
    def add(a: int, b: int) -> int:
        return a + b

    @dls.udf(queue="urgent", priority_field="p")
    def serve(req: int, p: int = 0) -> int:
        return req

    @dls.udf(queue="rollouts", temperature=0.5)
    def rollout(state: int) -> int:
        return state

    assert type(add.queue) is dls.Queue
    assert type(serve.queue) is dls.PriorityQueue
    assert serve.queue.spec.priority_field == "p"
    assert type(rollout.queue) is dls.BoltzmannQueue
    assert add(1, 2) == 3


# --- pattern B: lazy module attributes ---------------------------------------------------


def test_lazy_handles_make_no_plane_call_at_import(tmp_path: Path) -> None:
    # Given a fresh interpreter with no plane configured and a home that must stay empty
    code = textwrap.dedent(
        """
        import os, sys
        from dreamlake.lakeshore import config
        from dreamlake.lakeshore.q import tutorial
        from dreamlake.lakeshore.q.priority import urgent
        from dreamlake.lakeshore.q.boltzmann import rollouts
        from dreamlake.lakeshore.q import priority
        assert config._default is None, "a Dispatch was built at import"
        assert not os.listdir(os.environ["LAKESHORE_HOME"]), "a plane file was made"
        print(type(tutorial).__name__, type(urgent).__name__, type(rollouts).__name__,
              priority.__name__)
        """
    )
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LAKESHORE_HOME": str(home)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "Queue",
        "PriorityQueue",
        "BoltzmannQueue",
        "dreamlake.lakeshore.q.priority",
    ]


def test_lazy_handle_warns_once_when_it_creates_a_queue(default_dispatch: dls.Dispatch) -> None:
    from dreamlake.lakeshore.q import tutoorial  # the typo

    # When the first submit creates the queue, it warns once
    with pytest.warns(dls.QueueCreatedWarning, match="'tutoorial' did not exist"):
        tutoorial.sync.submit(work, 1)
    # Then later submits are quiet
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tutoorial.sync.submit(work, 2)


def test_lazy_handle_to_a_known_queue_is_quiet(default_dispatch: dls.Dispatch) -> None:
    dls.SyncQueue("known", dispatch=default_dispatch).submit(work, 1)
    from dreamlake.lakeshore.q import known

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        known.sync.submit(work, 2)


def test_same_name_gives_the_same_lazy_handle() -> None:
    from dreamlake.lakeshore import q

    assert q.samename is q.samename
    with pytest.raises(ImportError):
        exec("from dreamlake.lakeshore.q import _private", {})


# --- pattern C and strict mode ------------------------------------------------------------


def test_named_constructor_is_the_plain_constructor() -> None:
    assert dls.Queue.named("tutorial") == dls.Queue("tutorial")
    urgent = dls.PriorityQueue.named("urgent", priority_field="p")
    assert urgent == dls.PriorityQueue("urgent", priority_field="p")


def test_strict_makes_a_missing_queue_an_error(dispatch: dls.Dispatch) -> None:
    with pytest.raises(dls.QueueNotFound, match="strict"):
        dls.SyncQueue("nope", dispatch=dispatch, strict=True).submit(work, 1)
    # And once the queue exists, a strict handle submits
    dls.SyncQueue("nope", dispatch=dispatch).submit(work, 1)
    dls.SyncQueue("nope", dispatch=dispatch, strict=True).submit(work, 2)


def test_configure_strict_applies_to_every_handle(dispatch: dls.Dispatch) -> None:
    config.configure(strict=True)
    try:
        with pytest.raises(dls.QueueNotFound):
            dls.SyncQueue("missing", dispatch=dispatch).submit(work, 1)
    finally:
        config.configure(strict=False)


# --- namespacing --------------------------------------------------------------------------


def test_module_namespace_prefixes_the_defining_module() -> None:
    assert dls.Queue("training", namespace="module").name == f"{__name__}.training"
    assert dls.Queue("/shared", namespace="module").name == "shared"
    assert dls.Queue("/shared").name == "shared"
    assert dls.Queue("flat").name == "flat"


def test_module_namespace_in_main_and_in_a_module(tmp_path: Path) -> None:
    (tmp_path / "my_app").mkdir()
    (tmp_path / "my_app" / "__init__.py").write_text("")
    (tmp_path / "my_app" / "jobs.py").write_text(
        "import dreamlake.lakeshore as dls\n"
        'training = dls.Queue("training", namespace="module")\n'
        '@dls.udf(queue="step", namespace="module")\n'
        "def step(x):\n    return x\n"
    )
    code = (
        "import dreamlake.lakeshore as dls\n"
        "from my_app.jobs import training, step\n"
        'print(training.name, step.queue.name, dls.Queue("t", namespace="module").name)\n'
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["my_app.jobs.training", "my_app.jobs.step", "__main__.t"]


def test_run_scope_appends_the_run_id_in_threads_and_tasks(dispatch: dls.Dispatch) -> None:
    q = dls.SyncQueue("rollouts", dispatch=dispatch, scope="run")
    assert q.name == "rollouts"
    seen: dict[str, str] = {}

    def in_thread(run_id: str) -> None:
        with dls.context.run(run_id):
            seen[run_id] = q.name

    threads = [threading.Thread(target=in_thread, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {f"t{i}": f"rollouts.run-t{i}" for i in range(3)}

    async def task_names() -> list[str]:
        async def name() -> str:
            return q.name

        with dls.context.run("r1"):
            return await asyncio.gather(name(), name())

    assert asyncio.run(task_names()) == ["rollouts.run-r1", "rollouts.run-r1"]
    assert q.name == "rollouts"


def test_run_scoped_queues_go_once_the_run_ended_and_drained(dispatch: dls.Dispatch) -> None:
    q = dls.SyncQueue("sweep", dispatch=dispatch, scope="run")
    plane = dispatch.transport
    # Given a run that submits to its own queue
    with dls.context.run("s1"):
        inv = q.submit(work, 1)
    names = [x["spec"].name for x in plane.list_queues()]
    assert "sweep.run-s1" in names
    # When the run has ended but work is pending, the queue stays
    plane.sweep()  # type: ignore[attr-defined]
    assert "sweep.run-s1" in [x["spec"].name for x in plane.list_queues()]
    # Then once drained it is removed, and its result is still readable
    (claim,) = plane.claim(["sweep.run-s1"], "w")
    plane.complete(claim.id, claim.lease_token, dls_result())
    plane.sweep()  # type: ignore[attr-defined]
    assert "sweep.run-s1" not in [x["spec"].name for x in plane.list_queues()]
    assert dls.SyncQueue("sweep.run-s1", dispatch=dispatch).result(inv, timeout=5) is None


def test_listing_shows_last_activity_and_prune_removes_idle_queues() -> None:
    from dreamlake.lakeshore.clock import FakeClock

    clock = FakeClock()
    with dls.Dispatch(":memory:", clock=clock) as dp:
        dls.SyncQueue("old", dispatch=dp).submit(work, 1)
        busy = dls.SyncQueue("busy", dispatch=dp)
        clock.advance(10 * 86400)
        busy.submit(work, 1)
        plane = dp.transport
        (claim,) = plane.claim(["old"], "w")
        plane.complete(claim.id, claim.lease_token, dls_result())
        listed = {x["spec"].name: x for x in dp.queues()}
        assert listed["busy"]["last_activity"] == clock.now()
        assert listed["busy"]["counts"]["pending"] == 1
        assert listed["old"]["counts"]["succeeded"] == 1
        clock.advance(8 * 86400)
        # "old" is idle for 8 days and drained; "busy" still has pending work
        assert dp.prune_queues(7 * 86400) == ["old"]
        assert [x["spec"].name for x in dp.queues()] == ["busy"]


# --- live changes --------------------------------------------------------------------------


def test_a_pending_invocations_priority_can_change(dispatch: dls.Dispatch) -> None:
    q = dls.SyncPriorityQueue("live", dispatch=dispatch)
    ids = [q.submit(work, i, priority=1) for i in range(3)]
    q.set_priority(ids[2], 10)
    assert claim_order(dispatch, "live", ids) == [2, 0, 1]


def test_async_queue_can_change_priority_and_temperature(dispatch: dls.Dispatch) -> None:
    async def scenario() -> tuple[float | None, str]:
        q = dls.BoltzmannQueue("warm", dispatch=dispatch, temperature=1.0)
        inv = await q.submit(work, 1, priority=2)
        await q.set_priority(inv, 7)
        spec = await q.update(temperature=0.2)
        return spec.temperature, await q.status(inv)

    assert asyncio.run(scenario()) == (0.2, "pending")


def test_only_kind_settings_can_change(dispatch: dls.Dispatch) -> None:
    with pytest.raises(TypeError, match="cannot change temperature"):
        dls.SyncQueue("plain", dispatch=dispatch).update(temperature=0.5)


def test_module_exports_kind_table() -> None:
    assert set(queue_module.KIND_OPTIONS) == {"fifo", "filo", "priority", "boltzmann"}
