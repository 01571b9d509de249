"""The poller that watches a plane file for other processes' writes slows down once
nothing has changed for a while (an idle worker on a plane file then costs next to
nothing) and is back at its pace at once when this process writes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from dreamlake.lakeshore.plane import Plane, QueueSpec, Submission
from dreamlake.lakeshore.plane import changes as changes_module
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.submit import new_id
from dreamlake.lakeshore.wire import encode_ref_call

PAYLOAD = encode_ref_call("math:sqrt", (4.0,), {}).payload


@pytest.fixture
def quick_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(changes_module, "QUIET", 0.3)
    monkeypatch.setattr(changes_module, "SLOW_POLL", 0.05)


@pytest.fixture
def plane(tmp_path: Path, quick_quiet: None) -> Iterator[Plane]:
    plane = Plane(SqliteStore(tmp_path / "plane.db"))
    plane.ensure_queue(QueueSpec("q"))
    plane.ensure_queue(QueueSpec("other"))
    yield plane
    plane.close()


def _looks(plane: Plane, seconds: float) -> int:
    """How often the poller read the file's change marker over ``seconds``."""
    store = plane.store
    assert isinstance(store, SqliteStore)
    count = [0]
    real = store.change_marker

    def counted() -> int:
        count[0] += 1
        return real()

    store.change_marker = counted  # type: ignore[method-assign]
    try:
        time.sleep(seconds)
    finally:
        del store.change_marker
    return count[0]


def test_the_poller_slows_down_when_quiet_and_keeps_up_when_this_process_writes(
    plane: Plane,
) -> None:
    # Given a claim waiting on a plane file (the poller watches it: every 2 ms)
    waiting = threading.Thread(target=lambda: plane.claim(["q"], "w", wait=2))
    waiting.start()
    wait_for(lambda: plane.changes._poller is not None, 5)
    busy = _looks(plane, 0.2)
    # When nothing changes for longer than QUIET (the poller then naps longer)
    wait_for(lambda: plane.changes._slow, 5)
    quiet = _looks(plane, 0.5)
    # Then it looks about every SLOW_POLL (0.05 s), not every 2 ms
    assert busy > 40
    assert quiet <= 15
    # When this process writes (the other queue: a change elsewhere may follow), it is
    # back at its pace at once
    plane.submit([Submission(new_id(), "other", PAYLOAD)])
    assert _looks(plane, 0.1) > 15
    waiting.join(15)
    # And a write by another process while it is slow is still seen, within its slow
    # pace: a result wait blocks on its watch, which only the poller fires for another
    # process's finish
    inv = new_id()
    plane.submit([Submission(inv, "q", PAYLOAD)])
    answered: list[list[object]] = []
    waiting = threading.Thread(target=lambda: answered.append(plane.wait([inv], 10)))
    waiting.start()
    wait_for(lambda: inv in plane.changes._watches and plane.changes._slow, 5)
    other = Plane(SqliteStore(plane.store.path))  # type: ignore[attr-defined]
    try:
        (claim,) = other.claim(["q"], "elsewhere")
        began = time.monotonic()
        other.complete(claim.id, claim.lease_token, b"\x00done")
    finally:
        other.close()
    waiting.join(10)
    assert answered and answered[0] and time.monotonic() - began < 0.3
