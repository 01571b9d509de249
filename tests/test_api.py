"""The HTTP API v1 through its Lambda handler: routes, auth, bad input.

Requests are real API Gateway v2 events (built by handlers/apigw.py, as ``lakeshore
serve`` builds them) resolved by the powertools router over an in-memory plane.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import msgpack
import pytest

from dreamlake.lakeshore.api import Limits, Service, bootstrap_admin
from dreamlake.lakeshore.errors import Unauthorized
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import make_app
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.plane.ids import group_ids, group_of
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.wire import encode_error, encode_result

MP = "application/msgpack"
JS = "application/json"


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]

    @property
    def code(self) -> str:
        return str(self.body["error"]["code"])


class Client:
    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self.token = token

    def raw(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        ctype: str = MP,
        accept: str | None = None,
        token: str | None = "",
        query: str = "",
    ) -> Answer:
        headers = {"content-type": ctype}
        if accept:
            headers["accept"] = accept
        tok = self.token if token == "" else token
        if tok:
            headers["authorization"] = f"Bearer {tok}"
        event = apigw.http_event(method, path, headers=headers, body=body, query_string=query)
        status, hdrs, data = apigw.http_response(self.app.resolve(event, None))
        h = {k.lower(): v for k, v in hdrs}
        media = h.get("content-type", "")
        if not data:
            parsed: Any = None
        elif media.startswith(MP):
            parsed = msgpack.unpackb(data)
        elif media.startswith(JS):
            parsed = json.loads(data)
        else:
            parsed = data
        return Answer(status, parsed, h)

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Answer:
        data = b"" if body is None else msgpack.packb(body, use_bin_type=True)
        return self.raw(method, path, data, **kw)

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> Answer:
        data = b"" if body is None else json.dumps(body).encode()
        return self.raw(method, path, data, ctype=JS, **kw)


@dataclass
class Api:
    plane: Plane
    service: Service
    admin: Client
    app: Any

    def client(self, role: str, queues: list[str] | None = None) -> Client:
        ans = self.admin.call("POST", "/v1/tokens", {"role": role, "queues": queues or ["*"]})
        assert ans.status == 200, ans.body
        return Client(self.app, ans.body["token"])


@pytest.fixture
def api() -> Iterator[Api]:
    plane = Plane(SqliteStore(":memory:"))
    service = Service(plane, limits=Limits(max_body=64 * 1024, inline_payload=8 * 1024))
    app = make_app(service)
    admin = bootstrap_admin(plane)
    assert admin is not None
    yield Api(plane, service, Client(app, admin), app)
    plane.close()


def submit_ref(client: Client, queue: str, *args: Any, **extra: Any) -> str:
    item = {"queue": queue, "ref": "math:sqrt", "args": list(args), **extra}
    ans = client.call("POST", "/v1/invocations", {"invocations": [item]})
    assert ans.status == 200, ans.body
    return str(ans.body["ids"][0])


# --- hello and the first admin token ------------------------------------------------


def test_hello_tells_the_caller_who_it_is(api: Api) -> None:
    ans = api.admin.call("GET", "/v1/hello")
    assert ans.status == 200
    assert ans.body["identity"]["role"] == "admin"
    assert ans.body["wire"] == [1]
    assert set(ans.body["limits"]) == {
        "max_body",
        "inline_payload",
        "max_batch",
        "max_wait",
        "max_wait_ids",
        "submit_blobs",
        "max_blob",
    }
    assert abs(ans.body["time"] - api.plane.now()) < 5


def test_bootstrap_makes_one_admin_token_only(api: Api) -> None:
    assert bootstrap_admin(api.plane) is None


def test_tokens_are_stored_hashed_and_never_listed(api: Api) -> None:
    ans = api.admin.call("POST", "/v1/tokens", {"role": "producer", "name": "ci"})
    secret = ans.body["token"]
    listed = api.admin.call("GET", "/v1/tokens").body["tokens"]
    assert all("token" not in t and "secret_hash" not in t for t in listed)
    stored = api.plane.store.get_token(ans.body["id"])
    assert stored is not None
    assert secret.split("_", 2)[2] not in repr(stored)
    assert stored.secret_hash == hashlib.sha256(secret.split("_", 2)[2].encode()).hexdigest()


# --- auth ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (None, "missing bearer token"),
        ("nope", "malformed bearer token"),
        ("lks_000000000000_wrong", "unknown or wrong token"),
    ],
)
def test_missing_or_wrong_tokens_are_401(api: Api, token: str | None, reason: str) -> None:
    ans = api.admin.call("GET", "/v1/hello", token=token)
    assert (ans.status, ans.code) == (401, "unauthorized")
    assert reason in ans.body["error"]["message"]


def test_a_revoked_token_is_401(api: Api) -> None:
    made = api.admin.call("POST", "/v1/tokens", {"role": "producer"}).body
    assert api.admin.call("DELETE", f"/v1/tokens/{made['id']}").body == {"revoked": True}
    ans = Client(api.app, made["token"]).call("GET", "/v1/hello")
    assert (ans.status, ans.body["error"]["message"]) == (401, "this token was revoked")


def test_a_token_used_then_revoked_is_401_at_once_and_a_wrong_secret_stays_401(
    api: Api,
) -> None:
    # Given a token that was just used (its caller is kept for the next requests)
    made = api.admin.call("POST", "/v1/tokens", {"role": "producer"}).body
    user = Client(api.app, made["token"])
    assert user.call("GET", "/v1/hello").status == 200
    # Then the same id with another secret is still refused
    forged = made["token"][:-1] + ("y" if made["token"][-1] != "y" else "z")
    assert Client(api.app, forged).call("GET", "/v1/hello").status == 401
    # And once revoked through this process it is refused at once
    assert api.admin.call("DELETE", f"/v1/tokens/{made['id']}").body == {"revoked": True}
    ans = user.call("GET", "/v1/hello")
    assert (ans.status, ans.body["error"]["message"]) == (401, "this token was revoked")


def test_a_token_revoked_by_another_process_is_401_once_its_record_is_read_again(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dreamlake.lakeshore.api import auth

    # Given a token in use, its record and its caller kept for a second (auth's clock
    # is the test's)
    now = [1000.0]
    monkeypatch.setattr(auth, "time", SimpleNamespace(monotonic=lambda: now[0]))
    made = api.admin.call("POST", "/v1/tokens", {"role": "producer"}).body
    user = Client(api.app, made["token"])
    assert user.call("GET", "/v1/hello").status == 200
    # When another process revokes it in the store (this one is not told)
    rec = api.plane.store.get_token(made["id"])
    assert rec is not None
    rec.revoked_at = api.plane.now()
    api.plane.store.put_token(rec)
    # Then it is still accepted while the record read is kept, and refused once the
    # record is read again: the caller kept with it goes too
    now[0] += auth.TOKEN_CACHE_SECONDS / 2
    assert user.call("GET", "/v1/hello").status == 200
    now[0] += auth.TOKEN_CACHE_SECONDS / 2 + 0.01
    ans = user.call("GET", "/v1/hello")
    assert (ans.status, ans.body["error"]["message"]) == (401, "this token was revoked")


def test_a_token_record_read_as_the_token_is_revoked_here_is_not_kept(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dreamlake.lakeshore.api import auth

    made = api.admin.call("POST", "/v1/tokens", {"role": "producer"}).body
    header = f"Bearer {made['token']}"
    real = api.plane.store.get_token
    reading, go = threading.Event(), threading.Event()

    def held(token_id: str) -> Any:
        record = real(token_id)
        if token_id == made["id"] and not reading.is_set():
            reading.set()
            assert go.wait(10)
        return record

    monkeypatch.setattr(api.plane.store, "get_token", held)
    # Given a check of the token whose read of its record is out (held until told)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(auth.authenticate, api.plane, header)
        assert reading.wait(10)
        # When the token is revoked through this process meanwhile, then the read returns
        assert auth.revoke(api.plane, made["id"])
        go.set()
        first.result(timeout=10)  # (it read the record before the revocation)
    # Then the next check does not use the record read before the revocation
    with pytest.raises(Unauthorized, match="revoked"):
        auth.authenticate(api.plane, header)


def test_a_producer_cannot_claim_and_a_worker_cannot_submit(api: Api) -> None:
    producer, worker = api.client("producer"), api.client("worker")
    claim = producer.call("POST", "/v1/claims", {"queues": ["q"], "worker": "w"})
    assert (claim.status, claim.code) == (403, "forbidden")
    sub = worker.call("POST", "/v1/invocations", {"invocations": [{"queue": "q", "ref": "m:f"}]})
    assert (sub.status, sub.code) == (403, "forbidden")


def test_scopes_keep_teams_apart(api: Api) -> None:
    team_a = api.client("producer", ["a-*"])
    team_b = api.client("producer", ["b-*"])
    worker_b = api.client("worker", ["b-*"])
    inv = submit_ref(team_a, "a-jobs", 4.0)
    # Team B can neither read team A's invocation nor claim team A's work
    assert team_b.call("GET", f"/v1/invocations/{inv}").status == 403
    assert team_b.call("POST", "/v1/invocations/wait", {"ids": [inv]}).status == 403
    assert team_b.call("POST", f"/v1/invocations/{inv}/cancel").status == 403
    assert worker_b.call("POST", "/v1/claims", {"queues": ["a-jobs"], "worker": "w"}).status == 403
    # And listing queues shows each team its own
    submit_ref(team_b, "b-jobs", 9.0)
    names = [q["name"] for q in team_b.call("GET", "/v1/queues").body["queues"]]
    assert names == ["b-jobs"]


def test_only_admin_manages_tokens_and_daemons(api: Api) -> None:
    producer = api.client("producer")
    assert producer.call("POST", "/v1/tokens", {"role": "admin"}).status == 403
    assert producer.call("GET", "/v1/tokens").status == 403
    assert producer.call("POST", "/v1/queues/prune", {"older_than": 1}).status == 403


# --- the flow ------------------------------------------------------------------------------


def test_curl_producer_submits_a_ref_call_as_json_and_reads_its_value(api: Api) -> None:
    producer, worker = api.client("producer"), api.client("worker")
    # Given a JSON submit of a ref call, as curl sends it
    ans = producer.json(
        "POST",
        "/v1/invocations",
        {"invocations": [{"queue": "tools", "ref": "math:sqrt", "args": [16]}]},
    )
    assert ans.status == 200
    (inv,) = ans.body["ids"]
    # When a worker claims it and completes it with a msgpack result
    (claim,) = worker.call("POST", "/v1/claims", {"queues": ["tools"], "worker": "w"}).body[
        "claims"
    ]
    assert claim["id"] == inv
    done = worker.call(
        "POST",
        "/v1/completions",
        {
            "results": [
                {
                    "id": inv,
                    "lease_token": claim["lease_token"],
                    "result": encode_result(4.0, prefer_msgpack=True)[0],
                }
            ]
        },
    )
    assert done.body["answers"] == [{"id": inv, "ok": True, "error": None}]
    # Then curl reads the plain value in JSON
    view = producer.json("GET", f"/v1/invocations/{inv}").body["invocation"]
    assert (view["state"], view["value"]) == ("succeeded", 4.0)
    assert isinstance(view["result"], str)  # base64 in JSON


def test_priority_queues_take_priority_from_ref_kwargs(api: Api) -> None:
    producer, worker = api.client("producer"), api.client("worker")
    producer.call(
        "POST", "/v1/queues", {"name": "urgent", "kind": "priority", "priority_field": "p"}
    )
    low = producer.call(
        "POST",
        "/v1/invocations",
        {"invocations": [{"queue": "urgent", "ref": "m:f", "kwargs": {"p": 1}}]},
    )
    high = producer.call(
        "POST",
        "/v1/invocations",
        {"invocations": [{"queue": "urgent", "ref": "m:f", "kwargs": {"p": 5}}]},
    )
    claims = worker.call(
        "POST", "/v1/claims", {"queues": ["urgent"], "worker": "w", "limit": 2}
    ).body["claims"]
    assert [c["id"] for c in claims] == [high.body["ids"][0], low.body["ids"][0]]


def test_wait_returns_finished_views_and_times_out_empty(api: Api) -> None:
    producer, worker = api.client("producer"), api.client("worker")
    a, b = submit_ref(producer, "q", 1.0), submit_ref(producer, "q", 4.0)
    first = producer.call("POST", "/v1/invocations/wait", {"ids": [a, b], "timeout": 0.05}).body
    assert first["invocations"] == [] and isinstance(first["cursor"], float)
    (claim,) = worker.call("POST", "/v1/claims", {"queues": ["q"], "worker": "w"}).body["claims"]
    worker.call(
        "POST",
        "/v1/completions",
        {
            "results": [
                {
                    "id": claim["id"],
                    "lease_token": claim["lease_token"],
                    "result": encode_result(1.0)[0],
                }
            ]
        },
    )
    views = producer.call("POST", "/v1/invocations/wait", {"ids": [a, b], "timeout": 1}).body[
        "invocations"
    ]
    assert [v["id"] for v in views] == [a]
    # With the first answer's cursor the plane looks only at what finished since: a
    # finished after it, so it is there; with a cursor after a's finish, it is not.
    since = {"ids": [a, b], "timeout": 0.05, "since": first["cursor"]}
    assert [
        v["id"] for v in producer.call("POST", "/v1/invocations/wait", since).body["invocations"]
    ] == [a]
    later = {**since, "since": first["cursor"] + 3600}
    assert producer.call("POST", "/v1/invocations/wait", later).body["invocations"] == []


@pytest.mark.parametrize(
    "result",
    [
        b"\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"v": 99}),
        msgpack.packb({"v": 1, "kind": "?"}),
        msgpack.packb({"v": 1, "kind": [1]}),
        msgpack.packb({"v": 1, "kind": "msgpack", "data": {1: "int key"}}),
        msgpack.packb({"v": 1, "kind": "pickle", "data": "not bytes"}),
        msgpack.packb({"v": 1, "kind": "blob", "digest": "not a digest"}),
        msgpack.packb({"v": 1, "kind": "blob", "digest": "0" * 64}),
        msgpack.packb({"v": 1, "kind": "msgpack"}),
        msgpack.packb({"v": 1, "kind": "data"}),
        msgpack.packb({"v": 1, "kind": "data", "value": "s3://b/k", "keys": [1]}),
    ],
    ids=[
        "not msgpack",
        "not a map",
        "unknown version",
        "unknown kind",
        "kind not a string",
        "int map key",
        "pickle not bytes",
        "blob not a digest",
        "blob not on the plane",
        "msgpack without data",
        "data without value",
        "data key not a string",
    ],
)
def test_a_result_no_reader_could_decode_is_refused_on_its_own(api: Api, result: bytes) -> None:
    # Given two running invocations
    producer, worker = api.client("producer"), api.client("worker")
    ids = [submit_ref(producer, "q", 1.0) for _ in range(2)]
    claims = worker.call("POST", "/v1/claims", {"queues": ["q"], "worker": "w", "limit": 2})
    good, bad = claims.body["claims"]
    # When a completion carries a good result and one no reader could decode
    items = [
        {"id": good["id"], "lease_token": good["lease_token"], "result": encode_result(2)[0]},
        {"id": bad["id"], "lease_token": bad["lease_token"], "result": result},
    ]
    answer = worker.call("POST", "/v1/completions", {"results": items})
    # Then the good one is recorded and the other refused, with the reason, and not written
    assert answer.status == 200, answer.body
    first, second = answer.body["answers"]
    assert first == {"id": good["id"], "ok": True, "error": None}
    assert (second["ok"], second["error"]["code"]) == (False, "invalid_request")
    assert "result envelope" in second["error"]["message"]
    waited = producer.call("POST", "/v1/invocations/wait", {"ids": ids, "timeout": 0})
    assert waited.status == 200
    assert [v["id"] for v in waited.body["invocations"]] == [good["id"]]
    # and the refused one, still running, takes a result envelope after
    items[1]["result"] = encode_result(3)[0]
    again = worker.call("POST", "/v1/completions", {"results": items[1:]})
    assert again.body["answers"] == [{"id": bad["id"], "ok": True, "error": None}]
    waited = producer.call("POST", "/v1/invocations/wait", {"ids": ids, "timeout": 0})
    assert sorted(v["state"] for v in waited.body["invocations"]) == ["succeeded"] * 2


def test_failures_heartbeats_and_stale_leases_answer_per_item(api: Api) -> None:
    producer, worker = api.client("producer"), api.client("worker")
    inv = submit_ref(producer, "q", 1.0)
    (claim,) = worker.call("POST", "/v1/claims", {"queues": ["q"], "worker": "w"}).body["claims"]
    beat = worker.call(
        "POST", "/v1/heartbeats", {"leases": [{"id": inv, "lease_token": claim["lease_token"]}]}
    )
    assert beat.body["answers"][0]["ok"] is True
    stale = worker.call(
        "POST",
        "/v1/completions",
        {"results": [{"id": inv, "lease_token": "stale", "result": encode_result(1)[0]}]},
    )
    assert stale.status == 200
    assert stale.body["answers"][0]["error"]["code"] == "lease_lost"
    # (the lease is live: the reason does not say it ran out, but names both causes)
    assert "or the token is wrong" in stale.body["answers"][0]["error"]["message"]
    err = encode_error(ValueError("boom"))
    failed = worker.call(
        "POST",
        "/v1/failures",
        {"failures": [{"id": inv, "lease_token": claim["lease_token"], "error": err}]},
    )
    assert failed.body["answers"] == [{"id": inv, "ok": True, "state": "failed", "error": None}]
    view = producer.call("GET", f"/v1/invocations/{inv}").body["invocation"]
    assert view["error"]["message"] == "boom"


def test_a_replayed_submit_is_idempotent_and_another_body_is_409(api: Api) -> None:
    producer = api.client("producer")
    first = submit_ref(producer, "q", 1.0, id="job-1")
    assert submit_ref(producer, "q", 1.0, id="job-1") == first
    ans = producer.call(
        "POST",
        "/v1/invocations",
        {"invocations": [{"id": "job-1", "queue": "q", "ref": "math:sqrt", "args": [2.0]}]},
    )
    assert (ans.status, ans.code) == (409, "idempotency_conflict")


def test_a_submit_of_many_without_ids_gets_grouped_ids_per_queue(api: Api) -> None:
    # Given a request of 20 items for "a" and 3 for "b", interleaved, and one with an id
    producer = api.client("producer")
    items = [{"queue": "a", "ref": "math:sqrt", "args": [float(i)]} for i in range(20)]
    for n in range(3):
        items.insert(2 * n + 1, {"queue": "b", "ref": "math:sqrt", "args": [float(n)]})
    items.append({"id": "job-1", "queue": "a", "ref": "math:sqrt", "args": [1.0]})
    # When it is submitted
    ans = producer.call("POST", "/v1/invocations", {"invocations": items})
    assert ans.status == 200, ans.body
    ids = ans.body["ids"]
    # Then each queue's ids take the ids of a group in order, 16 to a group
    a = [i for i, item in zip(ids, items, strict=True) if item["queue"] == "a"][:-1]
    b = [i for i, item in zip(ids, items, strict=True) if item["queue"] == "b"]
    assert a == group_ids(group_of(a[0]), 16) + group_ids(group_of(a[16]), 4)
    assert b == group_ids(group_of(b[0]), 3)
    assert len({group_of(a[0]), group_of(a[16]), group_of(b[0])}) == 3
    # And the given id is kept, and the plane has each one
    assert ids[-1] == "job-1"
    assert {r.id for r in api.plane.get_many(ids)} == set(ids)


def test_a_submit_of_one_without_an_id_gets_a_plain_id(api: Api) -> None:
    inv_id = submit_ref(api.client("producer"), "q", 4.0)
    assert group_of(inv_id) == inv_id and len(inv_id) == 26


def test_listing_invocations_pages_by_cursor(api: Api) -> None:
    producer = api.client("producer")
    ids = sorted(submit_ref(producer, "q", float(i), id=f"job-{i:02d}") for i in range(5))
    page1 = producer.call("GET", "/v1/invocations", query="queue=q&limit=3").body
    page2 = producer.call(
        "GET", "/v1/invocations", query=f"queue=q&limit=3&cursor={page1['next']}"
    ).body
    assert [v["id"] for v in page1["invocations"] + page2["invocations"]] == ids
    assert page2["next"] is None
    pending = producer.call("GET", "/v1/invocations", query="queue=q&state=pending").body
    assert len(pending["invocations"]) == 5
    # a cursor that is no invocation id (a page's next) is refused, with why
    bad = producer.call("GET", "/v1/invocations", query="queue=q&cursor=%2Fnot%3Fan%23id")
    assert bad.status == 400 and "cursor must be an invocation id" in bad.body["error"]["message"]


def test_blobs_move_by_signed_url_without_a_token(api: Api) -> None:
    producer = api.client("producer")
    data = b"x" * 20_000
    digest = hashlib.sha256(data).hexdigest()
    ans = producer.call("POST", "/v1/blobs/missing", {"digests": [digest]})
    assert ans.body["missing"] == [digest]
    url = urlsplit(ans.body["upload"][digest])
    put = producer.raw(
        "PUT", url.path, data, ctype="application/octet-stream", token=None, query=url.query
    )
    assert put.status == 204
    assert producer.call("POST", "/v1/blobs/missing", {"digests": [digest]}).body["missing"] == []
    got = producer.raw("GET", f"/v1/blobs/{digest}")
    assert got.body == data
    tampered = producer.raw(
        "GET", f"/v1/blobs/{digest}", token=None, query=url.query.replace("sig=", "sig=0")
    )
    assert tampered.status == 401
    wrong = producer.raw("PUT", f"/v1/blobs/{'0' * 64}", data, ctype="application/octet-stream")
    assert (wrong.status, wrong.code) == (400, "invalid_request")


@pytest.mark.parametrize(
    "digest", ["z" * 64, "A" * 64, "0" * 63, 64], ids=["not hex", "upper case", "short", "number"]
)
def test_asking_which_blobs_are_missing_takes_only_blob_names(api: Api, digest: Any) -> None:
    # the names a submit's blobs and a PUT accept, no others: no upload URL for a name
    # that no PUT could use
    ans = api.client("producer").call("POST", "/v1/blobs/missing", {"digests": [digest]})
    assert (ans.status, ans.code) == (400, "invalid_request")


def test_daemons_register_keep_identity_and_take_updates(api: Api) -> None:
    worker = api.client("worker")
    first = worker.call(
        "POST",
        "/v1/daemons",
        {
            "name": "gpu-1",
            "queues": ["a"],
            "concurrency": 2,
            "python": "3.11",
            "pickle_protocols": [5],
        },
    ).body["daemon"]
    api.admin.call(
        "PATCH",
        f"/v1/daemons/{first['id']}",
        {"add_queues": ["b"], "remove_queues": ["a"], "concurrency": 4},
    )
    again = worker.call(
        "POST", "/v1/daemons", {"id": first["id"], "name": "gpu-1", "queues": ["a"]}
    ).body["daemon"]
    assert (again["queues"], again["concurrency"]) == (["b"], 4)
    api.admin.call("POST", f"/v1/daemons/{first['id']}/drain")
    beat = worker.call("POST", f"/v1/daemons/{first['id']}/heartbeat", {"running": 1}).body[
        "daemon"
    ]
    assert beat["draining"] is True
    hello = worker.call("GET", "/v1/hello").body
    assert hello["workers"] == {"python": ["3.11"], "pickle_protocols": [5]}


def test_a_daemon_s_last_heartbeat_marks_it_stopped_until_it_beats_or_registers_again(
    api: Api,
) -> None:
    worker = api.client("worker")
    body = {"name": "gpu-2", "queues": ["a"], "python": "3.12", "pickle_protocols": [5]}
    rec = worker.call("POST", "/v1/daemons", body).body["daemon"]
    path = f"/v1/daemons/{rec['id']}/heartbeat"
    assert worker.call("POST", path, {"running": 2}).body["daemon"]["stopped_at"] is None
    # When its last heartbeat says it is exiting (after a drain, say)
    api.admin.call("POST", f"/v1/daemons/{rec['id']}/drain")
    last = worker.call("POST", path, {"running": 0, "stopped": True}).body["daemon"]
    # Then its record says when it stopped, and it no longer counts as a live worker
    assert last["stopped_at"] == pytest.approx(last["last_heartbeat"])
    assert (last["running"], last["draining"]) == (0, True)
    (listed,) = [
        d for d in api.admin.call("GET", "/v1/daemons").body["daemons"] if d["id"] == rec["id"]
    ]
    assert listed["stopped_at"] == last["stopped_at"]
    assert "3.12" not in worker.call("GET", "/v1/hello").body["workers"]["python"]
    # When it starts again, the mark is gone (and so is the drain)
    again = worker.call("POST", "/v1/daemons", {**body, "id": rec["id"]}).body["daemon"]
    assert (again["stopped_at"], again["draining"]) == (None, False)
    worker.call("POST", path, {"stopped": True})
    assert worker.call("POST", path, {}).body["daemon"]["stopped_at"] is None  # alive again
    # a stopped heartbeat for a record removed meanwhile finds none, and makes none
    api.admin.call("DELETE", f"/v1/daemons/{rec['id']}")
    gone = worker.call("POST", path, {"running": 0, "stopped": True})
    assert gone.status == 404
    assert all(d["id"] != rec["id"] for d in api.admin.call("GET", "/v1/daemons").body["daemons"])
    refused = worker.call("POST", path, {"stopped": "yes"})
    assert refused.status == 400 and "stopped" in refused.body["error"]["message"]


# --- bad input: a 4xx with a reason, nothing stored changes ---------------------------------


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_BODIES = [
    (b"\xc1\xc1", MP, "malformed body: not valid msgpack"),  # (msgpack says nothing)
    (b"\x93\x01", MP, "malformed body: not valid msgpack, or cut short"),  # (a cut array)
    (b"{not json", JS, "malformed body"),
    ('{"invocations": "\xe9"}'.encode("latin-1"), JS, "JSON text must be UTF-8 (byte 0xe9 at"),
    (b"\xff\xfe{", JS, "not UTF-16-LE text"),
    (msgpack.packb([1, 2]), MP, "body must be a map"),
    (msgpack.packb({"invocations": "nope"}), MP, "must be list"),
    (
        msgpack.packb({"invocations": [{"queue": "q", "ref": "m:f"}], "extra": 1}),
        MP,
        "unknown field",
    ),
    (msgpack.packb({"invocations": [{"queue": "q"}]}), MP, "exactly one of payload, ref, exec"),
    (msgpack.packb({"invocations": [{"queue": "q", "payload": b"junk"}]}), MP, "malformed msgpack"),
    (msgpack.packb({"invocations": [{"queue": "bad name!", "ref": "m:f"}]}), MP, "queue name"),
    (msgpack.packb({"invocations": [{"queue": "q", "ref": "nocolon"}]}), MP, "module:function"),
    (
        msgpack.packb({"invocations": [{"queue": "q", "ref": "m:f", "priority": True}]}),
        MP,
        "wrong type",
    ),
    (msgpack.packb({"invocations": []}), MP, "1 to"),
    (b"x" * 70_000, MP, "over the"),
    (b"<xml/>", "text/xml", "content type"),
    (json.dumps({"a": _nested(40)}).encode(), JS, "nests"),
    (msgpack.packb({"a": _nested(40)}), MP, "nests"),
    (msgpack.packb({"invocations": [{"queue": "q", "ref": "m:f", "priority": 2**63}]}), MP, "64"),
    (
        msgpack.packb({"invocations": [{"queue": "q", "ref": "m:f", "delay": float("nan")}]}),
        MP,
        "finite",
    ),
    (msgpack.packb({"invocations": [{"queue": "q", b"k": 2}]}), MP, "map keys must be strings"),
    (b"\x81\xa1a\xa3\xed\xa0\x80", MP, "a string is not UTF-8"),  # a lone surrogate's UTF-8
    (b'{"a": "\\ud800"}', JS, "Unicode"),
]


@pytest.mark.parametrize(("body", "ctype", "reason"), BAD_BODIES)
def test_bad_bodies_are_4xx_with_a_reason_and_change_nothing(
    api: Api, body: bytes, ctype: str, reason: str
) -> None:
    producer = api.client("producer")
    ans = producer.raw("POST", "/v1/invocations", body, ctype=ctype)
    assert 400 <= ans.status < 500, ans.body
    assert reason in ans.body["error"]["message"]
    assert "\n" not in ans.body["error"]["message"]
    assert api.plane.store.list_queues() == []


def test_an_over_long_name_is_not_echoed_back_whole(api: Api) -> None:
    # a 5,000-character id that names nothing: the 404 says so in one short line
    ans = api.admin.call("GET", "/v1/invocations/" + "x" * 5000)
    assert ans.code == "unknown_invocation"
    message = ans.body["error"]["message"]
    assert message.startswith("no invocation 'xxx") and "…' (5,000 characters)" in message
    assert len(message) < 200
    # a queue name far past its limit, in a submit's body
    producer = api.client("producer")
    ans = producer.call(
        "POST", "/v1/invocations", {"invocations": [{"queue": "q" * 3000, "ref": "m:f"}]}
    )
    assert ans.code == "invalid_request"
    assert "…' (3,000 characters) must be 1-256 letters" in ans.body["error"]["message"]
    assert len(ans.body["error"]["message"]) < 300
    # and a refused item of a batch answer (a hand-back under a lease that is no one's)
    worker = api.client("worker")
    ans = worker.call("POST", "/v1/releases", {"leases": [{"id": "c" * 4000, "lease_token": "t"}]})
    assert ans.status == 200, ans.body
    (item,) = ans.body["answers"]
    message = item["error"]["message"]
    assert "…' (4,000 characters)" in message and len(message) < 300, message
    # and a submit's id far past its limit
    ans = producer.call(
        "POST", "/v1/invocations", {"invocations": [{"queue": "q", "id": "i" * 300, "ref": "m:f"}]}
    )
    assert ans.code == "invalid_request"
    assert "'iii" in ans.body["error"]["message"]
    assert "…' (300 characters)" in ans.body["error"]["message"]
    # and one of valid characters with spaces, which the reason does not cut at
    spaced = ("i" * 99 + " ") * 200
    ans = producer.call(
        "POST", "/v1/invocations", {"invocations": [{"queue": "q", "id": spaced, "ref": "m:f"}]}
    )
    assert ans.code == "invalid_request"
    assert "…' (20,000 characters)" in ans.body["error"]["message"]
    assert len(ans.body["error"]["message"]) < 300
    # a name as long as a valid one may be is said whole
    ans = producer.call("GET", "/v1/queues/" + "q" * 256)
    assert ans.code == "queue_not_found" and "q" * 256 in ans.body["error"]["message"]


def test_unknown_routes_and_methods(api: Api) -> None:
    assert api.admin.call("GET", "/v1/nothing").status == 404
    assert api.admin.call("GET", "/v2/hello").status == 404
    ans = api.admin.call("DELETE", "/v1/hello")
    assert (ans.status, ans.code) == (405, "method_not_allowed")
    assert api.admin.call("PUT", "/v1/invocations/x").status == 405


def test_answers_follow_accept(api: Api) -> None:
    ans = api.admin.raw("GET", "/v1/hello", ctype=MP, accept=JS)
    assert ans.headers["content-type"].startswith(JS)
    ans = api.admin.raw("GET", "/v1/hello", ctype=JS, accept=MP)
    assert ans.headers["content-type"].startswith(MP)


def test_output_progress_release_and_retry_over_the_api(api: Api) -> None:
    producer, worker = api.client("producer"), api.client("worker")
    inv = submit_ref(producer, "q", 1.0)
    (claim,) = worker.call("POST", "/v1/claims", {"queues": ["q"], "worker": "w"}).body["claims"]
    lease = {"id": inv, "lease_token": claim["lease_token"]}
    # A worker streams output and progress
    chunks = [[1, "stdout", "hello\n"], [2, "stderr", "warn\n"]]
    assert worker.call("POST", "/v1/logs", {**lease, "chunks": chunks}).body == {"ok": True}
    assert (
        worker.call("POST", "/v1/progress", {**lease, "fraction": 0.5, "message": "half"}).status
        == 200
    )
    logs = producer.call("GET", f"/v1/invocations/{inv}/logs").body
    assert [(e["stream"], e["text"]) for e in logs["entries"]] == [
        ("stdout", "hello\n"),
        ("stderr", "warn\n"),
    ]
    assert logs["state"] == "running"
    later = producer.call("GET", f"/v1/invocations/{inv}/logs", query=f"after={logs['next']}").body
    assert later["entries"] == []
    # Hands it back untried, then a second claim fails it, and a retry runs it again
    assert worker.call("POST", "/v1/releases", {"leases": [lease]}).body["answers"][0]["ok"]
    (again,) = worker.call("POST", "/v1/claims", {"queues": ["q"], "worker": "w"}).body["claims"]
    assert again["attempt"] == 1
    err = encode_error(RuntimeError("no"))
    worker.call(
        "POST",
        "/v1/failures",
        {"failures": [{"id": inv, "lease_token": again["lease_token"], "error": err}]},
    )
    retried = producer.call("POST", f"/v1/invocations/{inv}/retry").body["invocation"]
    assert retried["state"] == "pending"
    assert producer.call("POST", f"/v1/invocations/{inv}/retry").status == 409
    bad = worker.call("POST", "/v1/logs", {**lease, "chunks": [["x"]]})
    assert (bad.status, bad.code) == (400, "invalid_request")
