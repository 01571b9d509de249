"""infra/openapi.yaml: a valid OpenAPI 3.1 document that lists exactly the routes the
resolver registers, and whose schemas hold for the plane's real answers.

A route added in ``handlers/api.py`` without its entry in the document (or the other way
round) fails here, and so does an answer whose shape drifts from the schema.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from dreamlake.lakeshore.api import Service, bootstrap_admin
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import make_app
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.wire import encode_result

SPEC = Path(__file__).resolve().parent.parent / "infra" / "openapi.yaml"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
JSON = "application/json"
MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    with SPEC.open() as f:
        doc: dict[str, Any] = yaml.safe_load(f)
    return doc


def spec_routes(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops if m in METHODS}


def resolver_routes(app: Any) -> set[tuple[str, str]]:
    """(method, path template) of every route registered on a powertools resolver."""
    routes = [*app._static_routes, *app._dynamic_routes]
    return {(r.method.upper(), re.sub(r"<(\w+)>", r"{\1}", r.path)) for r in routes}


def test_the_document_is_valid_openapi_3_1(spec: dict[str, Any]) -> None:
    assert spec["openapi"].startswith("3.1")
    validate(spec)


def test_the_document_lists_exactly_the_routes_of_the_resolver(spec: dict[str, Any]) -> None:
    # Given the resolver the Lambda and `lakeshore serve` both run
    app = make_app(Service(Plane(SqliteStore(":memory:"))))
    # Then its route table and the document's paths are one set
    in_code, in_spec = resolver_routes(app), spec_routes(spec)
    assert in_code, "found no routes on the resolver"
    assert in_spec == in_code, (
        f"only in infra/openapi.yaml: {sorted(in_spec - in_code)}; "
        f"only in handlers/api.py: {sorted(in_code - in_spec)}"
    )


def test_every_operation_speaks_both_content_types_and_names_its_errors(
    spec: dict[str, Any],
) -> None:
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method not in METHODS:
                continue
            where = f"{method.upper()} {path}"
            assert op.get("operationId") and op.get("summary"), where
            if op.get("security") == []:  # the dashboard's static files: no token, no codec
                assert path == "/" or path.startswith("/ui/"), where
                continue
            assert "401" in op["responses"] and "default" in op["responses"], where
            bodies = [op.get("requestBody", {}).get("content", {})]
            bodies += [r.get("content", {}) for r in op["responses"].values() if "$ref" not in r]
            for content in bodies:
                if path == "/metrics":
                    assert set(content) <= {"text/plain"}, where
                elif content and "application/octet-stream" not in content:
                    assert set(content) == {JSON, MSGPACK}, where
    assert spec["security"] == [{"bearer": []}]
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


# --- real answers against the schemas --------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        media = self.headers.get("content-type", "")
        if media.startswith(MSGPACK):
            return msgpack.unpackb(self.raw, raw=False)
        return json.loads(self.raw) if self.raw else None


def _jsonable(value: Any) -> Any:
    """A msgpack answer as its JSON twin (bytes → base64), for the schema check."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


class Contract:
    """Sends requests through the resolver and checks each answer against the document."""

    def __init__(self, spec: dict[str, Any], app: Any) -> None:
        self.spec = spec
        self.app = app
        self.covered: set[tuple[str, str]] = set()
        self.templates = [
            (path, re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)) + "$"))
            for path in spec["paths"]
        ]

    def template(self, method: str, path: str) -> str | None:
        found = [
            t
            for t, rx in self.templates
            if rx.match(path) and method.lower() in self.spec["paths"][t]
        ]
        return min(found, key=lambda t: t.count("{")) if found else None  # static paths win

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None,
        media: str = JSON,
        raw: bytes | None = None,
        query: str = "",
    ) -> Answer:
        headers = {"content-type": media}
        if token:
            headers["authorization"] = f"Bearer {token}"
        if raw is None and body is not None:
            raw = json.dumps(body).encode() if media == JSON else msgpack.packb(body)
        event = apigw.http_event(method, path, query_string=query, headers=headers, body=raw or b"")
        status, out_headers, data = apigw.http_response(self.app.resolve(event, None))
        answer = Answer(status, {k.lower(): v for k, v in out_headers}, data)
        self.check(method, path, answer)
        return answer

    def check(self, method: str, path: str, answer: Answer) -> None:
        where = f"{method} {path} → {answer.status}"
        template = self.template(method, path)
        if template is None:  # no such operation: a 404 or 405 in the error shape
            assert answer.status in (404, 405), where
            response = {"$ref": "#/components/responses/Error"}
        else:
            op = self.spec["paths"][template][method.lower()]
            response = op["responses"].get(str(answer.status)) or op["responses"]["default"]
        if "$ref" in response:
            response = self.spec["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
        content = response.get("content")
        if not content:
            assert answer.raw == b"", where
        else:
            media = answer.headers["content-type"].split(";")[0]
            assert media in content, f"{where}: {media} is not documented"
            if media in (JSON, MSGPACK):
                schema = {**content[media]["schema"], "components": self.spec["components"]}
                errors = list(OAS31Validator(schema).iter_errors(_jsonable(answer.body)))
                assert not errors, f"{where}: {errors[0].message} at {list(errors[0].path)}"
        if template is not None and 200 <= answer.status < 400:
            self.covered.add((method.upper(), template))


@pytest.fixture
def contract(spec: dict[str, Any]) -> Iterator[tuple[Contract, str]]:
    plane = Plane(SqliteStore(":memory:"))
    admin = bootstrap_admin(plane)
    assert admin is not None
    yield Contract(spec, make_app(Service(plane))), admin
    plane.close()


def test_real_answers_match_the_document(
    spec: dict[str, Any], contract: tuple[Contract, str]
) -> None:
    api, admin = contract
    call = api.call
    # Given tokens for each role
    assert call("GET", "/v1/hello", token=admin).status == 200
    assert call("GET", "/v1/hello", token=admin, media=MSGPACK).status == 200
    producer = call("POST", "/v1/tokens", {"role": "producer"}, token=admin).body
    worker = call("POST", "/v1/tokens", {"role": "worker", "queues": ["jobs"]}, token=admin).body
    p, w = producer["token"], worker["token"]
    assert call("GET", "/v1/tokens", token=admin).status == 200

    # Queues
    assert call("POST", "/v1/queues", {"name": "jobs"}, token=p).status == 200
    assert call("POST", "/v1/queues", {"name": "jobs", "check": ["kind"]}, token=w).status == 200
    assert call("GET", "/v1/queues", token=w).status == 200
    assert call("PATCH", "/v1/queues/jobs", {"retry": {"max": 1}}, token=p).status == 200

    # Invocations: a ref call, a command, a delayed call
    subs = [
        {"queue": "jobs", "ref": "math:sqrt", "args": [16]},
        {"queue": "jobs", "exec": {"cmd": ["true"]}},
        {"queue": "jobs", "ref": "math:floor", "args": [1.5], "delay": 600},
    ]
    ids = call("POST", "/v1/invocations", {"invocations": subs}, token=p).body["ids"]
    assert call("GET", "/v1/invocations", token=p, query="queue=jobs&limit=2").status == 200
    assert call("PATCH", f"/v1/invocations/{ids[2]}", {"priority": 5}, token=p).status == 200
    claim = {"queues": ["jobs"], "worker": "w1", "limit": 2}
    claims = call("POST", "/v1/claims", claim, token=w, media=MSGPACK).body["claims"]
    assert [c["id"] for c in claims] == ids[:2]
    leases = [{"id": c["id"], "lease_token": c["lease_token"]} for c in claims]
    assert call("POST", "/v1/heartbeats", {"leases": leases}, token=w).status == 200
    result = base64.b64encode(encode_result(4.0, prefer_msgpack=True)[0]).decode()
    done = {"results": [{**leases[0], "result": result}]}
    assert call("POST", "/v1/completions", done, token=w).body["answers"][0]["ok"]
    error = {"type": "RuntimeError", "message": "boom", "traceback": ""}
    failed = {"failures": [{**leases[1], "error": error, "retryable": False}]}
    assert call("POST", "/v1/failures", failed, token=w).body["answers"][0]["state"] == "failed"
    # The failed one again: retried, claimed, its output and progress, handed back
    retried = call("POST", f"/v1/invocations/{ids[1]}/retry", token=p).body["invocation"]
    assert retried["state"] == "pending"
    again = call("POST", "/v1/claims", {"queues": ["jobs"], "worker": "w2"}, token=w).body
    lease = {"id": ids[1], "lease_token": again["claims"][0]["lease_token"]}
    chunks = [[1, "stdout", "hello\n"], [2, "stderr", "careful\n"]]
    assert call("POST", "/v1/logs", {**lease, "chunks": chunks}, token=w).body == {"ok": True}
    progress = {**lease, "fraction": 0.5, "message": "half way"}
    assert call("POST", "/v1/progress", progress, token=w).body == {"ok": True}
    logs = call("GET", f"/v1/invocations/{ids[1]}/logs", token=p, query="after=0").body
    assert [e["text"] for e in logs["entries"]] == ["hello\n", "careful\n"]
    assert call("POST", "/v1/releases", {"leases": [lease]}, token=w).body["answers"][0]["ok"]
    waited = call("POST", "/v1/invocations/wait", {"ids": ids[:2], "timeout": 0}, token=p)
    assert [v["id"] for v in waited.body["invocations"]] == ids[:1]
    assert call("GET", f"/v1/invocations/{ids[0]}", token=p).body["invocation"]["value"] == 4.0
    assert call("POST", f"/v1/invocations/{ids[2]}/cancel", token=p).body["state"] == "cancelled"

    # Blobs: by token, then through the signed URL
    data = b"\x00\xffbytes"
    digest = hashlib.sha256(data).hexdigest()
    missing = call("POST", "/v1/blobs/missing", {"digests": [digest]}, token=w).body
    put_url = missing["upload"][digest]
    path, _, query = put_url.partition("?")
    blob = "application/octet-stream"
    assert call("PUT", path, token=None, media=blob, raw=data, query=query).status == 204
    assert call("GET", f"/v1/blobs/{digest}", token=p).raw == data
    assert call("GET", f"/v1/blobs/{digest}/url", token=p).body["url"].startswith("/v1/blobs/")
    assert call("POST", "/v1/data", {"key": "runs/1/out", "digest": digest}, token=w).status == 200
    found = call("POST", "/v1/data/lookup", {"keys": ["runs/1/out", "nope"]}, token=p).body
    assert found == {"digests": {"runs/1/out": digest}}

    # Daemons
    register = {
        "name": "gpu-box",
        "queues": ["jobs"],
        "concurrency": 2,
        "python": "3.11",
        "pickle_protocols": [5],
        "host": "gpu-1",
    }
    daemon = call("POST", "/v1/daemons", register, token=w).body["daemon"]
    d = daemon["id"]
    assert call("POST", f"/v1/daemons/{d}/heartbeat", {"running": 1}, token=w).status == 200
    assert call("GET", "/v1/daemons", token=p).status == 200
    assert call("PATCH", f"/v1/daemons/{d}", {"concurrency": 4}, token=admin).status == 200
    assert call("POST", f"/v1/daemons/{d}/drain", token=admin).body["daemon"]["draining"]
    assert call("DELETE", f"/v1/daemons/{d}", token=w).body == {"removed": True}
    assert call("DELETE", f"/v1/daemons/{d}", token=w).body == {"removed": False}

    # The dashboard: its files, what it reads, what it changes
    assert call("GET", "/", token=None).headers["location"] == "/ui/"
    assert b"<script" in call("GET", "/ui/", token=None).raw
    assert call("GET", "/ui/app.js", token=None).headers["content-type"].startswith("text/javas")
    assert call("GET", "/ui/nothing.js", token=None).status == 404
    shown = call("GET", f"/v1/invocations/{ids[0]}", token=p).body["invocation"]["call"]
    assert shown == {"kind": "ref", "name": "math:sqrt", "args": "16"}
    stats = call("GET", "/v1/stats", token=p, query="queue=jobs").body["queues"][0]
    assert sum(stats["succeeded"]) == 1 and sum(stats["submitted"]) == 3
    paused = call("PATCH", "/v1/queues/jobs", {"paused": True}, token=p).body["queue"]
    assert paused["paused"] is True
    assert call("GET", "/v1/queues/jobs", token=w).body["queue"]["paused"] is True
    text = call("GET", "/metrics", token=admin).raw.decode()
    assert 'lakeshore_invocations_succeeded_total{queue="jobs"} 1' in text

    # Housekeeping
    assert call("POST", "/v1/queues/prune", {"older_than": 3600}, token=admin).status == 200
    assert call("GET", "/v1/queues/jobs", token=p).status == 200
    assert call("DELETE", "/v1/queues/jobs", token=p, query="force=true").body["deleted"] == 3
    assert call("DELETE", f"/v1/tokens/{producer['id']}", token=admin).body["revoked"]

    # Errors have the documented shape
    assert call("GET", "/v1/hello", token=None).status == 401
    assert call("GET", "/v1/hello", token=p).status == 401  # revoked
    assert call("POST", "/v1/tokens", {"role": "admin"}, token=w).status == 403
    assert call("POST", "/v1/queues", {"name": "x", "bogus": 1}, token=w).status == 400
    assert call("GET", "/v1/queues/nothing-here", token=admin).status == 404
    assert call("DELETE", "/v1/hello", token=admin).status == 405
    assert call("GET", "/v1/nowhere", token=admin).status == 404

    # And every operation of the document was seen answering 2xx
    assert api.covered == spec_routes(spec), sorted(spec_routes(spec) - api.covered)
