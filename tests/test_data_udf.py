"""Data UDFs: a bare str return is a manifest of keys stored with dls.data."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore.worker.pool import ProcessWorker


def write_report(run: int) -> str:
    key = f"runs/{run}/report.json"
    dls.data.put(key, b'{"loss": 0.1}')
    return key


def write_two(run: int) -> str:
    dls.data.put(f"runs/{run}/a", b"A")
    dls.data.put(f"runs/{run}/b", b"B")
    return f"runs/{run}/a\nruns/{run}/b\n"


def say_hello() -> str:
    return "hello world"


def test_a_data_udf_records_its_keys_and_returns_the_manifest(dispatch: dls.Dispatch) -> None:
    q = dls.SyncQueue("data", dispatch=dispatch)
    one, two = q.submit(write_report, 7), q.submit(write_two, 8)
    dls.run_worker(q, once=True)
    dls.run_worker(q, once=True)
    assert q.result(one, timeout=10) == "runs/7/report.json"
    assert dls.data.get("runs/7/report.json", dispatch=dispatch) == b'{"loss": 0.1}'
    assert q.result(two, timeout=10) == "runs/8/a\nruns/8/b\n"
    assert dls.data.exists(["runs/8/a", "runs/8/b", "runs/9/a"], dispatch=dispatch) == {
        "runs/8/a",
        "runs/8/b",
    }


def test_a_bare_str_naming_no_stored_key_fails_with_advice(dispatch: dls.Dispatch) -> None:
    q = dls.SyncQueue("text", dispatch=dispatch)
    inv = q.submit(say_hello)
    dls.run_worker(q, once=True)
    with pytest.raises(dls.DataKeyMissing, match="wrap text in structured data") as info:
        q.result(inv, timeout=10)
    assert info.value.type_name == "dreamlake.lakeshore.DataKeyMissing"
    assert isinstance(info.value, dls.RemoteError)  # (as before it had a type of its own)


def test_data_get_of_a_missing_key_is_not_found(dispatch: dls.Dispatch) -> None:
    with pytest.raises(dls.NotFound):
        dls.data.get("nothing/here", dispatch=dispatch)
    with pytest.raises(dls.InvalidRequest):
        dls.data.put(" padded ", b"x", dispatch=dispatch)


@pytest.fixture
def file_plane(tmp_path: Path) -> Iterator[dls.Dispatch]:
    with dls.Dispatch(str(tmp_path / "plane.db")) as dp:
        yield dp


def test_a_data_udf_in_a_process_worker_writes_to_its_worker_s_plane(
    file_plane: dls.Dispatch,
) -> None:
    q = dls.SyncQueue("data", dispatch=file_plane)
    inv = q.submit(write_report, 11)
    worker = ProcessWorker(file_plane, ["data"])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert q.result(inv, timeout=30) == "runs/11/report.json"
    finally:
        worker.request_stop()
        thread.join(timeout=30)
    assert dls.data.get("runs/11/report.json", dispatch=file_plane) == b'{"loss": 0.1}'


def test_data_over_a_served_plane(lakeshore_server: object) -> None:
    dp = lakeshore_server.dispatch("producer")  # type: ignore[attr-defined]
    digest = dls.data.put("shared/blob", b"x" * 300_000, dispatch=dp)
    assert len(digest) == 64
    assert dls.data.get("shared/blob", dispatch=dp) == b"x" * 300_000
    assert dls.data.url("shared/blob", dispatch=dp).startswith("http")
