"""The kernel's word of writes to a plane file (Linux inotify): what lets the poller of
a plane file sleep instead of looking every few milliseconds."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.stores.filewatch import watch_files

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
        threading.Timer(
            0.05, lambda: other.execute("INSERT INTO data_keys VALUES ('k', 'd', 0)")
        ).start()
        began = time.monotonic()
        assert watch.wait(5)
        assert time.monotonic() - began < 1
        time.sleep(0.05)
        watch.written()  # (the rest of that commit's writes)
        assert not watch.written()  # each write counts once
        other.close()
    finally:
        watch.close()
        store.close()


def test_there_is_no_watch_of_a_memory_store_or_of_files_that_do_not_exist(
    tmp_path: Path,
) -> None:
    assert SqliteStore(":memory:").write_watch() is None
    assert watch_files([tmp_path / "nothing-here"]) is None
