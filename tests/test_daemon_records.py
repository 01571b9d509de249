"""A daemon's record changed by its heartbeats, by an operator at the same time, and by
another team's worker token.

A running daemon heartbeats every few seconds while an operator may update it, drain it
or remove it. Each change applies to the record as it is when written (the store's
``change_daemon``): a heartbeat never writes back a record it read before an operator's
change, which would undo the change (a drain that never reaches the daemon, a removed
daemon listed again). Two planes on one file stand for the daemon's plane process and
the operator's; each test fails if a heartbeat reads and writes the record as two steps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.errors import Forbidden, NotFound
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.server import LocalServer
from dreamlake.lakeshore.stores import SqliteStore

pytestmark = pytest.mark.timeout(120)


class Beating:
    """Heartbeats of one daemon, as fast as they go, on a thread of their own."""

    def __init__(self, plane: Plane, daemon_id: str) -> None:
        self.plane, self.daemon_id = plane, daemon_id
        self.beats = 0
        self.gone = False  # a heartbeat was told the daemon is not there
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.plane.daemon_heartbeat(self.daemon_id, running=1)
            except NotFound:
                self.gone = True
                return
            self.beats += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


@pytest.fixture
def planes(tmp_path: Path) -> Iterator[tuple[Plane, Plane]]:
    path = tmp_path / "plane.db"
    daemon, operator = Plane(SqliteStore(path)), Plane(SqliteStore(path))
    yield daemon, operator
    daemon.close()
    operator.close()


def test_updates_and_a_drain_made_while_a_daemon_heartbeats_all_stick(
    planes: tuple[Plane, Plane],
) -> None:
    daemon, operator = planes
    # Given a daemon heartbeating without pause
    rec = daemon.register_daemon("gpu", queues=["q0"])
    beating = Beating(daemon, rec.id)
    wait_for(lambda: beating.beats > 0, 10, "no heartbeat")
    # When an operator adds a queue 100 times over, sets its concurrency and drains it
    for i in range(1, 101):
        operator.update_daemon(rec.id, add_queues=[f"q{i}"])
    operator.update_daemon(rec.id, concurrency=7)
    operator.drain_daemon(rec.id)
    seen = beating.beats
    wait_for(lambda: beating.beats > seen + 20, 10, "the heartbeats stopped")
    beating.stop()
    # Then every change is on the record, after the heartbeats that came since
    final = operator.get_daemon(rec.id)
    assert final.queues == [f"q{i}" for i in range(101)]
    assert (final.concurrency, final.draining, final.running) == (7, True, 1)
    assert final.last_heartbeat > rec.last_heartbeat


def test_updates_made_while_a_daemon_registers_again_and_again_all_stick(
    planes: tuple[Plane, Plane],
) -> None:
    daemon, operator = planes
    # Given a daemon that registers again and again under its id (restarting)
    rec = daemon.register_daemon("gpu", daemon_id="d-gpu", queues=["q0"])
    stop = threading.Event()

    def restarting() -> None:
        while not stop.is_set():
            daemon.register_daemon("gpu", daemon_id=rec.id, queues=["ignored"])

    thread = threading.Thread(target=restarting, daemon=True)
    thread.start()
    try:
        # When an operator adds a queue 100 times over meanwhile
        for i in range(1, 101):
            operator.update_daemon(rec.id, add_queues=[f"q{i}"])
    finally:
        stop.set()
        thread.join(30)
    # Then every queue is on the record (registering keeps the plane's queues)
    assert operator.get_daemon(rec.id).queues == [f"q{i}" for i in range(101)]


def test_a_daemon_removed_while_it_heartbeats_stays_removed(
    planes: tuple[Plane, Plane],
) -> None:
    daemon, operator = planes
    for _ in range(5):
        # Given a daemon heartbeating without pause
        rec = daemon.register_daemon("gpu", queues=["q"])
        beating = Beating(daemon, rec.id)
        wait_for(lambda b=beating: b.beats > 0, 10, "no heartbeat")  # type: ignore[misc]
        # When an operator removes it
        assert operator.remove_daemon(rec.id) is True
        # Then its next heartbeat is told it is gone (so it would register again), and
        # no heartbeat under way as it was removed brings the record back
        wait_for(lambda b=beating: b.gone, 10, "a heartbeat brought the daemon back")  # type: ignore[misc]
        beating.stop()
        assert operator.list_daemons() == []


def test_a_worker_token_registers_a_known_daemon_only_if_it_may_use_its_queues(
    served: LocalServer,
) -> None:
    # Given a daemon on queue "b" that an operator drained, and worker tokens scoped to
    # "a" and to "b"
    with dls.Dispatch(served.url, token=served.admin_token) as admin:
        make = admin.transport.create_token  # type: ignore[attr-defined]
        only_a, only_b = (make("worker", queues=[q])["token"] for q in ("a", "b"))
        rec = admin.transport.register_daemon("gpu", queues=["b"])
        admin.transport.drain_daemon(rec.id)
    # When the "a" token registers it again, by its id
    with dls.Dispatch(served.url, token=only_a) as other:
        with pytest.raises(Forbidden, match="queue 'b'"):
            other.transport.register_daemon("gpu", daemon_id=rec.id, queues=["a"])
        # Then it is refused, and the daemon is as it was (still draining)
        (kept,) = other.transport.list_daemons()
        assert (kept.queues, kept.draining) == (["b"], True)
        # and a daemon it does not know yet, on its own queues, it registers
        assert other.transport.register_daemon("new", daemon_id="d-new", queues=["a"]).id
    # while the "b" token takes the known one up again (a restart), as before
    with dls.Dispatch(served.url, token=only_b) as own:
        again = own.transport.register_daemon("gpu", daemon_id=rec.id)
        assert (again.queues, again.draining) == (["b"], False)
