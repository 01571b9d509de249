"""Metrics: the service counts what happens, ``GET /metrics`` shows it as Prometheus text
(parsed here line by line), and the Lambda handler writes the same events as CloudWatch
EMF on stdout."""

from __future__ import annotations

import base64
import json
import logging
import re
from typing import Any

import pytest

from dreamlake.lakeshore.api import Service, bootstrap_admin, create_token
from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.handlers import api as api_handler
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import make_app, write_emf
from dreamlake.lakeshore.metrics import BUCKETS, Registry
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.wire import encode_error, encode_result

_SAMPLE = re.compile(r'^([a-z_]+)(?:\{((?:[a-z_]+="(?:[^"\\]|\\.)*",?)*)\})? (\S+)$')


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text exposition → {(name, labels): value}; fails on a malformed line."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("# HELP ") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or base in typed, f"{name} has no TYPE line"
        pairs = re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', labels or "")
        out[(name, frozenset(pairs))] = float(value)
    return out


def _call(app: Any, method: str, path: str, token: str, body: Any = None) -> Any:
    raw = json.dumps(body).encode() if body is not None else b""
    event = apigw.http_event(
        method,
        path,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        body=raw,
    )
    status, headers, data = apigw.http_response(app.resolve(event, None))
    ctype = dict((k.lower(), v) for k, v in headers).get("content-type", "")
    return status, (json.loads(data) if "json" in ctype else data.decode())


def test_the_service_counts_a_queue_and_metrics_shows_it_as_prometheus_text() -> None:
    # Given a served plane with a producer and a worker
    plane = Plane(SqliteStore(":memory:"))
    service = Service(plane)
    app = make_app(service)
    admin = bootstrap_admin(plane)
    assert admin is not None
    p, _ = create_token(plane, "producer")
    w, _ = create_token(plane, "worker")
    subs = [{"queue": "q1", "ref": "math:sqrt", "args": [i]} for i in range(3)]
    # When three are submitted and claimed, one succeeds and one fails
    _call(app, "POST", "/v1/invocations", p, {"invocations": subs})
    claims = _call(app, "POST", "/v1/claims", w, {"queues": ["q1"], "worker": "w-1", "limit": 3})
    c = claims[1]["claims"]
    lease = [{"id": x["id"], "lease_token": x["lease_token"]} for x in c]
    _call(app, "POST", "/v1/heartbeats", w, {"leases": lease[:1]})
    ok = base64.b64encode(encode_result(1.0, prefer_msgpack=True)[0]).decode()
    _call(app, "POST", "/v1/completions", w, {"results": [{**lease[0], "result": ok}]})
    err = encode_error(ValueError("no"))
    err = {k: v for k, v in err.items() if k != "pickled"}
    _call(
        app,
        "POST",
        "/v1/failures",
        w,
        {"failures": [{**lease[1], "error": err, "retryable": False}]},
    )
    d = _call(app, "POST", "/v1/daemons", w, {"name": "gpu-1", "queues": ["q1"]})[1]["daemon"]
    _call(app, "POST", f"/v1/daemons/{d['id']}/heartbeat", w, {"running": 2})
    # Then /metrics (admin only) has every series, with histogram buckets in order
    assert _call(app, "GET", "/metrics", p)[0] == 403
    status, text = _call(app, "GET", "/metrics", admin)
    assert status == 200
    m = parse(text)
    q = frozenset({("queue", "q1")})
    assert m[("lakeshore_invocations_submitted_total", q)] == 3
    assert m[("lakeshore_invocations_claimed_total", q)] == 3
    assert m[("lakeshore_invocations_succeeded_total", q)] == 1
    assert m[("lakeshore_invocations_failed_total", q)] == 1
    assert m[("lakeshore_invocations_dead_total", q)] == 0
    assert m[("lakeshore_queue_invocations", q | {("state", "running")})] == 1
    assert m[("lakeshore_run_time_seconds_count", q)] == 2
    assert m[("lakeshore_queue_time_seconds_count", q)] == 2
    buckets = [m[("lakeshore_run_time_seconds_bucket", q | {("le", str(b))})] for b in BUCKETS[:3]]
    assert buckets == sorted(buckets)
    assert m[("lakeshore_run_time_seconds_bucket", q | {("le", "+Inf")})] == 2
    assert m[("lakeshore_worker_busy_slots", frozenset({("worker", "gpu-1")}))] == 2
    beats = frozenset({("worker", "gpu-1"), ("kind", "daemon")})
    assert m[("lakeshore_worker_heartbeats_total", beats)] == 1
    assert (
        m[("lakeshore_worker_heartbeats_total", frozenset({("worker", "w-1"), ("kind", "lease")}))]
        == 1
    )
    plane.close()


def test_attempts_that_ran_past_their_timeout_are_counted_however_they_end() -> None:
    # Given three calls with a 1 s timeout and no retries, one more that may retry once,
    # all claimed, on a plane whose clock the test moves
    clock = FakeClock()
    plane = Plane(SqliteStore(":memory:"), clock=clock)
    app = make_app(Service(plane))
    admin = bootstrap_admin(plane)
    assert admin is not None
    p, _ = create_token(plane, "producer")
    w, _ = create_token(plane, "worker")
    subs: list[dict[str, Any]] = [
        {"queue": "slow", "ref": "time:sleep", "args": [5], "timeout": 1, "id": f"t{i}"}
        for i in range(3)
    ]
    subs.append({**subs[0], "id": "again", "retry": {"max": 1}})
    _call(app, "POST", "/v1/invocations", p, {"invocations": subs})
    body = {"queues": ["slow"], "worker": "w-1", "limit": 4}
    claims = {c["id"]: c for c in _call(app, "POST", "/v1/claims", w, body)[1]["claims"]}
    assert len(claims) == 4
    # When the time passes: one worker's timeout failure arrives late (the plane records
    # the timeout), another's result too, and the sweep ends the other two
    clock.advance(2)
    err = {"type": "dreamlake.lakeshore.InvocationTimeout", "message": "killed", "traceback": ""}
    lease = {"id": "t0", "lease_token": claims["t0"]["lease_token"]}
    _call(app, "POST", "/v1/failures", w, {"failures": [{**lease, "error": err}]})
    ok = base64.b64encode(encode_result(1.0, prefer_msgpack=True)[0]).decode()
    lease = {"id": "t1", "lease_token": claims["t1"]["lease_token"]}
    _call(app, "POST", "/v1/completions", w, {"results": [{**lease, "result": ok}]})
    plane.sweep()
    # Then the three failed for good are counted as failed, the one retried as retried,
    # each with its run time
    m = parse(_call(app, "GET", "/metrics", admin)[1])
    q = frozenset({("queue", "slow")})
    assert m[("lakeshore_invocations_failed_total", q)] == 3
    assert m[("lakeshore_invocations_retried_total", q)] == 1
    assert m[("lakeshore_run_time_seconds_count", q)] == 4
    assert ("lakeshore_invocations_succeeded_total", q) not in m
    plane.close()


def test_label_values_are_escaped() -> None:
    reg = Registry()
    reg.heartbeat('a"b\\c\nd', "lease")
    m = parse(reg.prometheus())
    labels = frozenset({("worker", 'a\\"b\\\\c\\nd'), ("kind", "lease")})
    assert m[("lakeshore_worker_heartbeats_total", labels)] == 1


def test_dead_grows_by_the_rise_in_dead_invocations() -> None:
    reg = Registry()
    reg.counts("q", {"dead": 4})
    reg.counts("q", {"dead": 6})
    reg.counts("q", {"dead": 6})
    assert reg.value("lakeshore_invocations_dead_total", queue="q") == 2


def test_emf_documents_carry_each_queues_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    # Given a registry that keeps its events, fed like the Lambda's service
    reg = Registry(keep_events=True)
    reg.submitted("a", 2)
    reg.finished("a", "succeeded", 0.5, 1.5)
    reg.claimed("b")
    # When the handler writes them
    write_emf(reg.drain())
    # Then stdout holds one EMF document per queue with its dimension and values
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_queue = {d["queue"]: d for d in docs}
    assert set(by_queue) == {"a", "b"}
    a = by_queue["a"]
    directive = a["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == "Lakeshore"
    assert sorted(directive["Dimensions"][0]) == ["queue", "service"]
    names = {x["Name"]: x["Unit"] for x in directive["Metrics"]}
    assert names == {"Submitted": "Count", "Succeeded": "Count", "QueueTime": "Seconds",
                     "RunTime": "Seconds"}  # fmt: skip
    assert a["Submitted"] in (2.0, [2.0]) and a["RunTime"] in (1.5, [1.5])
    assert reg.drain() == []


def test_the_lambda_handler_prints_emf_for_a_submit(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the Lambda entry over a plane file
    monkeypatch.setenv("LAKESHORE_PLANE", str(tmp_path / "plane.db"))
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Lakeshore")
    monkeypatch.setattr(api_handler, "_lambda_app", None)
    root = logging.getLogger("dreamlake.lakeshore")
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # the handler adds its own
    monkeypatch.setattr(root, "propagate", root.propagate)
    monkeypatch.setattr(root, "level", root.level)
    plane = Plane(SqliteStore(str(tmp_path / "plane.db")))
    token, _ = create_token(plane, "producer")
    plane.close()
    body = {"invocations": [{"queue": "emf", "ref": "math:sqrt", "args": [4]}]}
    event = apigw.http_event(
        "POST",
        "/v1/invocations",
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        body=json.dumps(body).encode(),
    )
    # When a submit comes in
    result = api_handler.handler(event, None)
    assert result["statusCode"] == 200
    # Then stdout has the queue's Submitted metric as EMF, and the JSON log of the submit
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    emf = [x for x in lines if "_aws" in x and x.get("queue") == "emf"]
    assert emf and emf[0]["Submitted"] in (1.0, [1.0])
    logged = [x for x in lines if x.get("event") == "invocation.submitted"]
    assert logged and logged[0]["queue"] == "emf" and logged[0]["correlation_id"]
    monkeypatch.setattr(api_handler, "_lambda_app", None)
