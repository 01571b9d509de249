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
import hashlib
import threading
from collections.abc import Callable
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
