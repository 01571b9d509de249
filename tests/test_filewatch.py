"""The kernel's word of writes to a plane file (Linux inotify): what lets the poller of
a plane file sleep instead of looking every few milliseconds."""

from __future__ import annotations

import os
import resource
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest
from support import asleep_on_watch, wait_for

from dreamlake.lakeshore.plane import Plane, QueueSpec
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.stores.filewatch import watch_file

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the kernel tells of writes on Linux"
)


def test_a_watch_tells_of_a_write_by_another_process_and_nothing_else(
    tmp_path: Path,
) -> None:
    # Given a watch of a plane file and its log, opened by the store
    store = SqliteStore(tmp_path / "plane.db")
    beside = tmp_path / "other.txt"
    beside.write_text("x")
    watch = store.write_watch()
    assert watch is not None
    try:
        # When nothing is written, it says so after its timeout
        began = time.monotonic()
        assert not watch.wait(0.1)
        assert time.monotonic() - began >= 0.09
        # nor does a write to another file of the folder count
        beside.write_text("y")
        assert not watch.written()
        # When another connection (another process) commits, a waiter is told at once
        other = sqlite3.connect(
            tmp_path / "plane.db", isolation_level=None, check_same_thread=False
        )
        writer = threading.Timer(
            0.05, lambda: other.execute("INSERT INTO data_keys VALUES ('k', 'd', 0)")
        )
        writer.start()
        began = time.monotonic()
        assert watch.wait(5)
        assert time.monotonic() - began < 1
        writer.join()  # (the commit is done)
        watch.written()  # (the rest of its writes)
        assert not watch.written()  # each write counts once
        other.close()
    finally:
        watch.close()
        store.close()


def test_there_is_no_watch_of_a_memory_store_or_of_files_that_do_not_exist(
    tmp_path: Path,
) -> None:
    assert SqliteStore(":memory:").write_watch() is None
    assert watch_file(tmp_path / "nothing-here") is None


def test_a_watch_works_past_file_descriptor_1023(tmp_path: Path) -> None:
    # (select() cannot wait on such a descriptor: a poller there spun a whole core)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("this process may not open 1,200 files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    store = SqliteStore(tmp_path / "plane.db")
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        watch = store.write_watch()
        assert watch is not None and watch._fd > 1023
        began = time.monotonic()
        assert not watch.wait(0.2)  # it sleeps its time, and says nothing was written
        assert time.monotonic() - began >= 0.15
        watch.close()
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        store.close()


def test_closing_a_plane_ends_its_pollers_sleep_on_the_watch_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a plane file another process keeps open, and a poller asleep on its watch
    asleep = asleep_on_watch(monkeypatch)
    keeper = sqlite3.connect(tmp_path / "plane.db")
    plane = Plane(SqliteStore(tmp_path / "plane.db"))
    plane.ensure_queue(QueueSpec("q"))
    waiting = threading.Thread(target=lambda: plane.claim(["q"], "w", wait=3))
    waiting.start()
    wait_for(lambda: plane.changes._watch is not None and plane.changes.polling, 5)
    poller = plane.changes._poller
    assert poller is not None
    wait_for(asleep, 5, "the poller never went to sleep on its watch")
    # When the plane closes, the poller is gone at once (not at its next safety look)
    began = time.monotonic()
    plane.close()
    poller.join(5)
    assert not poller.is_alive() and time.monotonic() - began < 0.2
    waiting.join(5)
    keeper.close()


def test_no_descriptor_left_for_the_watch_means_no_watch_and_nothing_kept_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a file to watch and a process out of descriptors once inotify has one
    log = tmp_path / "plane.db-wal"
    log.write_bytes(b"")

    def inotify_fds() -> int:
        found = 0
        for fd in Path("/proc/self/fd").iterdir():
            try:
                found += "inotify" in os.readlink(fd)
            except OSError:  # (the listing's own descriptor, closed by now)
                continue
        return found

    before = inotify_fds()

    def no_pipe() -> tuple[int, int]:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "pipe", no_pipe)
    # Then there is no watch (the poller keeps its pace) and no inotify left open
    assert watch_file(log) is None
    assert inotify_fds() == before
