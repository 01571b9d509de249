"""Blobs past the request limit on ``lakeshore serve``: an upload is streamed into the
blob's file as it arrives (checked against its digest, never held whole), up to the
plane's blob limit (``limits.max_blob``), so an argument or a result of many megabytes
makes the round trip; one over the limit is refused with a 413 before its body is read,
and a job whose result the plane will not take fails at once with the reason instead
of running again. An error carrying megabytes of text is cut to fit its report."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import http.client
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import role_token, wait_for

import dreamlake.lakeshore as dls
from dreamlake.lakeshore import server as server_module
from dreamlake.lakeshore.api import Limits, Service
from dreamlake.lakeshore.api.auth import Identity
from dreamlake.lakeshore.errors import InvalidRequest, PayloadTooLarge, Unavailable
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.plane import blobs as blobs_module
from dreamlake.lakeshore.plane.blobs import HASH_BESIDE
from dreamlake.lakeshore.plane.model import Claim
from dreamlake.lakeshore.progress import MAX_MESSAGE
from dreamlake.lakeshore.server import LocalServer
from dreamlake.lakeshore.stores import SqliteStore
from dreamlake.lakeshore.stores.blobfiles import BlobFile
from dreamlake.lakeshore.wire import (
    ERROR_MESSAGE,
    ERROR_PICKLE,
    ERROR_TRACEBACK,
    decode_error,
    encode_error,
)
from dreamlake.lakeshore.worker.execute import Outcome
from dreamlake.lakeshore.worker.report import report_many

MIB = 1024 * 1024


def byte_count(data: bytes) -> int:
    return len(data)


def make_bytes(n: int) -> bytes:
    return bytes(range(256)) * (n // 256)


@pytest.fixture
def small(tmp_path: Path) -> Iterator[LocalServer]:
    """``lakeshore serve`` taking blobs of up to 2 MiB (its requests: up to 4 MiB)."""
    server = LocalServer(tmp_path / "plane.db", max_blob=2 * MIB)
    server.start()
    yield server
    server.stop()


@contextlib.contextmanager
def _producer_and_worker(
    server: LocalServer,
) -> Iterator[tuple[dls.SyncQueue, Callable[[], int]]]:
    """A producer's queue on ``server``, and a function that runs one job of it in a
    worker (of a token of its own)."""
    with (
        dls.Dispatch(server.url, token=role_token(server, "producer")) as producer,
        dls.Dispatch(server.url, token=role_token(server, "worker")) as worker,
    ):
        queue = dls.SyncQueue("big", dispatch=worker)
        yield (
            dls.SyncQueue("big", dispatch=producer),
            functools.partial(dls.run_worker, queue, once=True, poll=0.05),
        )


def _blob_dir(server: LocalServer) -> Path:
    return server.plane_path.with_name(server.plane_path.name + ".blobs")


def _leftovers(server: LocalServer) -> list[str]:
    """Files in the blob directory but its id and whole blobs (parts of uploads)."""
    return (
        sorted(p.name for p in _blob_dir(server).glob(".*") if p.name != ".id")
        if _blob_dir(server).exists()
        else []
    )


def _put(
    server: LocalServer, digest: str, body: bytes, headers: dict[str, str]
) -> tuple[int, bytes]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("PUT", f"/v1/blobs/{digest}", body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_serve_runs_a_call_whose_argument_and_result_are_over_the_request_limit(
    served: LocalServer,
) -> None:
    # Given lakeshore serve (requests up to 4 MiB) and a producer and a worker on it
    data = os.urandom(6 * MIB)
    with _producer_and_worker(served) as (q, run_one):
        assert q.dispatch.transport.hello()["limits"]["max_blob"] == 5 * 1024 * MIB
        # When a call takes 6 MiB and another returns 6 MiB
        took = q.submit(byte_count, data)
        gave = q.submit(make_bytes, 6 * MIB)
        for _ in range(2):
            run_one()
        # Then both made the round trip whole
        assert q.result(took, timeout=30) == len(data)
        assert q.result(gave, timeout=30) == make_bytes(6 * MIB)
    # and each went into the blob directory as one whole file, nothing beside it
    sizes = sorted(p.stat().st_size for p in _blob_dir(served).iterdir() if p.name[0] != ".")
    assert sizes[-2] >= 6 * MIB and sizes[-1] > len(data)
    assert _leftovers(served) == []


def test_a_streamed_upload_whose_bytes_do_not_match_is_refused_and_leaves_nothing(
    served: LocalServer,
) -> None:
    # Given a worker token and 3 MiB under another blob's digest
    token = role_token(served, "worker")
    data = os.urandom(3 * MIB)
    wrong = hashlib.sha256(b"something else").hexdigest()
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    # When it is PUT
    status, body = _put(served, wrong, data, auth)
    # Then it is a 400 saying so, and no file is left, whole or in part
    assert status == 400 and b"does not match" in body
    assert not (_blob_dir(served) / wrong).exists()
    assert _leftovers(served) == []
    # And the right digest is taken
    right = hashlib.sha256(data).hexdigest()
    assert _put(served, right, data, auth)[0] == 204
    assert (_blob_dir(served) / right).read_bytes() == data


def test_an_upload_needs_a_token_before_its_body_is_read(served: LocalServer) -> None:
    data = os.urandom(MIB)
    digest = hashlib.sha256(data).hexdigest()
    status, body = _put(served, digest, data, {"Content-Type": "application/octet-stream"})
    assert status == 401 and b"unauthorized" in body
    assert not (_blob_dir(served) / digest).exists()


def test_a_blob_over_the_plane_limit_is_refused_declared_or_streamed(small: LocalServer) -> None:
    token = role_token(small, "producer")
    auth = {"Authorization": f"Bearer {token}"}
    data = os.urandom(3 * MIB)
    digest = hashlib.sha256(data).hexdigest()
    # A declared length over the limit: 413 before the body is read
    status, body = _put(small, digest, data, auth)
    assert status == 413 and b"2097152 byte blob limit" in body
    # A chunked body (no length said) that grows past it: 413 once it does
    status, body = _put(small, digest, iter([data[:MIB], data[MIB:]]), auth)  # type: ignore[arg-type]
    assert status == 413 and b"limit" in body
    assert not (_blob_dir(small) / digest).exists()
    assert _leftovers(small) == []
    # The SDK says so before sending anything, and hello names the limit
    with dls.Dispatch(small.url, token=token) as dp:
        assert dp.transport.hello()["limits"]["max_blob"] == 2 * MIB
        with pytest.raises(PayloadTooLarge, match="blob limit"):
            dp.upload({digest: data})
        # and a call whose argument is over it is refused at submit
        with pytest.raises(PayloadTooLarge, match="blob limit"):
            dls.SyncQueue("big", dispatch=dp).submit(byte_count, data)


def test_a_result_over_the_blob_limit_fails_its_invocation_at_once(small: LocalServer) -> None:
    # Given a job whose result (3 MiB) is over the plane's blob limit (2 MiB)
    with _producer_and_worker(small) as (q, run_one):
        inv = q.submit(make_bytes, 3 * MIB)
        # When a worker runs it
        run_one()
        # Then it has failed with the plane's reason (not left running until its
        # lease runs out, to run again and again)
        rec = q.dispatch.transport.get(inv)
        assert rec.state.value == "failed"
        with pytest.raises(dls.InvalidResult, match="blob limit"):
            q.result(inv, timeout=10)


def test_a_client_that_hangs_up_mid_upload_leaves_no_part_behind(served: LocalServer) -> None:
    token = role_token(served, "worker")
    digest = hashlib.sha256(b"never sent whole").hexdigest()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"PUT /v1/blobs/{digest} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {4 * MIB}\r\n\r\n".encode()
        )
        sock.sendall(os.urandom(2 * MIB))
    wait_for(lambda: not (_leftovers(served) or served.asgi.in_flight))  # type: ignore[union-attr]
    assert _leftovers(served) == [] and served.asgi.in_flight == 0
    assert not (_blob_dir(served) / digest).exists()


def test_a_blob_in_pieces_is_checked_and_kept_whole_on_either_store(tmp_path: Path) -> None:
    data = os.urandom(MIB)
    digest = hashlib.sha256(data).hexdigest()
    for store in (SqliteStore(":memory:"), SqliteStore(tmp_path / "plane.db")):
        plane = Plane(store)
        try:
            # pieces that do not hash to the digest: refused, nothing kept
            bad = plane.blob_upload(digest, limit=2 * MIB)
            bad.write(data[:1000])
            with pytest.raises(InvalidRequest, match="does not match"):
                bad.finish()
            assert plane.missing_blobs([digest]) == {digest}
            # pieces past the limit: refused as they come
            over = plane.blob_upload(digest, limit=MIB - 1)
            with pytest.raises(PayloadTooLarge):
                over.write(data)
            assert plane.missing_blobs([digest]) == {digest}
            # the right pieces: kept whole
            good = plane.blob_upload(digest, limit=2 * MIB)
            for i in range(0, len(data), 300_000):
                good.write(data[i : i + 300_000])
            good.finish()
            assert plane.get_blob(digest) == data
        finally:
            plane.close()
    assert [p.name for p in (tmp_path / "plane.db.blobs").iterdir()] == [digest]


def test_whole_blobs_are_checked_before_any_is_kept_on_either_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Large blobs bound for a file have their file written on another thread while this
    # one hashes them; the file gets its name only once every blob of the put has matched.
    written_on: list[str] = []
    real = blobs_module._write_part

    def write_part(store: Any, home: str, digest: str, data: bytes) -> Any:
        writer = real(store, home, digest, data)
        if writer is not None:
            written_on.append(threading.current_thread().name)
        return writer

    monkeypatch.setattr(blobs_module, "_write_part", write_part)
    big, other = os.urandom(MIB), os.urandom(HASH_BESIDE)
    d_big, d_other = hashlib.sha256(big).hexdigest(), hashlib.sha256(other).hexdigest()
    small = b"small bytes"
    d_small = hashlib.sha256(small).hexdigest()
    for store in (SqliteStore(":memory:"), SqliteStore(tmp_path / "plane.db")):
        plane = Plane(store)
        try:
            # a large blob whose bytes are another's, beside good ones: nothing kept
            for wrong in ({d_big: big, d_other: big}, {d_big: big, d_small: other}):
                with pytest.raises(InvalidRequest, match="does not match"):
                    plane.put_blobs({d_small: small, **wrong})
                assert plane.missing_blobs([d_big, d_other, d_small]) == {d_big, d_other, d_small}
            # the right bytes: all kept, readable whole
            written_on.clear()
            plane.put_blobs({d_big: big, d_other: other, d_small: small})
            assert [plane.get_blob(d) for d in (d_big, d_other, d_small)] == [big, other, small]
            beside = [name for name in written_on if name.startswith("lakeshore-blobs")]
            # (only a plane file's large blobs are written beside their hash)
            assert len(beside) == len(written_on) == (2 if store.shared else 0)
            # a blob the plane holds already is checked and not written again
            written_on.clear()
            plane.put_blobs({d_big: big})
            assert written_on == []
            with pytest.raises(InvalidRequest, match="does not match"):
                plane.put_blobs({d_big: other})
            assert plane.get_blob(d_big) == big
        finally:
            plane.close()
    names = sorted(p.name for p in (tmp_path / "plane.db.blobs").iterdir() if p.name != ".id")
    assert names == sorted([d_big, d_other, d_small])  # no part left by the refused puts


def _get(
    server: LocalServer, digest: str, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", f"/v1/blobs/{digest}", headers=headers)
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def test_a_blob_file_is_sent_in_pieces_whole_and_only_to_a_token(served: LocalServer) -> None:
    # Given a 6 MiB blob on the plane
    token = role_token(served, "worker")
    data = os.urandom(6 * MIB)
    digest = hashlib.sha256(data).hexdigest()
    auth = {"Authorization": f"Bearer {token}"}
    assert _put(served, digest, data, auth)[0] == 204
    # When it is read over HTTP: all of it, its length said up front
    status, headers, body = _get(served, digest, auth)
    assert status == 200 and body == data
    assert headers["content-length"] == str(len(data))
    assert headers["content-type"] == "application/octet-stream"
    # Without a token: refused; a blob the plane lacks: 404, as the route answers
    assert _get(served, digest, {})[0] == 401
    assert _get(served, hashlib.sha256(b"none").hexdigest(), auth)[0] == 404
    # And an SDK client that cannot see the plane's files reads it the same way
    with dls.Dispatch(served.url, token=token) as dp:
        dp.transport._home = False  # type: ignore[attr-defined]  # (as on another machine)
        assert dp.transport.get_blob(digest) == data


def test_a_download_stops_when_its_client_hangs_up(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a 64 MiB blob, and a count of the bytes the server reads of blob files
    token = role_token(served, "worker")
    data = os.urandom(64 * MIB)
    digest = hashlib.sha256(data).hexdigest()
    assert _put(served, digest, data, {"Authorization": f"Bearer {token}"})[0] == 204
    read: list[int] = []
    pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        read.append(n)
        return pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counted)
    # When a client asks for it and hangs up after the first bytes
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = f"GET /v1/blobs/{digest} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
        sock.sendall(f"{head}\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    # Then the request's thread comes back without the rest read for nobody
    wait_for(lambda: not served.asgi.in_flight)  # type: ignore[union-attr]
    assert served.asgi.in_flight == 0
    assert sum(read) < len(data) // 2, f"read {sum(read)} of {len(data)} bytes"


def test_the_sweep_drops_parts_whose_writer_died_and_keeps_a_live_writers(
    tmp_path: Path,
) -> None:
    # Given a plane file's blob directory with parts of blobs: one left an hour ago by a
    # writer that died mid-write, one of a writer still writing it (an hour-long upload),
    # and one left a moment ago
    plane = Plane(SqliteStore(tmp_path / "plane.db"))
    try:
        home = plane.store.blob_home()  # type: ignore[attr-defined]
        assert home is not None
        blobs = Path(home[0])
        digest = hashlib.sha256(b"part").hexdigest()
        stale = blobs / f".{digest}.12345.0a1b2c3d"
        fresh = blobs / f".{digest}.12345.4e5f6a7b"
        for part in (stale, fresh):
            part.write_bytes(b"half a blob")
        writing = BlobFile(blobs / digest)
        writing.write(b"half another")
        live = next(p for p in blobs.iterdir() if p.name not in (".id", stale.name, fresh.name))
        hour_ago = time.time() - 3700
        for part in (stale, live):
            os.utime(part, (hour_ago, hour_ago))
        # When the plane sweeps
        plane.sweep()
        # Then only the dead writer's old part is gone
        assert not stale.exists() and live.exists() and fresh.exists()
        assert (blobs / ".id").exists()
        writing.commit()  # (and the live writer finishes its blob)
        assert (blobs / digest).read_bytes() == b"half another"
    finally:
        plane.close()


class _Refusing:
    """A Dispatch stand-in whose blob uploads raise ``error``; records the reports."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.completed: list[Any] = []
        self.failed: list[Any] = []
        self.transport = self

    def upload(self, blobs: dict[str, bytes]) -> None:
        raise self.error

    def complete_many(self, items: list[Any]) -> list[Any]:
        self.completed += items
        return [None for _ in items]

    def fail_many(self, items: list[Any]) -> None:
        self.failed += items


@pytest.mark.parametrize(
    ("error", "fails_now"),
    [
        (PayloadTooLarge("blob of 3 bytes is over the 2 byte blob limit"), True),
        (InvalidRequest("400"), False),  # (an S3 answer with no more than its status)
        (Unavailable("the plane is away"), False),
    ],
)
def test_only_a_result_over_the_blob_limit_fails_its_invocation_without_a_retry(
    error: Exception, fails_now: bool
) -> None:
    claim = Claim("inv-1", "q", b"", "lease", 0.0, 1, None)
    outcome = Outcome(ok=True, result=b"ref", blobs={"d" * 64: b"big"})
    dispatch = _Refusing(error)
    report_many(dispatch, [(claim, outcome)])  # type: ignore[arg-type]
    assert dispatch.completed == []
    if fails_now:  # failed with the plane's reason, not to be retried
        ((inv, _, err, retryable),) = dispatch.failed
        assert inv == "inv-1" and "blob limit" in err["message"] and retryable is False
    else:  # nothing reported: the lease runs out and the job runs again
        assert dispatch.failed == []


def test_a_plane_keeping_blobs_in_its_database_takes_none_past_a_request() -> None:
    plane = Plane(SqliteStore(":memory:"))
    try:
        service = Service(plane, limits=Limits(max_body=MIB))
        admin = Identity("admin", "admin", ("*",))
        assert service.hello(admin)["limits"]["max_blob"] == MIB
        with pytest.raises(PayloadTooLarge, match=f"{MIB} byte blob limit"):
            service.upload_blob(hashlib.sha256(b"x").hexdigest(), 2 * MIB)
        # A store that serves blobs by signed URLs (S3) takes them up to max_blob that
        # way, and no more than a request through the API, which says where to go
        plane.store.blob_url = lambda *args: "https://s3/blob"  # type: ignore[attr-defined]
        assert service.hello(admin)["limits"]["max_blob"] == 5 * 1024 * MIB
        with pytest.raises(PayloadTooLarge, match="signed URLs of POST /v1/blobs/missing"):
            service.upload_blob(hashlib.sha256(b"x").hexdigest(), 2 * MIB)
    finally:
        plane.close()


def test_stalled_transfers_hold_no_request_thread_and_are_capped(tmp_path: Path) -> None:
    # Given serve with 2 request threads, and two uploads that send a little and stall
    server = LocalServer(tmp_path / "plane.db", threads=2)
    server.start()
    try:
        token = role_token(server, "producer")
        host, port = server.url.removeprefix("http://").split(":")
        stalled = []
        for i in range(2):
            sock = socket.create_connection((host, int(port)))
            digest = hashlib.sha256(str(i).encode()).hexdigest()
            sock.sendall(
                f"PUT /v1/blobs/{digest} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                f"{token}\r\nContent-Length: {2 * MIB}\r\n\r\n".encode()
                + b"x" * 1000
            )
            stalled.append(sock)
        wait_for(lambda: server.asgi._transfers == 2)  # type: ignore[union-attr]
        # Then requests that need a thread are still answered
        with dls.Dispatch(server.url, token=token) as dp:
            assert dp.transport.missing_blobs(["a" * 64]) == {"a" * 64}
        # and a third transfer is refused for now (503, retry), not queued without end
        data = os.urandom(1000)
        status, body = _put(
            server, hashlib.sha256(data).hexdigest(), data, {"Authorization": f"Bearer {token}"}
        )
        assert status == 503 and b"blob transfers are busy" in body
        for sock in stalled:
            sock.close()
        wait_for(lambda: not server.asgi._transfers)  # type: ignore[union-attr]
        assert server.asgi._transfers == 0  # type: ignore[union-attr]
        assert _leftovers(server) == []
    finally:
        server.stop()


class _Pair(Exception):
    def __init__(self, what: str, data: bytes) -> None:
        super().__init__(what, data)


def raise_big(n: int) -> None:
    raise ValueError("x" * n)


def _raised(fn: Callable[..., Any], *args: Any) -> BaseException:
    try:
        fn(*args)
    except BaseException as exc:
        return exc
    raise AssertionError("it did not raise")


def test_an_error_carrying_megabytes_is_cut_to_fit_a_report() -> None:
    # A plain message: cut, the frames of the raise kept, and its own type again
    err = encode_error(_raised(raise_big, 5 * MIB))
    assert len(err["message"]) < ERROR_MESSAGE + 100 and "characters cut" in err["message"]
    assert len(err["traceback"]) < ERROR_TRACEBACK + 100
    assert "in raise_big" in err["traceback"]  # (where the raise is, past the message)
    assert len(err["pickled"]) <= ERROR_PICKLE
    assert type(decode_error(err)) is ValueError
    # A failed command with megabytes of output: still a CalledProcessError, its
    # output's start and end kept
    failed = subprocess.CalledProcessError(3, "make", b"o" * (3 * MIB), b"e" * (3 * MIB) + b"end")
    rebuilt = decode_error(encode_error(failed))
    assert isinstance(rebuilt, subprocess.CalledProcessError) and rebuilt.returncode == 3
    assert rebuilt.stderr.endswith(b"end") and len(rebuilt.stderr) < 8 * 1024
    # A remote error raised again by another job (its remote traceback and note are
    # long): still its own type at the next hop
    deep = decode_error(encode_error(_raised(_deep, 200)))
    again = decode_error(encode_error(deep))
    assert type(again) is ValueError
    # Arguments that cannot be copied with cut fields: no pickle, a RemoteError
    other = encode_error(_Pair("big", b"y" * (5 * MIB)))
    assert other["pickled"] is None or len(other["pickled"]) <= ERROR_PICKLE
    assert len(other["message"]) < ERROR_MESSAGE + 100
    # A small error is left whole
    small = encode_error(ValueError("boom"))
    assert small["message"] == "boom" and decode_error(small).args == ("boom",)


def _deep(n: int) -> None:
    if n:
        _deep(n - 1)
    raise ValueError("deep")


def test_a_job_raising_megabytes_of_message_fails_at_once_over_serve(served: LocalServer) -> None:
    with _producer_and_worker(served) as (q, run_one):
        inv = q.submit(raise_big, 5 * MIB)
        run_one()
        assert q.dispatch.transport.get(inv).state.value == "failed"
        with pytest.raises(ValueError, match="characters cut"):
            q.result(inv, timeout=10)


def say_much(n: int) -> int:
    dls.progress(0.5, "p" * n)
    return n


def test_a_progress_message_of_megabytes_is_kept_as_far_as_the_plane_keeps_it(
    served: LocalServer,
) -> None:
    with _producer_and_worker(served) as (q, run_one):
        inv = q.submit(say_much, 5 * MIB)
        run_one()
        assert q.result(inv, timeout=10) == 5 * MIB
        # cut to what the plane keeps before it travels (a request of megabytes was
        # refused as too large, and the progress lost)
        assert q.dispatch.transport.get(inv).progress_message == "p" * MAX_MESSAGE


def _stalled_upload(server: LocalServer, token: str) -> socket.socket:
    """A PUT that sends its head and a little of its body, then nothing."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    digest = hashlib.sha256(b"stalled").hexdigest()
    sock.sendall(
        f"PUT /v1/blobs/{digest} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Length: {2 * MIB}\r\n\r\n".encode()
        + b"x" * 1000
    )
    wait_for(lambda: server.asgi._transfers > 0)  # type: ignore[union-attr]
    return sock


def test_a_stalled_upload_is_answered_408_then_503_when_the_server_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "TRANSFER_IDLE", 0.3)
    server = LocalServer(tmp_path / "plane.db")
    server.start()
    try:
        token = role_token(server, "producer")
        # A client that goes quiet mid-upload: 408 once the idle time has passed
        with _stalled_upload(server, token) as sock:
            sock.settimeout(10)
            assert sock.recv(4096).startswith(b"HTTP/1.1 408")
        # One still quiet when the server stops: a 503 in the API's shape, at once
        monkeypatch.setattr(server_module, "TRANSFER_IDLE", 30.0)
        with _stalled_upload(server, token) as sock:
            sock.settimeout(10)
            server.stop()
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503") and b"the server is stopping" in answer
    finally:
        server.stop()
    assert _leftovers(server) == []


def test_a_disk_that_fails_a_write_is_a_503_with_the_reason(
    served: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: BlobFile, data: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(BlobFile, "write", full)
    data = os.urandom(MIB)
    token = role_token(served, "producer")
    status, body = _put(
        served, hashlib.sha256(data).hexdigest(), data, {"Authorization": f"Bearer {token}"}
    )
    assert status == 503 and b"No space left on device" in body
    assert _leftovers(served) == [] and served.asgi.in_flight == 0  # type: ignore[union-attr]
