"""Structured logs: JSON lines with the invocation id as ``correlation_id``, from the
plane's service, the worker and the SDK's submit, for one invocation end to end."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import logs


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    root = logging.getLogger(logs.ROOT)
    saved = (list(root.handlers), root.level, root.propagate)
    out = io.StringIO()
    logs.configure(out, logging.DEBUG)
    yield out
    root.handlers, root.level, root.propagate = saved[0], saved[1], saved[2]


def test_an_event_is_one_json_line_with_its_fields(lines: io.StringIO) -> None:
    logs.event(logging.getLogger("dreamlake.lakeshore.x"), "thing.done", "inv-1", n=3)
    (line,) = lines.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["event"] == "thing.done" and doc["correlation_id"] == "inv-1" and doc["n"] == 3
    assert doc["level"] == "INFO" and doc["logger"] == "dreamlake.lakeshore.x"
    assert doc["time"].endswith("Z")


def test_a_plain_log_call_and_an_exception_are_json_too(lines: io.StringIO) -> None:
    log = logging.getLogger("dreamlake.lakeshore.y")
    try:
        raise KeyError("k")
    except KeyError:
        log.exception("went %s", "wrong")
    doc = json.loads(lines.getvalue())
    assert doc["message"] == "went wrong" and "KeyError" in doc["exception"]


def test_a_disabled_level_prints_nothing(lines: io.StringIO) -> None:
    logging.getLogger(logs.ROOT).setLevel(logging.WARNING)
    logs.event(logging.getLogger("dreamlake.lakeshore.z"), "quiet", "inv-2")
    assert lines.getvalue() == ""


def test_one_invocation_is_followed_through_sdk_plane_and_worker(
    lines: io.StringIO, lakeshore_server: object, lakeshore_worker: object
) -> None:
    # Given a served plane and a worker thread on it
    producer = lakeshore_server.dispatch("producer")  # type: ignore[attr-defined]
    worker = lakeshore_server.dispatch("worker")  # type: ignore[attr-defined]
    lakeshore_worker("logged", dispatch=worker)  # type: ignore[operator]
    q = dls.SyncQueue("logged", dispatch=producer)
    # When one call runs
    inv = q.submit("math:sqrt", 9.0)
    assert q.result(inv, timeout=20) == 3.0
    # Then the SDK, the plane and the worker each logged it under its id
    events = [json.loads(x) for x in lines.getvalue().splitlines()]
    mine = [(e["logger"], e["event"]) for e in events if e.get("correlation_id") == inv]
    assert ("dreamlake.lakeshore.sdk", "invocation.submitting") in mine
    assert ("dreamlake.lakeshore.api", "invocation.submitted") in mine
    assert ("dreamlake.lakeshore.api", "invocation.claimed") in mine
    assert ("dreamlake.lakeshore.worker", "job.started") in mine
    assert ("dreamlake.lakeshore.worker", "job.finished") in mine
    assert ("dreamlake.lakeshore.api", "invocation.succeeded") in mine


def test_the_default_stream_is_stderr_as_it_is_when_a_line_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given logging configured while one stderr is in place
    root = logging.getLogger(logs.ROOT)
    saved = (list(root.handlers), root.level, root.propagate)
    try:
        logs.configure()
        # When stderr is swapped afterwards (a test runner does), lines go to the new one
        later = io.StringIO()
        monkeypatch.setattr("sys.stderr", later)
        logs.event(logging.getLogger("dreamlake.lakeshore.z"), "late.line", "inv-9")
        assert json.loads(later.getvalue())["correlation_id"] == "inv-9"
    finally:
        root.handlers, root.level, root.propagate = saved[0], saved[1], saved[2]
