"""A submit that carries the blobs its invocations name (``blobs``): one request instead
of a question about them, an upload of each and the submit.

The API checks each carried blob against its digest and stores them before the
invocations; bad input is a 4xx that stores nothing. The HTTP client carries what fits
in one body on a plane that says it takes blobs there (hello's ``submit_blobs``) and
uploads the rest first, as before. It sends that body in parts, each large blob as it
is, never copied into one buffer with the rest.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
from openapi_schema_validator import OAS31Validator
from support import role_token, threads_of

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import wire
from dreamlake.lakeshore.api import Limits, Service, bootstrap_admin
from dreamlake.lakeshore.api.auth import Identity
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import make_app
from dreamlake.lakeshore.http import HttpTransport
from dreamlake.lakeshore.http import Limits as ClientLimits
from dreamlake.lakeshore.http.connections import Target, new_connection, request_once
from dreamlake.lakeshore.http.limits import carried, carrying_body
from dreamlake.lakeshore.plane import Plane, QueueSpec
from dreamlake.lakeshore.server import LocalServer
from dreamlake.lakeshore.stores import SqliteStore

MP = "application/msgpack"
SPEC = Path(__file__).resolve().parent.parent / "infra" / "openapi.yaml"
MAX_BODY = 64 * 1024


def _size(data: bytes) -> int:
    return len(data)


def _call(data: bytes) -> wire.EncodedCall:
    """A pickled call whose arguments travel as a blob (over a 1 KiB inline limit)."""
    return wire.encode_pickle_call(_size, (data,), {}, inline_limit=1024)


# --- the API -------------------------------------------------------------------------------


@dataclasses.dataclass
class Api:
    plane: Plane
    app: Any
    token: str

    def send(self, body: bytes, media: str = MP) -> tuple[int, Any]:
        headers = {"content-type": media, "authorization": f"Bearer {self.token}"}
        event = apigw.http_event("POST", "/v1/invocations", headers=headers, body=body)
        status, _, data = apigw.http_response(self.app.resolve(event, None))
        return status, (msgpack.unpackb(data) if media == MP else json.loads(data))

    def submit(self, body: dict[str, Any]) -> tuple[int, Any]:
        return self.send(msgpack.packb(body, use_bin_type=True))


@pytest.fixture
def api() -> Iterator[Api]:
    """An in-memory plane behind the Lambda handler's router (base64 bodies, as API
    Gateway sends them), with a 64 KiB body limit and a producer token."""
    plane = Plane(SqliteStore(":memory:"))
    app = make_app(Service(plane, limits=Limits(max_body=MAX_BODY, inline_payload=8 * 1024)))
    admin = bootstrap_admin(plane)
    assert admin is not None
    headers = {"content-type": MP, "authorization": f"Bearer {admin}"}
    raw = msgpack.packb({"role": "producer"})
    event = apigw.http_event("POST", "/v1/tokens", headers=headers, body=raw)
    _, _, data = apigw.http_response(app.resolve(event, None))
    yield Api(plane, app, msgpack.unpackb(data)["token"])
    plane.close()


def test_a_submit_stores_the_blobs_it_carries_then_its_invocation(api: Api) -> None:
    # Given a call whose function body and arguments are blobs the plane does not have
    call = _call(b"x" * 20_000)
    assert api.plane.missing_blobs(call.blobs) == set(call.blobs)
    # When it is submitted with its blobs in the same request
    item = {"id": "carried-1", "queue": "jobs", "payload": call.payload}
    status, body = api.submit({"invocations": [item], "blobs": call.blobs})
    # Then the plane has the blobs, as they were, and the invocation naming them
    assert (status, body) == (200, {"ids": ["carried-1"]})
    assert api.plane.missing_blobs(call.blobs) == set()
    for digest, data in call.blobs.items():
        assert api.plane.get_blob(digest) == data
    [claim] = api.plane.claim(["jobs"], "w1")
    assert (claim.id, claim.payload) == ("carried-1", call.payload)


def test_a_json_submit_may_carry_blobs_in_base64(api: Api) -> None:
    data = b"\x00\xff json blob"
    digest = hashlib.sha256(data).hexdigest()
    body = {
        "invocations": [{"queue": "jobs", "ref": "math:sqrt", "args": [4]}],
        "blobs": {digest: base64.b64encode(data).decode()},
    }
    status, _ = api.send(json.dumps(body).encode(), "application/json")
    assert status == 200
    assert api.plane.get_blob(digest) == data


def test_a_carried_blob_that_does_not_match_its_digest_stores_nothing(api: Api) -> None:
    # Given two carried blobs, the second with bytes that are not its digest's
    good, bad = b"good bytes", b"bad bytes"
    d_good, d_bad = hashlib.sha256(good).hexdigest(), hashlib.sha256(b"other").hexdigest()
    item = {"id": "refused-1", "queue": "jobs", "ref": "math:sqrt", "args": [4]}
    # When they are submitted
    status, body = api.submit({"invocations": [item], "blobs": {d_good: good, d_bad: bad}})
    # Then the submit is refused with a one-line reason naming the blob
    assert status == 400 and body["error"]["code"] == "invalid_request"
    assert d_bad[:12] in body["error"]["message"] and "\n" not in body["error"]["message"]
    # and nothing was stored: no blob, no invocation, no queue
    assert api.plane.missing_blobs([d_good, d_bad]) == {d_good, d_bad}
    assert api.plane.list_queues() == []


@pytest.mark.parametrize(
    ("blobs", "reason"),
    [
        ([b"bytes"], "blobs must be"),
        ({"abc": b"bytes"}, "sha256"),
        ({"A" * 64: b"bytes"}, "sha256"),
        ({"a" * 64: 5}, "must be bytes"),
        ({"a" * 64: "not base64!"}, "must be bytes"),
        ({f"{i:064x}": b"" for i in range(501)}, "at most 500"),
    ],
    ids=["a list", "a short name", "upper-case hex", "a number", "bad base64", "too many"],
)
def test_malformed_blobs_are_a_400_and_store_nothing(api: Api, blobs: Any, reason: str) -> None:
    item = {"queue": "jobs", "ref": "math:sqrt", "args": [4]}
    status, body = api.submit({"invocations": [item], "blobs": blobs})
    assert status == 400, body
    assert reason in body["error"]["message"]
    assert api.plane.list_queues() == []


def test_a_body_over_the_limit_is_a_413_and_stores_nothing(api: Api) -> None:
    data = b"x" * (MAX_BODY + 1)
    digest = hashlib.sha256(data).hexdigest()
    item = {"queue": "jobs", "ref": "math:sqrt", "args": [4]}
    status, body = api.submit({"invocations": [item], "blobs": {digest: data}})
    assert status == 413 and body["error"]["code"] == "payload_too_large"
    assert api.plane.missing_blobs([digest]) == {digest}
    assert api.plane.list_queues() == []


def test_hello_says_how_many_bytes_of_blobs_a_submit_may_carry(api: Api) -> None:
    headers = {"authorization": f"Bearer {api.token}"}
    event = apigw.http_event("GET", "/v1/hello", headers=headers)
    _, _, data = apigw.http_response(api.app.resolve(event, None))
    limits = json.loads(data)["limits"]
    assert limits["submit_blobs"] == limits["max_body"] == MAX_BODY


def test_the_document_describes_the_blobs_of_a_submit() -> None:
    spec = yaml.safe_load(SPEC.read_text())
    schema = {"$ref": "#/components/schemas/SubmitRequest", "components": spec["components"]}
    validator = OAS31Validator(schema)
    digest = hashlib.sha256(b"bytes").hexdigest()
    item = {"queue": "jobs", "payload": base64.b64encode(b"p").decode()}
    good = {"invocations": [item], "blobs": {digest: base64.b64encode(b"bytes").decode()}}
    assert list(validator.iter_errors(good)) == []
    assert list(validator.iter_errors({**good, "blobs": {"abc": "Ynl0ZXM="}})) != []


# --- the client --------------------------------------------------------------------------------


def test_carried_takes_the_blobs_that_fit_in_order() -> None:
    limits = ClientLimits(max_body=10_000, submit_blobs=6_000)
    blobs = {"a": b"1" * 3_000, "b": b"2" * 4_000, "c": b"3" * 2_000}
    # a and c fit within submit_blobs (b would pass it after a)
    assert list(carried(100, blobs, limits)) == ["a", "c"]
    # with large items, only what still fits in the body goes
    assert list(carried(6_500, blobs, limits)) == ["c"]
    # a plane that takes no blobs in a submit gets none
    assert carried(100, blobs, ClientLimits(max_body=10_000)) == {}


@pytest.mark.parametrize(
    "sizes",
    [[], [0], [10, 70_000, 1 << 20], list(range(20))],
    ids=["none", "an empty blob", "bin 8, 16 and 32", "a map of more than 15"],
)
def test_a_carrying_body_in_parts_is_the_msgpack_of_the_whole(sizes: list[int]) -> None:
    items = [{"id": f"i{n}", "queue": "q", "payload": b"p" * 300, "delay": 0.0} for n in range(3)]
    blobs = {f"{n:064x}": os.urandom(size) for n, size in enumerate(sizes)}
    parts = carrying_body(items, blobs)
    assert b"".join(parts) == msgpack.packb({"invocations": items, "blobs": blobs})
    # and each blob's bytes are a part of their own: the very object, not a copy
    assert all(any(part is data for part in parts) for data in blobs.values() if data)


def _echo_server() -> tuple[int, list[bytes]]:
    """A loopback server that reads one request (Content-Length framed) and answers 200;
    the list gets the request's head and body."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def run() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += conn.recv(1 << 20)
            seen.extend([head, body])
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    threading.Thread(target=run, daemon=True).start()
    return int(listener.getsockname()[1]), seen


@pytest.mark.parametrize("client", ["plain", "http.client"])
def test_a_body_in_parts_arrives_whole_with_its_length(client: str) -> None:
    # Given a body of many parts, more than one sendmsg takes, and a large one
    parts = [b"%d," % n for n in range(1500)] + [os.urandom(1 << 20), b"end"]
    port, seen = _echo_server()
    origin = ("http", "127.0.0.1", port)
    if client == "plain":
        conn = new_connection(origin, 10.0, None)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)  # as for TLS
    # When it is sent
    try:
        target = Target(origin, "/v1/invocations", own=True)
        answer = request_once(conn, "POST", target, parts, {"Content-Type": MP}, 10.0)
    finally:
        conn.close()
    # Then the server got the parts in order, as one body of their summed length
    assert (answer.status, answer.body) == (200, b"ok")
    head, body = seen
    assert body == b"".join(parts)
    assert f"content-length: {len(body)}".encode() in head.lower()
    assert b"transfer-encoding" not in head.lower()


def _dispatch(server: LocalServer, role: str) -> dls.Dispatch:
    return dls.Dispatch(server.url, token=role_token(server, role))


class Requests:
    """The (method, path, body fields) of every request a transport sends."""

    def __init__(self, transport: HttpTransport, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[str, str, frozenset[str]]] = []
        exchange = transport._exchange

        def spy(method: str, target: Any, body: Any, headers: Any, timeout: float) -> Any:
            fields: frozenset[str] = frozenset()
            if body and headers.get("Content-Type") == MP:
                raw = b"".join(body) if isinstance(body, list) else body
                fields = frozenset(msgpack.unpackb(raw))
            self.seen.append((method, target.path.split("?")[0], fields))
            return exchange(method, target, body, headers, timeout)

        monkeypatch.setattr(transport, "_exchange", spy)

    def paths(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _ in self.seen]


def _worker(dp: dls.Dispatch, queue: str) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(
        target=dls.run_worker,
        args=(dls.SyncQueue(queue, dispatch=dp),),
        kwargs={"stop": stop.is_set},
        daemon=True,
    )
    thread.start()
    return stop, thread


def test_the_sdk_submits_a_large_call_in_one_request(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a producer and a worker on a served plane, the queue made and the plane asked
    with _dispatch(served, "producer") as producer, _dispatch(served, "worker") as worker:
        transport = producer.transport
        assert isinstance(transport, HttpTransport)
        q = dls.SyncQueue("big", dispatch=producer)
        q.submit(_size, b"warm")  # the function body goes here (it is small)
        seen = Requests(transport, monkeypatch)
        stop, thread = _worker(worker, "big")
        try:
            # When a call with arguments over the inline limit is submitted
            arg = b"y" * (300 * 1024)
            inv = q.submit(_size, arg)
            # Then it took one request, which carried the argument blob
            assert seen.paths() == [("POST", "/v1/invocations")]
            assert "blobs" in seen.seen[0][2]
            # and the worker ran it with those arguments
            assert q.result(inv, timeout=30) == len(arg)
            # When the same arguments go again: the plane has them, nothing is carried
            seen.seen.clear()
            assert q.result(q.submit(_size, arg), timeout=30) == len(arg)
            assert seen.seen[0] == ("POST", "/v1/invocations", frozenset({"invocations"}))
        finally:
            stop.set()
            thread.join(timeout=30)


@pytest.mark.parametrize(
    "limits",
    [{"submit_blobs": 0}, {"max_body": 200 * 1024}],
    ids=["a plane that takes blobs by upload only", "a blob too large for one body"],
)
def test_blobs_a_submit_cannot_carry_are_uploaded_first(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch, limits: dict[str, int]
) -> None:
    # Given a client whose plane takes no blobs in a submit, or not one this large
    with _dispatch(served, "producer") as producer, _dispatch(served, "worker") as worker:
        transport = producer.transport
        assert isinstance(transport, HttpTransport)
        transport.hello()
        monkeypatch.setattr(transport, "_limits", dataclasses.replace(transport.limits, **limits))
        q = dls.SyncQueue("big", dispatch=producer)
        q.submit(_size, b"warm")
        seen = Requests(transport, monkeypatch)
        stop, thread = _worker(worker, "big")
        try:
            # When a call with arguments over the inline limit is submitted
            arg = b"z" * (300 * 1024)
            inv = q.submit(_size, arg)
            # Then its blob was asked about and uploaded, then the call submitted
            digest = wire.digest(_call(arg).blobs.popitem()[1])
            assert seen.paths() == [
                ("POST", "/v1/blobs/missing"),
                ("PUT", f"/v1/blobs/{digest}"),
                ("POST", "/v1/invocations"),
            ]
            assert seen.seen[-1][2] == frozenset({"invocations"})
            assert q.result(inv, timeout=30) == len(arg)
        finally:
            stop.set()
            thread.join(timeout=30)


# --- lakeshore serve: a large submit's blobs stored on a thread, the rest on the loop ---


@pytest.mark.parametrize(
    ("who", "bytes_ok", "status"),
    [
        ("worker", True, 403),
        ("producer of queue a", True, 403),
        ("producer", False, 400),
    ],
    ids=["a worker's token", "a queue the token may not submit to", "bytes not the digest's"],
)
def test_serve_refuses_a_large_carrying_submit_before_storing_its_blobs(
    served: LocalServer, who: str, bytes_ok: bool, status: int
) -> None:
    # Given a submit over 64 KiB (answered in a request thread, its blobs stored there
    # before its records are made on the event loop) whose caller or blob is wrong
    assert served.admin_token is not None and served.plane is not None
    with dls.Dispatch(served.url, token=served.admin_token) as admin:
        transport = admin.transport
        assert isinstance(transport, HttpTransport)
        role, _, queues = who.partition(" of queue ")
        token = str(transport.create_token(role, [queues] if queues else ["*"])["token"])
    data = os.urandom(300 * 1024)
    digest = hashlib.sha256(data if bytes_ok else b"other").hexdigest()
    item = {"queue": "b", "ref": "math:sqrt", "args": [4]}
    body = msgpack.packb({"invocations": [item], "blobs": {digest: data}}, use_bin_type=True)
    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {"Content-Type": MP, "Authorization": f"Bearer {token}"}
        conn.request("POST", "/v1/invocations", body=body, headers=headers)
        answer = conn.getresponse()
        got = msgpack.unpackb(answer.read())
    finally:
        conn.close()
    # Then it is refused with its reason, and nothing was stored: no blob, no record
    assert answer.status == status, got
    assert "\n" not in got["error"]["message"]
    assert served.plane.missing_blobs([digest]) == {digest}
    assert served.plane.list_queues() == []


def test_a_carry_without_blobs_does_nothing_and_one_with_them_leaves_the_rest(
    api: Api,
) -> None:
    # Service.carry, serve's first half of a large submit: its blobs stored, the rest
    # returned for the submit that makes its records
    service = Service(api.plane)
    producer = Identity("t", "producer", ("*",))
    item = {"queue": "jobs", "ref": "math:sqrt", "args": [4]}
    assert service.carry(producer, {"invocations": [item]}) is None
    data = b"carried bytes"
    digest = hashlib.sha256(data).hexdigest()
    rest = service.carry(producer, {"invocations": [item], "blobs": {digest: data}})
    assert rest == {"invocations": [item]}
    assert api.plane.get_blob(digest) == data
    assert api.plane.list_queues() == []  # (the records are the rest's submit's to make)


def _post_msgpack(served: LocalServer, token: str, value: dict[str, Any]) -> tuple[int, Any]:
    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = msgpack.packb(value, use_bin_type=True)
        headers = {"Content-Type": MP, "Authorization": f"Bearer {token}"}
        conn.request("POST", "/v1/invocations", body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, msgpack.unpackb(answer.read())
    finally:
        conn.close()


def test_serve_makes_a_large_rest_of_a_carrying_submit_in_its_thread(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch whose records alone are over the loop's size, carrying a blob
    assert served.admin_token is not None and served.plane is not None
    plane = served.plane
    submits = threads_of(plane, "submit", monkeypatch)
    stored = threads_of(plane, "put_blobs", monkeypatch)
    data = os.urandom(300 * 1024)
    digest = hashlib.sha256(data).hexdigest()
    items = [
        {"id": f"big-rest-{i}", "queue": "b", "ref": "math:sqrt", "args": ["x" * 200]}
        for i in range(400)
    ]
    # When it is submitted
    status, got = _post_msgpack(
        served, served.admin_token, {"invocations": items, "blobs": {digest: data}}
    )
    # Then its blob was stored and its records made in the request thread: the event
    # loop never holds a submit it would not take on its own
    assert status == 200 and len(got["ids"]) == 400
    assert len(stored) == len(submits) == 1
    assert stored[0].startswith("lakeshore-api") and submits[0] == stored[0]
    assert plane.get_blob(digest) == data and plane.counts("b")["pending"] == 400


def test_serve_answers_a_carrying_submit_whole_when_storing_its_blobs_fails_unexpectedly(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a bug in the first half of a large submit
    assert served.admin_token is not None and served.plane is not None

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Service, "carry", broken)
    data = os.urandom(300 * 1024)
    digest = hashlib.sha256(data).hexdigest()
    item = {"id": "whole-1", "queue": "b", "ref": "math:sqrt", "args": [4]}
    # When it is submitted
    status, got = _post_msgpack(
        served, served.admin_token, {"invocations": [item], "blobs": {digest: data}}
    )
    # Then it is answered as the whole path answers it, and the bug is logged
    assert (status, got) == (200, {"ids": ["whole-1"]})
    assert served.plane.get_blob(digest) == data
    assert "unhandled error storing a submit's blobs" in caplog.text


def test_a_submit_reads_its_queue_again_after_storing_its_blobs(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a queue deleted while a submit's carried blobs are stored
    call = _call(b"z" * 20_000)
    api.plane.ensure_queue(QueueSpec("jobs"))
    real = api.plane.put_blobs

    def put_then_delete(blobs: Any) -> None:
        real(blobs)
        api.plane.delete_queue("jobs")

    monkeypatch.setattr(api.plane, "put_blobs", put_then_delete)
    # When the submit goes on
    item = {"id": "after-blobs", "queue": "jobs", "payload": call.payload}
    status, body = api.submit({"invocations": [item], "blobs": call.blobs})
    # Then it made the queue again, as a first submit does, and its call is there
    assert (status, body) == (200, {"ids": ["after-blobs"]})
    assert api.plane.get("after-blobs").queue == "jobs"
