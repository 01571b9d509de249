"""Who may call what: every route for every kind of caller, and what tokens never do.

The matrix crosses each route of ``handlers.api.ROUTES`` with nine callers: no token, a
malformed one, a known id with a wrong secret, a revoked token, the admin, and a
producer and a worker each with the queue in scope (``team-a*``) and out of it
(``team-b*``). The expected answer of every cell comes from the role table of
docs/api.md: a missing, malformed, wrong or revoked token is 401; a role the table does
not name, or a queue out of the token's scopes, is 403; otherwise the route's success.
Where a route names no queue (in its path, query, body or through an invocation), scope
does not apply. A refused request changes nothing stored.

Cells run through the Lambda handler in-process, as tests/test_api.py does, each on a
fresh plane; a few run again against ``lakeshore serve`` to show the HTTP path agrees.
The rest of the file checks the token model (secrets are shown once, never listed,
never logged, stored as SHA-256 only and compared in constant time) and the pickle trust
boundary: a worker runs a function body or arguments fetched as a blob only when their
bytes match the digest the payload recorded at submit, so code written into the store
behind the plane's back is refused, never run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import msgpack
import pytest

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import wire
from dreamlake.lakeshore.api import Limits, Service, auth, bootstrap_admin, create_token
from dreamlake.lakeshore.errors import Unauthorized
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import ROUTES, make_app
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.plane.model import QueueSpec, Submission
from dreamlake.lakeshore.server import LocalServer, serve_in_thread
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.wire import encode_error, encode_ref_call, encode_result
from dreamlake.lakeshore.worker.pool import ProcessWorker

MP = "application/msgpack"
JS = "application/json"
OCTET = "application/octet-stream"

#: the queue every scoped request names
QUEUE = "team-a"
#: the callers of the matrix, in the order the ids read
CALLERS = (
    "no-token",
    "malformed",
    "wrong-secret",
    "revoked",
    "admin",
    "producer-in",
    "producer-out",
    "worker-in",
    "worker-out",
)
_BAD_TOKENS = frozenset({"no-token", "malformed", "wrong-secret", "revoked"})


# --- a plane with one of everything ---------------------------------------------------


@dataclass
class World:
    """A plane holding a queue in scope with invocations in each state a route needs,
    a daemon, a blob, a data key and a token to revoke; and a token per caller."""

    plane: Plane
    app: Any
    tokens: dict[str, str | None]
    pending: str
    running: str
    lease: str
    failed: str
    daemon: str
    digest: str
    victim: str
    secrets: list[str] = field(default_factory=list)


def _submission(inv_id: str) -> Submission:
    return Submission(
        id=inv_id, queue=QUEUE, payload=encode_ref_call("math:sqrt", (4.0,), {}).payload
    )


def build_world(plane: Plane) -> World:
    """Fill ``plane`` (fresh) and return the handles the requests need."""
    app = make_app(Service(plane, limits=Limits(max_wait=0.05)))
    admin = bootstrap_admin(plane)
    assert admin is not None
    tokens: dict[str, str | None] = {"no-token": None, "malformed": "not-a-lakeshore-token"}
    tokens["admin"] = admin
    ids: dict[str, str] = {}
    for role in ("producer", "worker"):
        for where, scope in (("in", "team-a*"), ("out", "team-b*")):
            secret, rec = create_token(plane, role, [scope], name=f"{role}-{where}")
            tokens[f"{role}-{where}"] = secret
            ids[f"{role}-{where}"] = rec.id
    tokens["wrong-secret"] = f"lks_{ids['producer-in']}_{'x' * 32}"
    revoked, rec = create_token(plane, "producer", ["*"], name="revoked")
    rec.revoked_at = plane.now()
    plane.store.put_token(rec)
    tokens["revoked"] = revoked
    victim_secret, victim = create_token(plane, "producer", ["*"], name="victim")

    plane.ensure_queue(QueueSpec(QUEUE))
    running, failed, pending = "inv-running", "inv-failed", "inv-pending"
    plane.submit([_submission(running), _submission(failed)])
    claims = {c.id: c for c in plane.claim([QUEUE], "w-1", limit=2)}
    plane.fail(failed, claims[failed].lease_token, encode_error(ValueError("x")), retryable=False)
    plane.submit([_submission(pending)])
    daemon = plane.register_daemon("d-1", queues=[QUEUE])
    blob = b"blob bytes"
    digest = hashlib.sha256(blob).hexdigest()
    plane.put_blob(digest, blob)
    plane.put_data("k-1", digest)
    secrets = [t for t in tokens.values() if t] + [victim_secret]
    return World(
        plane=plane,
        app=app,
        tokens=tokens,
        pending=pending,
        running=running,
        lease=claims[running].lease_token,
        failed=failed,
        daemon=daemon.id,
        digest=digest,
        victim=victim.id,
        secrets=secrets,
    )


@pytest.fixture
def world() -> Iterator[World]:
    plane = Plane(SqliteStore(":memory:"))
    yield build_world(plane)
    plane.close()


def snapshot(plane: Plane) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of a SQLite plane, in a stable order."""
    db: sqlite3.Connection = plane.store._db  # type: ignore[attr-defined]
    names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {n: sorted(db.execute(f"SELECT * FROM {n}").fetchall(), key=repr) for n in names}


# --- requests -------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes = b""
    ctype: str = MP
    query: str = ""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any
    raw: bytes


def _mp(value: Any) -> bytes:
    out: bytes = msgpack.packb(value, use_bin_type=True)
    return out


def call(app: Any, req: Request, token: str | None, accept: str | None = None) -> Answer:
    """One request through the Lambda handler, as API Gateway delivers it."""
    headers = {"content-type": req.ctype}
    if accept:
        headers["accept"] = accept
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    event = apigw.http_event(
        req.method, req.path, headers=headers, body=req.body, query_string=req.query
    )
    status, hdrs, data = apigw.http_response(app.resolve(event, None))
    media = dict((k.lower(), v) for k, v in hdrs).get("content-type", "")
    body: Any = None
    if data and media.startswith(MP):
        body = msgpack.unpackb(data, raw=False)
    elif data and media.startswith(JS):
        body = json.loads(data)
    return Answer(status, body, data)


# --- the route table, from docs/api.md -----------------------------------------------


@dataclass(frozen=True)
class Route:
    method: str
    #: the path template, as ROUTES has it
    path: str
    #: the roles besides admin the docs allow
    roles: frozenset[str]
    #: whether the request names a queue, so scopes apply
    scoped: bool
    build: Callable[[World], Request]
    #: the status of a permitted call
    ok: int = 200
    #: answered to anyone, token or not (the dashboard's static files)
    public: bool = False


ANY = frozenset({"producer", "worker"})
PRODUCER = frozenset({"producer"})
WORKER = frozenset({"worker"})
ADMIN: frozenset[str] = frozenset()


def _lease(w: World) -> dict[str, str]:
    return {"id": w.running, "lease_token": w.lease}


ROUTE_TABLE: list[Route] = [
    Route("GET", "/v1/hello", ANY, False, lambda w: Request("GET", "/v1/hello")),
    Route(
        "POST",
        "/v1/queues",
        ANY,
        True,
        lambda w: Request("POST", "/v1/queues", _mp({"name": f"{QUEUE}-new"})),
    ),
    Route("GET", "/v1/queues", ANY, False, lambda w: Request("GET", "/v1/queues")),
    Route(
        "POST",
        "/v1/queues/prune",
        ADMIN,
        False,
        lambda w: Request("POST", "/v1/queues/prune", _mp({"older_than": 3600})),
    ),
    Route("GET", "/v1/queues/{name}", ANY, True, lambda w: Request("GET", f"/v1/queues/{QUEUE}")),
    Route(
        "PATCH",
        "/v1/queues/{name}",
        PRODUCER,
        True,
        lambda w: Request("PATCH", f"/v1/queues/{QUEUE}", _mp({"retry": {"max": 2}})),
    ),
    Route(
        "DELETE",
        "/v1/queues/{name}",
        PRODUCER,
        True,
        lambda w: Request("DELETE", f"/v1/queues/{QUEUE}", query="force=true"),
    ),
    Route(
        "POST",
        "/v1/invocations",
        PRODUCER,
        True,
        lambda w: Request(
            "POST",
            "/v1/invocations",
            _mp({"invocations": [{"queue": QUEUE, "ref": "math:sqrt", "args": [9]}]}),
        ),
    ),
    Route(
        "GET",
        "/v1/invocations",
        PRODUCER,
        True,
        lambda w: Request("GET", "/v1/invocations", query=f"queue={QUEUE}"),
    ),
    Route(
        "POST",
        "/v1/invocations/wait",
        PRODUCER,
        True,
        lambda w: Request("POST", "/v1/invocations/wait", _mp({"ids": [w.pending], "timeout": 0})),
    ),
    Route(
        "GET",
        "/v1/invocations/{id}",
        PRODUCER,
        True,
        lambda w: Request("GET", f"/v1/invocations/{w.pending}"),
    ),
    Route(
        "PATCH",
        "/v1/invocations/{id}",
        PRODUCER,
        True,
        lambda w: Request("PATCH", f"/v1/invocations/{w.pending}", _mp({"priority": 5})),
    ),
    Route(
        "POST",
        "/v1/invocations/{id}/cancel",
        PRODUCER,
        True,
        lambda w: Request("POST", f"/v1/invocations/{w.pending}/cancel"),
    ),
    Route(
        "POST",
        "/v1/invocations/{id}/retry",
        PRODUCER,
        True,
        lambda w: Request("POST", f"/v1/invocations/{w.failed}/retry"),
    ),
    Route(
        "GET",
        "/v1/invocations/{id}/logs",
        PRODUCER,
        True,
        lambda w: Request("GET", f"/v1/invocations/{w.running}/logs"),
    ),
    Route(
        "POST",
        "/v1/claims",
        WORKER,
        True,
        lambda w: Request("POST", "/v1/claims", _mp({"queues": [QUEUE], "worker": "w-2"})),
    ),
    Route(
        "POST",
        "/v1/heartbeats",
        WORKER,
        True,
        lambda w: Request("POST", "/v1/heartbeats", _mp({"leases": [_lease(w)]})),
    ),
    Route(
        "POST",
        "/v1/completions",
        WORKER,
        True,
        lambda w: Request(
            "POST",
            "/v1/completions",
            _mp({"results": [{**_lease(w), "result": encode_result(2.0)[0]}]}),
        ),
    ),
    Route(
        "POST",
        "/v1/failures",
        WORKER,
        True,
        lambda w: Request(
            "POST",
            "/v1/failures",
            _mp({"failures": [{**_lease(w), "error": encode_error(ValueError("no"))}]}),
        ),
    ),
    Route(
        "POST",
        "/v1/releases",
        WORKER,
        True,
        lambda w: Request("POST", "/v1/releases", _mp({"leases": [_lease(w)]})),
    ),
    Route(
        "POST",
        "/v1/logs",
        WORKER,
        True,
        lambda w: Request(
            "POST", "/v1/logs", _mp({**_lease(w), "chunks": [[1, "stdout", "hello\n"]]})
        ),
    ),
    Route(
        "POST",
        "/v1/progress",
        WORKER,
        True,
        lambda w: Request("POST", "/v1/progress", _mp({**_lease(w), "fraction": 0.5})),
    ),
    Route(
        "POST",
        "/v1/blobs/missing",
        ANY,
        False,
        lambda w: Request("POST", "/v1/blobs/missing", _mp({"digests": [w.digest, "0" * 64]})),
    ),
    Route(
        "PUT",
        "/v1/blobs/{digest}",
        ANY,
        False,
        lambda w: Request(
            "PUT", f"/v1/blobs/{hashlib.sha256(b'new').hexdigest()}", b"new", ctype=OCTET
        ),
        ok=204,
    ),
    Route(
        "GET", "/v1/blobs/{digest}", ANY, False, lambda w: Request("GET", f"/v1/blobs/{w.digest}")
    ),
    Route(
        "GET",
        "/v1/blobs/{digest}/url",
        ANY,
        False,
        lambda w: Request("GET", f"/v1/blobs/{w.digest}/url"),
    ),
    Route(
        "POST",
        "/v1/data",
        ANY,
        False,
        lambda w: Request("POST", "/v1/data", _mp({"key": "k-2", "digest": w.digest})),
    ),
    Route(
        "POST",
        "/v1/data/lookup",
        ANY,
        False,
        lambda w: Request("POST", "/v1/data/lookup", _mp({"keys": ["k-1", "k-none"]})),
    ),
    Route(
        "POST",
        "/v1/daemons",
        WORKER,
        True,
        lambda w: Request("POST", "/v1/daemons", _mp({"name": "d-2", "queues": [QUEUE]})),
    ),
    Route(
        "POST",
        "/v1/daemons/{id}/heartbeat",
        WORKER,
        False,
        lambda w: Request("POST", f"/v1/daemons/{w.daemon}/heartbeat", _mp({"running": 0})),
    ),
    Route("GET", "/v1/daemons", ANY, False, lambda w: Request("GET", "/v1/daemons")),
    Route(
        "PATCH",
        "/v1/daemons/{id}",
        ADMIN,
        False,
        lambda w: Request("PATCH", f"/v1/daemons/{w.daemon}", _mp({"concurrency": 2})),
    ),
    Route(
        "POST",
        "/v1/daemons/{id}/drain",
        ADMIN,
        False,
        lambda w: Request("POST", f"/v1/daemons/{w.daemon}/drain"),
    ),
    Route(
        "DELETE",
        "/v1/daemons/{id}",
        WORKER,
        True,  # (the daemon's queues: d-1 serves QUEUE)
        lambda w: Request("DELETE", f"/v1/daemons/{w.daemon}"),
    ),
    Route(
        "POST",
        "/v1/tokens",
        ADMIN,
        False,
        lambda w: Request("POST", "/v1/tokens", _mp({"role": "worker", "queues": ["x-*"]})),
    ),
    Route("GET", "/v1/tokens", ADMIN, False, lambda w: Request("GET", "/v1/tokens")),
    Route(
        "DELETE",
        "/v1/tokens/{id}",
        ADMIN,
        False,
        lambda w: Request("DELETE", f"/v1/tokens/{w.victim}"),
    ),
    Route(
        "GET",
        "/v1/stats",
        ANY,
        True,
        lambda w: Request("GET", "/v1/stats", query=f"queue={QUEUE}"),
    ),
    Route("GET", "/metrics", ADMIN, False, lambda w: Request("GET", "/metrics")),
    Route("GET", "/", ANY, False, lambda w: Request("GET", "/"), ok=302, public=True),
    Route("GET", "/ui/", ANY, False, lambda w: Request("GET", "/ui/"), public=True),
    Route("GET", "/ui/{asset}", ANY, False, lambda w: Request("GET", "/ui/app.js"), public=True),
]
ROUTES_BY_KEY = {(r.method, r.path): r for r in ROUTE_TABLE}


def expected(route: Route, caller: str) -> int:
    """The status docs/api.md promises ``caller`` on ``route``."""
    if route.public:
        return route.ok
    if caller in _BAD_TOKENS:
        return 401
    if caller == "admin":
        return route.ok
    role, where = caller.split("-")
    if role not in route.roles:
        return 403
    if route.scoped and where == "out":
        return 403
    return route.ok


def test_the_matrix_covers_every_route() -> None:
    # Given the routes the resolver registers (make_app fills ROUTES)
    plane = Plane(SqliteStore(":memory:"))
    make_app(Service(plane))
    plane.close()
    # Then the table above names each exactly once
    assert sorted(ROUTES_BY_KEY) == sorted(set(ROUTES))
    assert len(ROUTE_TABLE) == len(ROUTES_BY_KEY)


CELLS = [
    pytest.param(route, caller, id=f"{route.method} {route.path} | {caller}")
    for route in ROUTE_TABLE
    for caller in CALLERS
]


@pytest.mark.parametrize(("route", "caller"), CELLS)
def test_auth_matrix(world: World, route: Route, caller: str) -> None:
    # Given a plane with one of everything, and the request this route takes
    req = route.build(world)
    before = snapshot(world.plane)
    # When this caller sends it
    ans = call(world.app, req, world.tokens[caller])
    # Then the answer is the one the role table promises
    want = expected(route, caller)
    assert ans.status == want, (ans.status, ans.body)
    if want >= 400:
        code = {401: "unauthorized", 403: "forbidden"}[want]
        assert ans.body["error"]["code"] == code
        assert ans.body["error"]["message"]
        if "cannot do this" in ans.body["error"]["message"]:  # (a role refused)
            assert "(needs admin" in ans.body["error"]["message"]  # (names who may)
        # and a refused request changes nothing stored
        assert snapshot(world.plane) == before
    # No answer ever carries a token's secret (only POST /v1/tokens shows its new one)
    for secret in world.secrets:
        assert secret.encode() not in ans.raw


@pytest.mark.parametrize("caller", ["producer-out", "worker-out"])
def test_a_listing_shows_no_queue_out_of_scope(world: World, caller: str) -> None:
    # Given a plane whose one queue is out of this caller's scopes
    ans = call(world.app, Request("GET", "/v1/queues"), world.tokens[caller])
    # Then the listing is allowed and empty
    assert (ans.status, ans.body) == (200, {"queues": []})
    inside = call(
        world.app, Request("GET", "/v1/queues"), world.tokens[caller.replace("out", "in")]
    )
    assert [q["name"] for q in inside.body["queues"]] == [QUEUE]


@pytest.mark.parametrize("method", ["GET", "PUT"])
@pytest.mark.parametrize(
    "sig", ["\u00e9" * 64, "\u7f16\u7801", "0" * 63 + "\u00ff"], ids=["latin", "cjk", "last"]
)
def test_a_signed_url_with_a_non_ascii_signature_is_401(
    world: World, method: str, sig: str
) -> None:
    # Given a blob URL with a live expiry and a signature that is not hex (no token)
    expires = int(time.time()) + 600
    query = urllib.parse.urlencode({"expires": expires, "sig": sig})
    req = Request(method, f"/v1/blobs/{world.digest}", b"blob bytes", ctype=OCTET, query=query)
    before = snapshot(world.plane)
    # When it is used
    ans = call(world.app, req, None)
    # Then it is refused like any wrong signature, and nothing changes
    assert (ans.status, ans.body["error"]["code"]) == (401, "unauthorized"), ans.body
    assert snapshot(world.plane) == before


# --- the HTTP path agrees -------------------------------------------------------------

LIVE_CELLS = [
    ("GET", "/v1/hello", "no-token"),
    ("GET", "/v1/hello", "malformed"),
    ("GET", "/v1/hello", "revoked"),
    ("GET", "/v1/hello", "worker-out"),
    ("POST", "/v1/invocations", "producer-out"),
    ("POST", "/v1/invocations", "worker-in"),
    ("POST", "/v1/invocations", "producer-in"),
    ("POST", "/v1/claims", "producer-in"),
    ("POST", "/v1/claims", "worker-in"),
    ("GET", "/v1/queues/{name}", "worker-out"),
    ("GET", "/v1/tokens", "producer-in"),
    ("GET", "/v1/tokens", "admin"),
    ("GET", "/v1/blobs/{digest}", "wrong-secret"),
    ("GET", "/v1/blobs/{digest}", "worker-out"),
    ("PUT", "/v1/blobs/{digest}", "no-token"),
    ("POST", "/v1/queues/prune", "worker-in"),
]


def _http(url: str, req: Request, token: str | None) -> tuple[int, bytes]:
    headers = {"Content-Type": req.ctype}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    target = url + req.path + (f"?{req.query}" if req.query else "")
    request = urllib.request.Request(
        target, data=req.body or None, headers=headers, method=req.method
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return int(err.code), bytes(err.read())


def test_the_http_path_agrees_with_the_handler(tmp_path: Path) -> None:
    # Given a plane file filled like the matrix's, then served
    path = tmp_path / "plane.db"
    plane = Plane(SqliteStore(path))
    world = build_world(plane)
    plane.close()
    with serve_in_thread(path) as (url, admin_token):
        assert admin_token is None  # the plane had tokens: no bootstrap
        for method, template, caller in LIVE_CELLS:
            route = ROUTES_BY_KEY[(method, template)]
            # When the cell's request goes over HTTP
            status, raw = _http(url, route.build(world), world.tokens[caller])
            # Then its status is the matrix's
            assert status == expected(route, caller), (method, template, caller, raw[:200])
            for secret in world.secrets:
                assert secret.encode() not in raw


# --- the token model --------------------------------------------------------------------


def test_a_secret_is_shown_once_and_never_listed(world: World) -> None:
    admin = world.tokens["admin"]
    # Given a token made through the API
    made = call(world.app, Request("POST", "/v1/tokens", _mp({"role": "producer"})), admin)
    assert made.status == 200
    secret = made.body["token"]
    assert secret.startswith(f"lks_{made.body['id']}_")
    record = world.plane.store.get_token(made.body["id"])
    assert record is not None
    # Then no later answer carries the secret or its hash, in either content type
    for accept in (MP, JS):
        for req in (
            Request("GET", "/v1/tokens"),
            Request("GET", "/v1/hello"),
            Request("DELETE", f"/v1/tokens/{made.body['id']}"),
            Request("GET", "/v1/tokens"),
        ):
            ans = call(world.app, req, admin, accept=accept)
            assert ans.status == 200
            assert secret.encode() not in ans.raw
            assert secret.split("_", 2)[2].encode() not in ans.raw
            assert record.secret_hash.encode() not in ans.raw
    listed = call(world.app, Request("GET", "/v1/tokens"), admin).body["tokens"]
    assert {k for t in listed for k in t} == {
        "id",
        "role",
        "queues",
        "name",
        "created_at",
        "revoked_at",
    }


def test_the_store_keeps_only_a_sha256_of_the_secret(world: World) -> None:
    # Given a token made through the API
    admin = world.tokens["admin"]
    made = call(world.app, Request("POST", "/v1/tokens", _mp({"role": "worker"})), admin).body
    secret = made["token"].split("_", 2)[2]
    # Then its stored row holds the SHA-256 of the secret, and the secret nowhere
    db: sqlite3.Connection = world.plane.store._db  # type: ignore[attr-defined]
    (doc,) = db.execute("SELECT doc FROM tokens WHERE id = ?", (made["id"],)).fetchone()
    stored = msgpack.unpackb(doc, raw=False)
    assert stored["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in repr(snapshot(world.plane))
    assert made["token"] not in repr(snapshot(world.plane))


def test_tokens_never_reach_the_logs(world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    admin = world.tokens["admin"]
    # Given every log line at DEBUG while a token is made, used, refused and revoked
    made = call(world.app, Request("POST", "/v1/tokens", _mp({"role": "producer"})), admin).body
    secret = made["token"]
    assert call(world.app, Request("GET", "/v1/hello"), secret).status == 200
    submit = ROUTES_BY_KEY[("POST", "/v1/invocations")].build(world)
    assert call(world.app, submit, secret).status == 200
    wrong = secret[:-4] + "AAAA"
    assert call(world.app, Request("GET", "/v1/hello"), wrong).status == 401
    assert call(world.app, Request("DELETE", f"/v1/tokens/{made['id']}"), admin).status == 200
    assert call(world.app, Request("GET", "/v1/hello"), secret).status == 401
    # and an unexpected error answered while the caller's token is in the request
    broken = Request("POST", "/v1/queues/prune", _mp({"older_than": 1}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Plane, "prune_queues", _boom)
        assert call(world.app, broken, admin).status == 500
    assert "unexpected error" in caplog.text  # the handler did log
    # Then no record, message or argument carries a secret
    for token in [secret, wrong, admin, *world.secrets]:
        assert token not in caplog.text
        tail = token.split("_", 2)[-1]
        assert tail not in caplog.text
        for rec in caplog.records:
            assert tail not in rec.getMessage()


def _boom(*_: Any, **__: Any) -> Any:
    raise RuntimeError("an unexpected failure")


def test_the_serve_access_log_never_shows_a_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given `lakeshore serve --access-log`, every record captured
    access = logging.getLogger("uvicorn.access")
    monkeypatch.setattr(access, "propagate", True)  # an earlier server may have turned it off
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="uvicorn.access")
    server = LocalServer(tmp_path / "plane.db", access_log=True)
    server.start()
    try:
        admin = server.admin_token
        assert admin is not None
        req = Request("POST", "/v1/tokens", _mp({"role": "producer"}))
        status, raw = _http(server.url, req, admin)
        assert status == 200
        producer = msgpack.unpackb(raw, raw=False)["token"]
        # When requests carry tokens, good and bad
        assert _http(server.url, Request("GET", "/v1/hello"), producer)[0] == 200
        assert _http(server.url, Request("GET", "/v1/hello"), producer + "x")[0] == 401
        assert _http(server.url, Request("GET", "/v1/tokens"), admin)[0] == 200
    finally:
        server.stop()
    # Then the access log has those requests and no token in them
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert any("/v1/hello" in line for line in lines), lines
    for token in (admin, producer):
        assert token.split("_", 2)[2] not in caplog.text


class _Spy:
    """Records every call to hmac.compare_digest, then does the real comparison."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []
        self.real = hmac.compare_digest

    def __call__(self, a: Any, b: Any) -> bool:
        self.calls.append((a, b))
        return self.real(a, b)


@pytest.mark.parametrize(
    "how",
    ["known id, right secret", "known id, wrong secret", "unknown id", "no secret", "revoked"],
)
def test_authenticate_compares_in_constant_time_even_for_unknown_ids(
    world: World, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # Given a spy in place of hmac.compare_digest
    spy = _Spy()
    monkeypatch.setattr(hmac, "compare_digest", spy)
    good = world.tokens["producer-in"]
    assert good is not None
    token_id = good.split("_")[1]
    token = {
        "known id, right secret": good,
        "known id, wrong secret": f"lks_{token_id}_{'y' * 32}",
        "unknown id": f"lks_ffffffffffff_{'y' * 32}",
        "no secret": f"lks_{token_id}",
        "revoked": world.tokens["revoked"],
    }[how]
    # When the header is authenticated
    try:
        ident = auth.authenticate(world.plane, f"Bearer {token}")
        outcome = ident.role
    except Unauthorized:
        outcome = "401"
    # Then exactly one constant-time comparison of two SHA-256 digests decided it
    assert outcome == ("producer" if how == "known id, right secret" else "401")
    assert len(spy.calls) == 1
    a, b = spy.calls[0]
    assert isinstance(a, str) and isinstance(b, str)
    assert len(a) == len(b) == 64


# --- the pickle trust boundary: a worker runs only what the plane was given ---------------


def _honest() -> Callable[[Any], Any]:
    def add_one(x: Any) -> Any:
        return x + 1 if isinstance(x, int) else len(x)

    return add_one  # a closure: cloudpickle sends its body by value


def _evil(marker: Path) -> Callable[[Any], Any]:
    def add_one(x: Any) -> Any:
        marker.write_text("tampered code ran")
        return 666

    return add_one


def _tamper(plane_file: Path, digest: str, data: bytes) -> None:
    """Overwrite a stored blob's bytes behind the plane's back (its digest stays): a
    plane file keeps its blobs as files beside it."""
    blob = plane_file.with_name(plane_file.name + ".blobs") / digest
    assert blob.is_file(), f"no blob {digest}"
    blob.write_bytes(data)


def _payload_of(plane_file: Path, inv_id: str) -> dict[str, Any]:
    db = sqlite3.connect(plane_file)
    try:
        (payload,) = db.execute(
            "SELECT payload FROM invocations WHERE id = ?", (inv_id,)
        ).fetchone()
    finally:
        db.close()
    return wire.decode_payload(bytes(payload))


def _run_one(kind: str, dp: dls.Dispatch, queue: str, inv_id: str) -> None:
    """Let a worker of ``kind`` take the one invocation of ``queue`` and report it."""
    q = dls.SyncQueue(queue, dispatch=dp)
    if kind == "thread":
        dls.run_worker(q, once=True, poll=0.05)
        return
    w = ProcessWorker(dp, [queue], max_idle_wait=0.1)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    try:
        done = threading.Event()
        unwatch = dp.transport.watch([inv_id], lambda rec: done.set())
        try:
            assert done.wait(30), "the process worker did not finish the job"
        finally:
            unwatch()
    finally:
        w.request_stop()
        w.request_stop()
        thread.join(timeout=30)


def _assert_refused(q: dls.SyncQueue, inv_id: str, marker: Path, digest: str) -> None:
    assert not marker.exists(), "a worker ran code from a blob whose bytes do not match its digest"
    try:
        got = q.result(inv_id, timeout=10)
    except TimeoutError:
        pytest.fail("the worker never reported the tampered invocation")
    except Exception as exc:  # the remote error comes back as its own type
        message = str(exc)
    else:
        pytest.fail(f"a tampered invocation succeeded with {got!r}")
    # a clear error: it says what was wrong with the blob, or at least names it
    assert "digest" in message.lower() or digest[:12] in message, message


@pytest.mark.parametrize(
    ("kind", "transport"),
    [("thread", "embedded"), ("thread", "http"), ("process", "embedded")],
    ids=["run_worker on a plane file", "run_worker over HTTP", "process worker"],
)
def test_a_worker_refuses_a_function_body_that_does_not_match_its_digest(
    tmp_path: Path, kind: str, transport: str
) -> None:
    # Given an invocation whose function body travelled as a blob named by its sha256
    plane_file = tmp_path / "plane.db"
    marker = tmp_path / "tampered-code-ran"
    with dls.Dispatch(str(plane_file)) as producer:
        q = dls.SyncQueue("tamper", dispatch=producer)
        inv = q.submit(_honest(), 41)
        fn_digest = _payload_of(plane_file, inv)["fn"]
        # When someone with write access to the store swaps the body for other code
        _tamper(plane_file, fn_digest, cloudpickle.dumps(_evil(marker), protocol=5))
        if transport == "embedded":
            _run_one(kind, producer, "tamper", inv)
        else:
            plane = Plane(SqliteStore(plane_file))
            worker_token, _ = create_token(plane, "worker")
            plane.close()
            with (
                serve_in_thread(plane_file) as (url, _),
                dls.Dispatch(url, token=worker_token) as remote,
            ):
                _run_one(kind, remote, "tamper", inv)
        # Then the worker refuses it: the tampered code never runs, the call fails clearly
        _assert_refused(q, inv, marker, fn_digest)


@pytest.mark.parametrize(
    "kind",
    ["thread", "process"],
    ids=["run_worker", "process worker (its job process reads the blob itself)"],
)
def test_a_worker_refuses_arguments_that_do_not_match_their_digest(
    tmp_path: Path, kind: str
) -> None:
    # Given an invocation whose arguments are over the inline limit, so they travel as a
    # blob (args_ref) named by their sha256
    plane_file = tmp_path / "plane.db"
    marker = tmp_path / "tampered-code-ran"
    with dls.Dispatch(str(plane_file)) as dp:
        q = dls.SyncQueue("tamper", dispatch=dp)
        inv = q.submit(_honest(), b"x" * (300 * 1024))
        env = _payload_of(plane_file, inv)
        assert "args_ref" in env, "the arguments went inline; make them larger"
        # When the argument blob is swapped for arguments that call other code on load
        evil_args = cloudpickle.dumps(((_Detonator(marker),), {}), protocol=5)
        _tamper(plane_file, env["args_ref"], evil_args)
        _run_one(kind, dp, "tamper", inv)
        # Then the worker refuses them before unpickling
        _assert_refused(q, inv, marker, env["args_ref"])


class _Detonator:
    """Unpickling this writes ``marker``: the stand-in for code hidden in a blob."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "tampered code ran"))
