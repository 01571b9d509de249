"""The poller that watches a plane file for other processes' writes: where the kernel
tells of writes (Linux) it sleeps until the file is written and then looks at once;
elsewhere it slows down once nothing has changed for a while and is back at its pace at
once when this process writes. Either way an idle worker on a plane file costs next to
nothing."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import asleep_on_watch, wait_for

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
def no_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """As where the kernel cannot tell of writes: the poller keeps its pace."""
    monkeypatch.setattr(SqliteStore, "write_watch", lambda self: None)


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


def _a_result_wait(
    plane: Plane, ready: Callable[[], bool]
) -> tuple[str, list[list[object]], threading.Thread]:
    """A call submitted and a thread waiting for its result, once ``ready()`` says the
    poller is as the test wants it: only the poller fires the wait's watch for another
    process's finish."""
    inv = new_id()
    plane.submit([Submission(inv, "q", PAYLOAD)])
    answered: list[list[object]] = []
    waiting = threading.Thread(target=lambda: answered.append(plane.wait([inv], 10)))
    waiting.start()
    wait_for(lambda: inv in plane.changes._watches and ready(), 5)
    return inv, answered, waiting


def test_the_poller_slows_down_when_quiet_and_keeps_up_when_this_process_writes(
    no_watch: None, plane: Plane
) -> None:
    # Given a claim waiting on a plane file (the poller watches it: every 2 ms)
    waiting = threading.Thread(target=lambda: plane.claim(["q"], "w", wait=2))
    waiting.start()
    wait_for(lambda: plane.changes._poller is not None, 5)
    busy = _looks(plane, 0.2)
    # When nothing changes for longer than QUIET (the poller then naps longer, each nap
    # twice the last up to SLOW_POLL)
    wait_for(lambda: plane.changes._slow, 5)
    quiet = _looks(plane, 0.5)
    # Then it looks about every SLOW_POLL (0.05 s), not every 2 ms (~250): at most ~14
    # looks (five growing naps first, 2 to 32 ms), and the waiting claim's own look
    # every 0.25 s
    assert busy > 40
    assert quiet <= 20
    # When this process writes (the other queue: a change elsewhere may follow), it is
    # back at its pace at once
    plane.submit([Submission(new_id(), "other", PAYLOAD)])
    assert _looks(plane, 0.1) > 15
    waiting.join(15)
    # And a write by another process while it is slow is still seen, within its slow
    # pace: a result wait blocks on its watch, which only the poller fires for another
    # process's finish
    _, answered, waiting = _a_result_wait(plane, lambda: plane.changes._slow)
    other = Plane(SqliteStore(plane.store.path))  # type: ignore[attr-defined]
    try:
        (claim,) = other.claim(["q"], "elsewhere")
        began = time.monotonic()
        other.complete(claim.id, claim.lease_token, b"\x00done")
    finally:
        other.close()
    waiting.join(10)
    assert answered and answered[0] and time.monotonic() - began < 0.3


needs_inotify = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the kernel tells of writes on Linux"
)


def _other_process_finishes(plane: Plane, inv: str) -> float:
    """Finish ``inv`` through another handle on the file (as another process would);
    the time it was committed."""
    other = Plane(SqliteStore(plane.store.path))  # type: ignore[attr-defined]
    try:
        (claim,) = other.claim(["q"], "elsewhere")
        assert claim.id == inv
        other.complete(claim.id, claim.lease_token, b"\x00done")
        return time.monotonic()
    finally:
        other.close()


@needs_inotify
def test_the_poller_sleeps_until_the_file_is_written_and_then_looks_at_once(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a result wait blocked on a plane file (only the poller fires its watch for
    # another process's finish), once the writes that set it up are past
    asleep = asleep_on_watch(monkeypatch)
    inv, answered, waiting = _a_result_wait(plane, asleep)
    # When nothing is written for half a second
    looks = _looks(plane, 0.5)
    # Then the poller did not look (it looked every 2 ms, 250 times here, before): at
    # most its safety looks, every 0.5 s
    assert looks <= 2
    # When another process finishes the call, the wait has it at once
    done = _other_process_finishes(plane, inv)
    waiting.join(10)
    assert answered and answered[0] and time.monotonic() - done < 0.1


@needs_inotify
def test_a_write_the_poller_sleeps_through_is_still_seen_by_its_safety_look(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a poller whose watch never tells of a write (as if one went untold)
    monkeypatch.setattr(changes_module, "WATCH_SAFETY", 0.2)
    real = SqliteStore.write_watch

    def deaf(self: SqliteStore) -> object:
        watch = real(self)
        assert watch is not None
        watch.written = lambda: False  # type: ignore[method-assign]
        watch.wait = lambda timeout: bool(time.sleep(timeout))  # type: ignore[method-assign]
        return watch

    monkeypatch.setattr(SqliteStore, "write_watch", deaf)
    inv, answered, waiting = _a_result_wait(plane, lambda: plane.changes.polling)
    # When another process finishes the call
    done = _other_process_finishes(plane, inv)
    # Then the wait has it by the next safety look
    waiting.join(10)
    assert answered and answered[0] and time.monotonic() - done < 1.0
