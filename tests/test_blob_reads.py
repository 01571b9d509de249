"""How a large blob is read from a remote plane: served without copies, hashed once by
the worker, and still never run when tampered with.

``lakeshore serve`` hands a blob's bytes to the HTTP server as the store read them (the
handler's answer is a view of them, not a copy). A process worker's job process reads
an argument blob over the transport itself; the executor checks every blob against its
digest before loading it, so the read does not hash the bytes a second time
(``HttpTransport.get_blob(..., check=False)``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from support import role_token

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import wire
from dreamlake.lakeshore.api import Service, bootstrap_admin
from dreamlake.lakeshore.errors import InvalidRequest
from dreamlake.lakeshore.handlers import apigw
from dreamlake.lakeshore.handlers.api import make_app
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.server import LocalServer
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.worker.pool import ProcessWorker


def test_serve_answers_a_blob_with_the_bytes_the_store_read_and_lambda_in_base64(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a plane holding a blob, behind the API's router
    plane = Plane(SqliteStore(":memory:"))
    token = bootstrap_admin(plane)
    data = b"blob bytes" * 1000
    digest = hashlib.sha256(data).hexdigest()
    plane.put_blob(digest, data)
    read: list[bytes] = []
    get_blob = plane.store.get_blob

    def reading(d: str) -> bytes | None:
        got = get_blob(d)
        assert got is not None
        read.append(got)
        return got

    monkeypatch.setattr(plane.store, "get_blob", reading)
    app = make_app(Service(plane))
    headers = {"authorization": f"Bearer {token}"}
    try:
        # When lakeshore serve (bodies kept as bytes) asks for it
        event = apigw.http_event("GET", f"/v1/blobs/{digest}", headers=headers, raw_body=True)
        status, _, body = apigw.http_response(app.resolve(event, None))
        # Then the answer's body is the very bytes object the store read: no copy
        assert status == 200 and body is read[-1] and body == data
        # When API Gateway (bodies in base64) asks for it: the same bytes, in base64
        answer = app.resolve(apigw.http_event("GET", f"/v1/blobs/{digest}", headers=headers), None)
        assert answer["isBase64Encoded"] and base64.b64decode(answer["body"]) == data
        assert apigw.http_response(answer)[2] == data
    finally:
        plane.close()


def test_a_blob_read_unchecked_is_the_stored_bytes_and_checked_is_refused(
    served: LocalServer,
) -> None:
    # Given a blob on the plane whose stored bytes were changed behind its back
    data = b"honest bytes" * 1000
    digest = hashlib.sha256(data).hexdigest()
    with dls.Dispatch(served.url, token=role_token(served, "producer")) as dp:
        dp.upload({digest: data})
        stored = served.plane_path.with_name(served.plane_path.name + ".blobs") / digest
        stored.write_bytes(b"other bytes")
        transport: Any = dp.transport
        # When it is read with the transport's check: refused, naming the digest
        with pytest.raises(InvalidRequest, match=digest[:12]):
            transport.get_blob(digest)
        # When it is read for a caller that checks it itself: the bytes as stored
        assert transport.get_blob(digest, check=False) == b"other bytes"
        # and that caller's check refuses them
        with pytest.raises(InvalidRequest, match="does not match its digest"):
            wire.verified(digest, transport.get_blob(digest, check=False))


def _honest() -> Callable[[Any], Any]:
    def size(x: Any) -> Any:
        return len(x)

    return size  # a closure: its body travels by value


class _Detonator:
    """Unpickling this writes ``marker``: the stand-in for code hidden in a blob."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "tampered code ran"))


def test_a_process_worker_over_http_refuses_arguments_that_do_not_match_their_digest(
    served: LocalServer, tmp_path: Path
) -> None:
    # Given an invocation whose arguments travelled as a blob (over the inline limit)
    marker = tmp_path / "tampered-code-ran"
    with (
        dls.Dispatch(served.url, token=role_token(served, "producer")) as producer,
        dls.Dispatch(served.url, token=role_token(served, "worker")) as worker_dp,
    ):
        q = dls.SyncQueue("tamper", dispatch=producer)
        inv = q.submit(_honest(), b"x" * (300 * 1024))
        assert served.plane is not None
        env = wire.decode_payload(served.plane.get(inv).payload)
        digest = env["args_ref"]
        # When the stored argument blob is swapped for arguments that run code on load
        stored = served.plane_path.with_name(served.plane_path.name + ".blobs") / digest
        stored.write_bytes(cloudpickle.dumps(((_Detonator(marker),), {}), protocol=5))
        # and a process worker (its job process reads the blob over HTTP) takes it
        w = ProcessWorker(worker_dp, ["tamper"], max_idle_wait=0.1)
        thread = threading.Thread(target=w.run, daemon=True)
        thread.start()
        try:
            with pytest.raises(Exception) as caught:
                q.result(inv, timeout=30)
        finally:
            w.request_stop()
            w.request_stop()
            thread.join(timeout=30)
        # Then the job failed on the digest before anything was unpickled
        assert not marker.exists(), "a worker ran arguments whose bytes do not match"
        assert not isinstance(caught.value, TimeoutError)
        assert "digest" in str(caught.value).lower() or digest[:12] in str(caught.value)


def _blob_dir(served: LocalServer) -> Path:
    return served.plane_path.with_name(served.plane_path.name + ".blobs")


@contextlib.contextmanager
def _client_with_blob(served: LocalServer, role: str, data: bytes) -> Iterator[tuple[Any, str]]:
    """A client of ``served`` with a ``role`` token, once it put ``data`` on the plane:
    its transport and the blob's digest."""
    digest = hashlib.sha256(data).hexdigest()
    with dls.Dispatch(served.url, token=role_token(served, role)) as dp:
        dp.transport.put_blob(digest, data)  # type: ignore[attr-defined]
        yield dp.transport, digest


@pytest.mark.parametrize("role", ["producer", "worker"])
def test_a_client_on_the_planes_machine_reads_its_blob_files_without_http(
    served: LocalServer, role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a blob on a served plane file
    data = b"plane bytes" * 1000
    with _client_with_blob(served, role, data) as (transport, digest):
        # Then hello names the plane's blob directory and its id
        named = transport.hello()["blobs"]
        assert named["dir"] == str(_blob_dir(served).resolve())
        assert (_blob_dir(served) / ".id").read_text() == named["id"]
        # When a client on the same machine reads the blob: the file, not HTTP
        http_reads: list[str] = []
        monkeypatch.setattr(transport, "_blob", lambda *a: http_reads.append(a[1].path))
        assert transport.get_blob(digest) == data
        assert transport.get_blob(digest, check=False) == data
        assert http_reads == []
        # A blob the plane does not keep as a file is still asked of the plane
        monkeypatch.undo()
        with pytest.raises(dls.LakeshoreError):
            transport.get_blob("0" * 64)


def test_a_client_reads_over_http_when_the_named_directory_is_another_planes(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a served plane whose blob directory this client sees under another id (the
    # same path on another machine, say) holding other bytes under a blob's name
    data = b"honest bytes" * 1000
    with _client_with_blob(served, "worker", data) as (transport, digest):
        assert transport.hello()["blobs"]["id"]
        (_blob_dir(served) / ".id").write_text("another plane")
        # When it reads the blob: asked of the plane over HTTP
        http_reads: list[str] = []
        real = transport._blob
        monkeypatch.setattr(transport, "_blob", lambda *a: http_reads.append(a[1].path) or real(*a))
        assert transport.get_blob(digest) == data
        assert http_reads == [f"/v1/blobs/{digest}"]


def test_a_blob_file_that_does_not_match_its_digest_is_refused_as_over_http(
    served: LocalServer,
) -> None:
    # Given a blob file changed behind the plane's back, on the client's machine
    with _client_with_blob(served, "worker", b"honest bytes" * 1000) as (transport, digest):
        (_blob_dir(served) / digest).write_bytes(b"other bytes")
        # When it is read with the check: refused, naming the digest
        with pytest.raises(InvalidRequest, match=digest[:12]):
            transport.get_blob(digest)
        # and without it, the caller's own check refuses the bytes
        with pytest.raises(InvalidRequest, match="does not match its digest"):
            wire.verified(digest, transport.get_blob(digest, check=False))


def test_a_process_worker_on_the_planes_machine_reads_a_large_argument_from_its_file(
    served: LocalServer,
) -> None:
    # Given a call whose argument travels as a 1 MiB blob, on a served plane file
    assert served.plane is not None
    plane = served.plane
    served_reads: list[str] = []
    get_blob = plane.get_blob

    def counting(digest: str) -> bytes:
        served_reads.append(digest)
        return get_blob(digest)

    plane.get_blob = counting  # type: ignore[method-assign]
    with (
        dls.Dispatch(served.url, token=role_token(served, "producer")) as producer,
        dls.Dispatch(served.url, token=role_token(served, "worker")) as worker_dp,
    ):
        q = dls.SyncQueue("local-blobs", dispatch=producer)
        arg = bytes(range(256)) * 4096
        inv = q.submit(_honest(), arg)
        assert "args_ref" in wire.decode_payload(plane.get(inv).payload)
        # When a process worker on the same machine runs it
        w = ProcessWorker(worker_dp, ["local-blobs"], max_idle_wait=0.1)
        thread = threading.Thread(target=w.run, daemon=True)
        thread.start()
        try:
            assert q.result(inv, timeout=30) == len(arg)
        finally:
            w.request_stop()
            thread.join(timeout=30)
    # Then neither the argument nor the function body was asked of the server
    assert served_reads == []
