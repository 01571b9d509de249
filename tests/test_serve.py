"""``lakeshore serve``: the plane over HTTP on one machine.

The command runs as a real subprocess on a free loopback port; the adapter's finer
points (threads, Nagle, a busy pool, a stop during long polls) are checked in-process
through :class:`~dreamlake.lakeshore.server.LocalServer`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from dreamlake.lakeshore import wire
from dreamlake.lakeshore.plane import Plane
from dreamlake.lakeshore.plane.changes import Park
from dreamlake.lakeshore.server import (
    _GONE,
    INLINE_BODY,
    PARK_BODY,
    LocalServer,
    PlaneASGI,
    serve_in_thread,
)
from dreamlake.lakeshore.stores import SqliteStore

pytestmark = pytest.mark.timeout(120)


# --- helpers -----------------------------------------------------------------------------


def connect(url: str, timeout: float = 30.0) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = None,
    raw: bytes | None = None,
) -> tuple[int, dict[str, str], Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=headers)
    answer = conn.getresponse()
    payload = answer.read()
    parsed = json.loads(payload) if payload else None
    return answer.status, {k.lower(): v for k, v in answer.getheaders()}, parsed


def held_requests(url: str, admin: str) -> str:
    """The server's Prometheus text (its held claims and waits among it)."""
    conn = connect(url)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {admin}"})
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def make_token(url: str, admin: str, role: str, queues: list[str] | None = None) -> str:
    conn = connect(url)
    body = {"role": role, "queues": queues or ["*"]}
    status, _, answer = request(conn, "POST", "/v1/tokens", body, token=admin)
    conn.close()
    assert status == 200, answer
    return str(answer["token"])


@dataclass
class Served:
    """A ``lakeshore serve`` subprocess and what it printed."""

    proc: subprocess.Popen[str]
    url: str
    token: str | None
    lines: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> tuple[int, str]:
        self.proc.send_signal(sig)
        rest, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.lines) + rest


def start_serve(plane: Path, *args: str) -> Served:
    """Start ``lakeshore serve --port 0`` and read its URL (and token) from stdout."""
    script = Path(sys.executable).with_name("lakeshore")
    command = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from dreamlake.lakeshore.cli import main; main()"]
    )
    proc = subprocess.Popen(
        [*command, "serve", "--port", "0", "--plane", str(plane), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def banner_done(line: str) -> bool:
        return "export LAKESHORE_URL" in line or "not shown" in line

    def pump() -> None:  # read up to the banner's end; stop() reads the rest
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
            if banner_done(line):
                return

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if banner_done(line):
            text = "".join(seen)
            url = re.search(r"serving at (http://\S+)", text)
            token = re.search(r"admin token: (lks_\S+)", text)
            assert url is not None, text
            return Served(proc, url.group(1), token.group(1) if token else None, seen)
    proc.kill()
    out, _ = proc.communicate()
    pytest.fail(f"lakeshore serve did not start:\n{''.join(seen)}{out}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `lakeshore serve` for the module's tests (a fresh plane: its token is printed)."""
    server = start_serve(tmp_path_factory.mktemp("serve") / "plane.db")
    yield server
    code, out = server.stop()
    assert code == 0, out


# --- the command --------------------------------------------------------------------------------


def test_serve_prints_its_url_and_the_first_admin_token_once(served: Served) -> None:
    text = "".join(served.lines)
    assert served.url.startswith("http://127.0.0.1:")
    assert served.token is not None and served.token.startswith("lks_")
    assert "shown only now" in text
    assert f"export LAKESHORE_URL={served.url} LAKESHORE_TOKEN={served.token}" in text


def test_hello_needs_a_token(served: Served) -> None:
    conn = connect(served.url)
    status, _, body = request(conn, "GET", "/v1/hello", token=served.token)
    assert status == 200
    assert body["identity"]["role"] == "admin" and body["server"] == "lakeshore serve"
    status, headers, body = request(conn, "GET", "/v1/hello")
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert headers["content-type"].startswith("application/json")
    status, _, body = request(conn, "GET", "/v1/hello", token="lks_0000_wrong")
    assert status == 401
    conn.close()


def test_a_body_over_the_limit_is_413_and_the_connection_stays_usable(served: Served) -> None:
    conn = connect(served.url)
    _, _, hello = request(conn, "GET", "/v1/hello", token=served.token)
    limit = hello["limits"]["max_body"]
    # With a Content-Length over the limit: refused before the body is read
    status, _, body = request(
        conn, "POST", "/v1/invocations", token=served.token, raw=b"x" * (limit + 1)
    )
    assert status == 413 and body["error"]["code"] == "payload_too_large"
    assert request(conn, "GET", "/v1/hello", token=served.token)[0] == 200
    # Chunked (no Content-Length): refused once it passes the limit
    chunks = (b"y" * 65536 for _ in range(limit // 65536 + 2))
    conn.request(
        "POST",
        "/v1/invocations",
        body=chunks,
        headers={"Authorization": f"Bearer {served.token}", "Content-Type": "application/json"},
        encode_chunked=True,
    )
    answer = conn.getresponse()
    assert answer.status == 413, answer.read()
    conn.close()
    # Exactly at the limit the adapter lets it through (this one is not JSON: 400)
    conn = connect(served.url)
    status, _, body = request(conn, "POST", "/v1/invocations", token=served.token, raw=b"x" * limit)
    assert status == 400 and body["error"]["code"] == "invalid_request"
    conn.close()


def test_200_workers_long_poll_at_once_without_errors(served: Served) -> None:
    # Given a worker token and an empty queue
    assert served.token is not None
    worker = make_token(served.url, served.token, "worker")
    conn = connect(served.url)
    assert request(conn, "POST", "/v1/queues", {"name": "idle"}, token=worker)[0] == 200
    conn.close()
    # When 200 workers claim from it at the same moment, each waiting 2 s
    n, results = 200, []
    lock = threading.Lock()
    barrier = threading.Barrier(n)

    def claim(i: int) -> None:
        conn = connect(served.url)
        barrier.wait()
        began = time.monotonic()
        try:
            body = {"queues": ["idle"], "worker": f"w{i}", "wait": 2}
            status, _, answer = request(conn, "POST", "/v1/claims", body, token=worker)
            outcome: Any = (status, answer, time.monotonic() - began)
        except Exception as exc:
            outcome = (None, repr(exc), time.monotonic() - began)
        finally:
            conn.close()
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(n)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - began
    # Then every one waited its 2 s and got an empty answer, none an error
    failures = [r for r in results if r[0] != 200 or r[1] != {"claims": []}]
    assert len(results) == n and not failures, failures[:3]
    assert min(r[2] for r in results) > 1.8
    assert elapsed < 20, f"200 waiters took {elapsed:.1f}s"
    print(f"200 concurrent 2 s long polls: all 200 OK in {elapsed:.2f}s")


def test_round_trips_are_not_delayed_by_nagle(served: Served) -> None:
    # Nagle + delayed ACKs would cost ~40 ms per request on a keep-alive connection.
    conn = connect(served.url)
    times = []
    for _ in range(200):
        began = time.perf_counter()
        status, _, _ = request(conn, "GET", "/v1/hello", token=served.token)
        times.append(time.perf_counter() - began)
        assert status == 200
    conn.close()
    times.sort()
    p50 = times[len(times) // 2]
    assert p50 < 0.02, f"p50 round trip {p50 * 1000:.1f} ms"
    print(f"keep-alive /v1/hello p50: {p50 * 1000:.2f} ms")


def test_sigterm_and_ctrl_c_stop_cleanly_and_a_restart_keeps_tokens(tmp_path: Path) -> None:
    plane = tmp_path / "plane.db"
    first = start_serve(plane)
    assert first.token is not None
    # Long polls in flight (a claim, a result wait) do not hold the stop up: each is
    # answered 503 (retry) at once, and the process exits
    worker = make_token(first.url, first.token, "worker")
    producer = make_token(first.url, first.token, "producer")
    conn = connect(first.url)
    sub = {"invocations": [{"queue": "idle", "ref": "math:sqrt", "args": [4]}]}
    ids = request(conn, "POST", "/v1/invocations", sub, token=producer)[2]["ids"]
    conn.close()
    calls = [
        ("/v1/claims", {"queues": ["other"], "worker": "w", "wait": 20}, worker),
        ("/v1/invocations/wait", {"ids": ids, "timeout": 20}, producer),
    ]
    polled: list[Any] = []

    def long_poll(path: str, body: dict[str, Any], token: str) -> None:
        conn = connect(first.url)
        try:
            polled.append(request(conn, "POST", path, body, token=token))
        finally:
            conn.close()

    pollers = [threading.Thread(target=long_poll, args=call) for call in calls]
    for t in pollers:
        t.start()
    # (both held, as the server's gauge of the requests it holds open says)
    held = [
        'lakeshore_serve_held_requests{kind="claim"} 1',
        'lakeshore_serve_held_requests{kind="wait"} 1',
    ]
    wait_for(lambda: all(line in held_requests(first.url, first.token) for line in held))
    began = time.monotonic()
    code, out = first.stop(signal.SIGTERM)
    for t in pollers:
        t.join(10)
    assert code == 0, out
    assert time.monotonic() - began < 10
    assert [answer[0] for answer in polled] == [503, 503]
    assert all(answer[2]["error"]["code"] == "unavailable" for answer in polled)

    # Restarted on the same plane: no token is shown, the old one still works
    second = start_serve(plane)
    assert second.token is None and "--new-admin-token" in "".join(second.lines)
    conn = connect(second.url)
    assert request(conn, "GET", "/v1/hello", token=first.token)[0] == 200
    conn.close()
    code, out = second.stop(signal.SIGINT)
    assert code == 0, out

    # --new-admin-token makes another, shown once
    third = start_serve(plane, "--new-admin-token")
    assert third.token is not None and third.token != first.token
    conn = connect(third.url)
    status, _, body = request(conn, "GET", "/v1/hello", token=third.token)
    assert status == 200 and body["identity"]["role"] == "admin"
    conn.close()
    code, out = third.stop(signal.SIGTERM)
    assert code == 0, out


# --- the adapter, in-process ------------------------------------------------------------------


def test_serve_in_thread_binds_a_free_port_and_reports_it(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "plane.db") as (url, token):
        port = int(url.rsplit(":", 1)[1])
        assert port > 0 and token is not None
        conn = connect(url)
        assert request(conn, "GET", "/v1/hello", token=token)[0] == 200
        conn.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # stopped: nothing listens there any more


def test_accepted_sockets_have_nagle_off(tmp_path: Path) -> None:
    with LocalServer(tmp_path / "plane.db") as server:
        assert server.url and server.uvicorn is not None
        conn = connect(server.url)
        assert request(conn, "GET", "/v1/hello", token=server.admin_token)[0] == 200
        connections = list(server.uvicorn.server_state.connections)
        assert connections
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        conn.close()


def test_concurrent_requests_each_see_their_own_request(tmp_path: Path) -> None:
    # Powertools keeps the current request on the class; the adapter makes it per thread.
    with serve_in_thread(tmp_path / "plane.db") as (url, token):
        wrong: list[Any] = []

        def create(i: int) -> None:
            conn = connect(url)
            for k in range(10):
                name = f"q{i}-{k}"  # a body of its own, then a path argument of its own
                status, _, body = request(conn, "POST", "/v1/queues", {"name": name}, token=token)
                if status != 200 or body["queue"]["name"] != name:
                    wrong.append((name, status, body))
                status, _, body = request(conn, "GET", f"/v1/queues/{name}", token=token)
                if status != 200 or body["queue"]["name"] != name:
                    wrong.append((name, status, body))
            conn.close()

        threads = [threading.Thread(target=create, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not wrong, wrong[:3]


def test_a_waiting_request_beyond_the_threads_is_503_at_once(tmp_path: Path) -> None:
    # Waits on many ids (bodies over PARK_BODY) are held by threads; small ones are parked.
    many = [f"inv{i:030d}" for i in range(200)]
    big = {"ids": many, "timeout": 1.5, "since": 0}
    assert len(json.dumps(big)) > PARK_BODY
    with LocalServer(tmp_path / "plane.db", threads=2) as server:
        assert server.admin_token is not None
        admin = server.admin_token
        pollers = []
        for _ in range(2):

            def poll() -> None:
                conn = connect(server.url)
                request(conn, "POST", "/v1/invocations/wait", big, token=admin)
                conn.close()

            pollers.append(threading.Thread(target=poll))
            pollers[-1].start()
        asgi = server.asgi
        assert asgi is not None
        wait_for(lambda: asgi.in_flight >= 2, 5, "the long polls did not take their threads")
        conn = connect(server.url)
        began = time.monotonic()
        status, headers, body = request(conn, "POST", "/v1/invocations/wait", big, token=admin)
        assert status == 503 and body["error"]["code"] == "unavailable"
        assert headers["retry-after"] == "1" and time.monotonic() - began < 1
        # A short request is answered on the event loop, threads or not; so is a parked
        # claim (it waits its time out and answers empty).
        status, _, body = request(conn, "GET", "/v1/hello", token=admin)
        assert status == 200 and time.monotonic() - began < 1
        worker = make_token(server.url, admin, "worker")
        claim = {"queues": ["idle"], "worker": "w", "wait": 0.3}
        status, _, body = request(conn, "POST", "/v1/claims", claim, token=worker)
        assert status == 200 and body == {"claims": []}
        conn.close()
        for t in pollers:
            t.join(10)


def test_parked_waits_hold_no_thread_and_wake_on_the_change_they_wait_for(
    tmp_path: Path,
) -> None:
    # Given a server with 2 request threads and 40 workers waiting on claims at once
    with LocalServer(tmp_path / "plane.db", threads=2) as server:
        assert server.admin_token is not None and server.asgi is not None
        admin = server.admin_token
        worker = make_token(server.url, admin, "worker")
        conn = connect(server.url)
        assert request(conn, "POST", "/v1/queues", {"name": "q"}, token=admin)[0] == 200
        answers: queue.Queue[tuple[str, int, Any, float]] = queue.Queue()

        def claim(name: str, wait: float) -> None:
            c = connect(server.url)
            began = time.monotonic()
            body = {"queues": ["q"], "worker": name, "wait": wait}
            status, _, answer = request(c, "POST", "/v1/claims", body, token=worker)
            answers.put((name, status, answer, time.monotonic() - began))
            c.close()

        waiters = [threading.Thread(target=claim, args=(f"w{i}", 5.0)) for i in range(40)]
        for t in waiters:
            t.start()
        asgi = server.asgi
        wait_for(lambda: len(asgi._parked) >= 40, 5, "the claims were not parked")
        assert server.asgi.in_flight == 0  # parked: no thread held
        # When one job is submitted
        job = {"invocations": [{"queue": "q", "ref": "m:f"}]}
        status, _, body = request(conn, "POST", "/v1/invocations", job, token=admin)
        assert status == 200, body
        # Then exactly one waiter gets it, at once, and the others wait on
        _, status, answer, took = answers.get(timeout=5)
        assert status == 200 and [c["id"] for c in answer["claims"]] == body["ids"]
        assert took < 4.5
        assert answers.empty()
        # And a stop answers every parked request 503 at once (safe to retry)
        began = time.monotonic()
        server.request_stop()
        got = [answers.get(timeout=5) for _ in range(39)]
        assert {g[1] for g in got} == {503} and time.monotonic() - began < 2
        for t in waiters:
            t.join(5)
        conn.close()


def test_a_parked_result_wait_answers_when_its_invocation_finishes(tmp_path: Path) -> None:
    with LocalServer(tmp_path / "plane.db", threads=2) as server:
        assert server.admin_token is not None and server.asgi is not None
        admin = server.admin_token
        conn = connect(server.url)
        assert request(conn, "POST", "/v1/queues", {"name": "q"}, token=admin)[0] == 200
        status, _, body = request(
            conn,
            "POST",
            "/v1/invocations",
            {"invocations": [{"queue": "q", "ref": "m:f"}]},
            token=admin,
        )
        inv = body["ids"][0]
        got: queue.Queue[tuple[int, Any, float]] = queue.Queue()

        def wait(since: float | None) -> None:
            c = connect(server.url)
            began = time.monotonic()
            w: dict[str, Any] = {"ids": [inv], "timeout": 5}
            if since is not None:
                w["since"] = since
            status, _, answer = request(c, "POST", "/v1/invocations/wait", w, token=admin)
            got.put((status, answer, time.monotonic() - began))
            c.close()

        # a first wait (it checks the id) and a cursor wait, both parked
        status, _, first = request(
            conn, "POST", "/v1/invocations/wait", {"ids": [inv], "timeout": 0}, token=admin
        )
        assert status == 200 and first["invocations"] == []
        threads = [
            threading.Thread(target=wait, args=(None,)),
            threading.Thread(target=wait, args=(first["cursor"],)),
        ]
        for t in threads:
            t.start()
        asgi = server.asgi
        wait_for(lambda: len(asgi._parked) >= 2, 5, "the waits were not parked")
        _, _, claimed = request(
            conn, "POST", "/v1/claims", {"queues": ["q"], "worker": "w", "wait": 1}, token=admin
        )
        (c,) = claimed["claims"]
        result = base64.b64encode(wire.encode_result("ok", prefer_msgpack=True)[0]).decode()
        status, _, _ = request(
            conn,
            "POST",
            "/v1/completions",
            {"results": [{"id": inv, "lease_token": c["lease_token"], "result": result}]},
            token=admin,
        )
        assert status == 200
        for _ in threads:
            status, answer, took = got.get(timeout=5)
            assert status == 200, answer
            assert [v["id"] for v in answer["invocations"]] == [inv]
            assert took < 4.5
        for t in threads:
            t.join(5)
        # an empty parked wait answers at its own deadline, not before and not much after
        began = time.monotonic()
        _, _, again = request(
            conn, "POST", "/v1/claims", {"queues": ["q"], "worker": "w", "wait": 0.6}, token=admin
        )
        assert again == {"claims": []} and 0.55 < time.monotonic() - began < 3
        conn.close()


def bare_adapter(resolver: Any = None) -> tuple[Plane, PlaneASGI]:
    """The server's adapter over an in-memory plane, without a server: its wake-up
    bookkeeping driven from an event loop of the test's own (see on_this_loop)."""

    class Empty:
        def resolve(self, event: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return {}

    plane = Plane(SqliteStore(":memory:"))
    parks = lambda method, path, size: True  # noqa: E731
    return plane, PlaneASGI(resolver or Empty(), changes=plane.changes, parks=parks)


async def never_hangs_up() -> dict[str, Any]:
    """An ASGI ``receive`` whose client stays (after the body, it would tell a hang-up)."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def test_a_parked_claim_whose_client_hung_up_takes_no_work(tmp_path: Path) -> None:
    # Given a worker's claim parked on serve, and the worker killed (its socket closed)
    with LocalServer(tmp_path / "plane.db") as server:
        assert server.asgi is not None and server.admin_token is not None
        admin = server.admin_token
        conn = connect(server.url)
        sub = {"invocations": [{"queue": "gone", "ref": "math:sqrt", "args": [4]}]}
        body = {"queues": ["gone"], "worker": "killed", "wait": 10}
        request(conn, "POST", "/v1/queues", {"name": "gone"}, token=admin)
        dead = socket.create_connection(conn.sock.getpeername())
        payload = json.dumps(body).encode()
        dead.sendall(
            b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {admin}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        wait_for(lambda: len(server.asgi._parked) == 1)  # type: ignore[union-attr]
        dead.close()  # (its claim would wait 10 s: it is dropped when the server hears)
        wait_for(lambda: server.asgi.dropped == 1, timeout=3)  # type: ignore[union-attr]
        assert not server.asgi._parked
        # When a call comes
        status, _, answer = request(conn, "POST", "/v1/invocations", sub, token=admin)
        assert status == 200, answer
        ids = answer["ids"]
        # Then it is not leased to the closed connection: the next claim gets it at once
        began = time.monotonic()
        claim = {**body, "worker": "w"}
        status, _, answer = request(conn, "POST", "/v1/claims", claim, token=admin)
        assert status == 200 and [c["id"] for c in answer["claims"]] == ids
        assert time.monotonic() - began < 5
        conn.close()


def parking_adapter(nap: float) -> tuple[Plane, PlaneASGI, list[int]]:
    """A bare adapter whose every request parks (looking again after ``nap`` seconds),
    and a list that grows by one each time a request is looked at."""
    looks: list[int] = []
    plane = Plane(SqliteStore(":memory:"))
    changes = plane.changes

    class Resolver:
        def resolve(self, event: dict[str, Any], ctx: Any) -> dict[str, Any]:
            looks.append(1)
            changes.wait(changes.generation, nap, until=time.monotonic() + 10)  # parks
            return {"statusCode": 200, "headers": {}, "body": "{}"}

    parks = lambda method, path, size: True  # noqa: E731
    return plane, PlaneASGI(Resolver(), changes=changes, parks=parks), looks


def test_a_parked_claim_that_hangs_up_as_a_wake_comes_is_not_resolved_again() -> None:
    # Given a claim parked on the adapter, its client's receive() under the test's hand
    plane, asgi, looks = parking_adapter(10.0)
    changes = plane.changes

    async def run() -> Any:
        hang_up: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        async def receive() -> dict[str, Any]:
            return await hang_up

        event = {"requestContext": {"requestId": "r"}}
        task = asyncio.ensure_future(asgi._answer_parked(event, {}, receive))
        await asyncio.sleep(0)  # it looks once and parks
        await asyncio.sleep(0)  # (its watch on receive() starts)
        assert len(asgi._parked) == 1 and len(looks) == 1
        # When a submit wakes it and its client hangs up in the same turn of the loop
        changes.notify(1)
        hang_up.set_result({"type": "http.disconnect"})
        return await asyncio.wait_for(task, 5)

    try:
        # Then it is dropped without a second look (which could have leased the work)
        assert asyncio.run(run()) == _GONE and len(looks) == 1
    finally:
        asgi.close(timeout=1)
        plane.close()


def on_this_loop(asgi: PlaneASGI, loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` the adapter's, as its first parked request would."""
    asgi._loop, asgi._loop_thread = loop, threading.get_ident()


def test_a_submit_wakes_as_many_parked_claims_as_records_and_a_wake_is_passed_on(
    tmp_path: Path,
) -> None:
    # The adapter's wake-up bookkeeping, on its own event loop with parks as a server
    # holds them: five claims parked before a submit of one record, one result wait.
    plane, asgi = bare_adapter()
    changes = plane.changes

    async def run() -> None:
        loop = asyncio.get_running_loop()
        on_this_loop(asgi, loop)
        gen, fin = changes.generation, changes.finishes
        other = loop.create_future()  # parked first, on another queue
        asgi._parked[other] = Park("generation", gen, 10.0, time.monotonic() + 10, False, {"b"})  # type: ignore[arg-type]
        claims = [loop.create_future() for _ in range(5)]
        result = loop.create_future()
        for f in claims:
            asgi._parked[f] = Park("generation", gen, 10.0, time.monotonic() + 10)
        asgi._parked[result] = Park("finishes", fin, 10.0, time.monotonic() + 10)
        changes.notify(1, {"a"})  # a submit of one record to queue "a"
        await asyncio.sleep(0)
        assert not other.done()  # the new work is not on its queue
        assert [f.done() for f in claims] == [True, False, False, False, False]
        assert not result.done()  # a submit is no finish
        # the first found nothing: the next claim that has not seen the change and may
        # take work on the queue of the wake ("a") wakes, not the one idle on "b"
        assert asgi._woken_for[claims[0]] == {"a"}
        asgi._pass_on(asgi._woken_for[claims[0]])
        assert not other.done() and [f.done() for f in claims] == [True, True] + [False] * 3
        asgi._pass_on(frozenset())  # a wake for work on unknown queues: any claim
        assert other.done() and [f.done() for f in claims] == [True, True] + [False] * 3
        changes.notify()  # a change worth every wait (a release, a sweep)
        await asyncio.sleep(0)
        assert all(f.done() for f in claims) and other.done() and not result.done()
        again = loop.create_future()
        asgi._parked[again] = Park("generation", gen, 10.0, time.monotonic() + 10)  # stale
        changes._finishes += 1
        changes._tell(0)  # a finish: result waits wake, claim waits do not
        await asyncio.sleep(0)
        assert result.done() and not again.done()

    try:
        asyncio.run(run())
    finally:
        asgi.close(timeout=1)
        plane.close()


def test_large_bodies_and_waits_go_to_threads_short_requests_stay_on_the_loop(
    tmp_path: Path,
) -> None:
    server = LocalServer(tmp_path / "plane.db")
    assert server.answers_inline("POST", "/v1/invocations", 2_000)
    # a submit carrying a megabyte of blobs would hold up every request on the loop
    assert not server.answers_inline("POST", "/v1/invocations", INLINE_BODY + 1)
    assert not server.answers_inline("PUT", "/v1/blobs/" + "0" * 64, 10)
    assert not server.answers_inline("POST", "/v1/claims", 100)
    assert server.parks("POST", "/v1/claims", 100)
    assert not server.parks("POST", "/v1/invocations/wait", PARK_BODY + 1)


def test_two_submits_in_one_turn_reach_a_claim_on_each_queue(tmp_path: Path) -> None:
    # parked q1, q2, r1; a submit to q and one to r before the loop wakes anyone
    plane, asgi = bare_adapter()
    changes = plane.changes

    async def run() -> None:
        loop = asyncio.get_running_loop()
        on_this_loop(asgi, loop)
        gen = changes.generation
        parked = {name: loop.create_future() for name in ("q1", "q2", "r1")}
        for name, f in parked.items():
            queues = frozenset({name[0]})
            asgi._parked[f] = Park("generation", gen, 10.0, time.monotonic() + 10, False, queues)
        changes.notify(1, {"q"})
        changes._finishes += 1
        changes._tell(0)  # a finish in the same turn changes nothing for claims
        changes.notify(1, {"r"})
        await asyncio.sleep(0)
        woke = [n for n, f in parked.items() if f.done()]
        assert woke == ["q1", "q2"]
        # q1 took the q job, q2 found nothing: its pass-on (for work on q or r) reaches r1
        assert asgi._woken_for[parked["q2"]] == {"q", "r"}
        asgi._pass_on(asgi._woken_for[parked["q2"]])
        assert parked["r1"].done()

    try:
        asyncio.run(run())
    finally:
        asgi.close(timeout=1)
        plane.close()


def test_a_parked_request_answers_at_once_when_the_plane_closes(tmp_path: Path) -> None:
    plane, asgi, looks = parking_adapter(0.25)

    async def run() -> float:
        task = asyncio.ensure_future(
            asgi._answer_parked({"requestContext": {"requestId": "r"}}, {}, never_hangs_up)
        )
        await asyncio.sleep(0)  # one turn: the request looks once and parks
        assert len(asgi._parked) == 1 and len(looks) == 1
        began = time.monotonic()
        plane.close()  # (without a server stop)
        await asyncio.wait_for(task, 5)
        return time.monotonic() - began

    assert asyncio.run(run()) < 1 and len(looks) == 2  # looked again once, then answered
    asgi.close(timeout=1)


def test_the_requests_serve_holds_open_are_a_gauge(served: Served) -> None:
    # Given an idle worker's claim held by the server
    admin = served.token
    assert admin is not None
    worker = make_token(served.url, admin, "worker")
    producer = make_token(served.url, admin, "producer")
    answered: list[Any] = []

    def claim() -> None:
        conn = connect(served.url)
        body = {"queues": ["gauge"], "worker": "w", "wait": 20}
        answered.append(request(conn, "POST", "/v1/claims", body, token=worker))
        conn.close()

    thread = threading.Thread(target=claim)
    thread.start()
    claiming = 'lakeshore_serve_held_requests{kind="claim"} 1'
    wait_for(lambda: claiming in held_requests(served.url, admin))
    assert 'lakeshore_serve_held_requests{kind="wait"} 0' in held_requests(served.url, admin)
    # When work comes, the claim is answered, and no longer held
    conn = connect(served.url)
    sub = {"invocations": [{"queue": "gauge", "ref": "math:sqrt", "args": [4]}]}
    assert request(conn, "POST", "/v1/invocations", sub, token=producer)[0] == 200
    conn.close()
    thread.join(10)
    assert answered and len(answered[0][2]["claims"]) == 1
    assert 'lakeshore_serve_held_requests{kind="claim"} 0' in held_requests(served.url, admin)


def test_a_request_http_cannot_parse_gets_a_400_in_the_apis_shape(served: Served) -> None:
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /v1/queues HTTP/1.1\r\nHost: x\r\ncontent-length: ]3\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head
    assert json.loads(body)["error"]["code"] == "invalid_request"


# --- the short lane -------------------------------------------------------------------------------


def _make_queues(url: str, admin: str, *names: str) -> None:
    conn = connect(url)
    for name in names:
        assert request(conn, "POST", "/v1/queues", {"name": name}, token=admin)[0] == 200
    conn.close()


def _hello(token: str) -> bytes:
    """A raw ``GET /v1/hello`` with ``token``."""
    return b"GET /v1/hello HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n" % (
        token.encode()
    )


def _raw(url: str, data: bytes, answers: int = 1, *, until_closed: bool = False) -> list[bytes]:
    """Send ``data`` as it is on one connection; the whole answers read back, in order
    (each its head and its Content-Length body), or everything until the server closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        got = b""
        out: list[bytes] = []
        while len(out) < answers or until_closed:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
            while b"\r\n\r\n" in got:
                head, _, rest = got.partition(b"\r\n\r\n")
                size = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
                if data.startswith(b"HEAD "):
                    size = 0  # (a HEAD answer's length is its GET's, and it has no body)
                if len(rest) < size:
                    break
                out.append(head + b"\r\n\r\n" + rest[:size])
                got = rest[size:]
    return out if not until_closed else [*out, got]


def _undated(answer: bytes) -> bytes:
    """An answer without its times (the date header, hello's clock, and so its length:
    the body was read by it)."""
    return re.sub(rb'(date|content-length): [^\r]*\r\n|"time":[0-9.]+', b"", answer)


def test_short_requests_answered_at_once_are_the_answers_of_the_asgi_app(tmp_path: Path) -> None:
    """A submit, a hello, claims and waits, their refusals: each answered by the
    protocol's short lane (no ASGI cycle; the waiting ones parked) is byte for byte what
    uvicorn and the ASGI app answer, but its date."""
    with LocalServer(tmp_path / "plane.db") as server:
        assert server.asgi is not None and server.admin_token is not None
        admin, url = server.admin_token, server.url
        producer = make_token(url, admin, "producer")
        _make_queues(url, admin, "lane", "idle")
        submit = json.dumps(
            {"invocations": [{"id": "lane-1", "queue": "lane", "ref": "math:sqrt", "args": [4]}]}
        ).encode()
        claim = json.dumps({"queues": ["idle"], "worker": "w", "wait": 0.05}).encode()
        wait = json.dumps({"ids": ["lane-1"], "timeout": 0.05}).encode()
        blob = os.urandom(INLINE_BODY)  # (a submit over the loop's size: a request thread)
        large = json.dumps(
            {
                "invocations": [{"id": "lane-2", "queue": "lane", "ref": "math:sqrt", "args": [9]}],
                "blobs": {hashlib.sha256(blob).hexdigest(): base64.b64encode(blob).decode()},
            }
        ).encode()

        def req(method: str, path: str, body: bytes = b"", token: str | None = producer) -> bytes:
            auth = b"Authorization: Bearer %s\r\n" % token.encode() if token else b""
            return (
                b"%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s"
                % (method.encode(), path.encode(), auth, len(body), body)
            )

        requests = [
            req("GET", "/v1/hello"),
            req("HEAD", "/v1/hello"),  # 405 (with its length, no body)
            req("GET", "/v1/hello", token=None),  # 401
            req("POST", "/v1/invocations", submit),  # 200: the same id again is a replay
            req("POST", "/v1/invocations", large),  # 200, as a replay too
            req("POST", "/v1/invocations", b'{"invocations": [}'),  # 400
            req("GET", "/v1/queues/lane?x=1"),
            req("GET", "/v1/nowhere"),  # 404
            # waiting requests, parked until their time is up
            req("POST", "/v1/claims", claim, token=admin),  # nothing to claim
            req("POST", "/v1/claims", claim),  # 403: a producer's token
            req("POST", "/v1/invocations/wait", wait),  # not run: still pending
        ]
        before = server.asgi.answered_now
        server.asgi.lane = False
        through_asgi = [_undated(_raw(url, r)[0]) for r in requests]
        assert server.asgi.answered_now == before
        server.asgi.lane = True
        at_once = [_undated(_raw(url, r)[0]) for r in requests]
        assert server.asgi.answered_now == before + len(requests)
    assert at_once == through_asgi
    statuses = [int(a.split(b" ")[1]) for a in at_once]
    assert statuses == [200, 405, 401, 200, 200, 400, 200, 404, 200, 403, 200]


def test_the_short_lane_keeps_the_order_of_answers_and_the_connection_rules(
    tmp_path: Path,
) -> None:
    with LocalServer(tmp_path / "plane.db") as server:
        assert server.asgi is not None and server.admin_token is not None
        url, admin = server.url, server.admin_token
        worker = make_token(url, admin, "worker", ["lane"])
        _make_queues(url, admin, "lane")
        hello = _hello(admin)
        claim_body = json.dumps({"queues": ["lane"], "worker": "w", "wait": 0.3}).encode()
        claim = (
            b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (worker.encode(), len(claim_body), claim_body)
        )
        # A short request behind a waiting claim on the same connection is answered
        # after it (uvicorn's pipeline), not at once
        first, second = _raw(url, claim + hello, 2)
        assert b'"claims"' in first and b'"identity"' in second
        # Two short ones at once: both, in order, on a connection kept open (the second
        # through uvicorn: the lane takes one request a read)
        before = server.asgi.answered_now
        a, b = _raw(url, hello + hello.replace(b"/v1/hello", b"/v1/hello?again=1"), 2)
        assert a.startswith(b"HTTP/1.1 200") and b.startswith(b"HTTP/1.1 200")
        assert server.asgi.answered_now == before + 1
        assert b"connection: close" not in a.lower()
        # Connection: close, and HTTP/1.0: answered, then the server closes
        for ask in (
            hello.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"),
            hello.replace(b"HTTP/1.1", b"HTTP/1.0"),
        ):
            answer, rest = _raw(url, ask + hello, until_closed=True)
            assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer
            assert rest == b""  # (the request behind it went unanswered: closed)
        assert server.asgi.answered_now == before + 3


def test_a_short_request_caught_by_a_stop_mid_body_is_answered_then_closed(
    tmp_path: Path,
) -> None:
    server = LocalServer(tmp_path / "plane.db")
    server.start()
    try:
        assert server.admin_token is not None and server.uvicorn is not None
        body = json.dumps({"role": "producer"}).encode()
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/tokens HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (server.admin_token.encode(), len(body), body[:5])
            )
            connections = server.uvicorn.server_state.connections
            wait_for(lambda: any(getattr(c, "_lane", None) for c in connections))
            server.request_stop()
            # the server's shutdown reaches the connection: it will close once answered
            wait_for(lambda: all(not c._lane[3] for c in connections if c._lane))  # type: ignore[attr-defined]
            sock.sendall(body[5:])
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503") and b"connection: close" in answer
    finally:
        server.stop()


def _claim_request(token: str, wait: float) -> bytes:
    body = json.dumps({"queues": ["held"], "worker": "w", "wait": wait}).encode()
    return (
        b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s"
        % (token.encode(), len(body), body)
    )


def test_a_stop_answers_a_held_claim_503_and_closes_its_connection(tmp_path: Path) -> None:
    """A claim parked by the short lane is cut by a stop as one parked through ASGI is."""
    server = LocalServer(tmp_path / "plane.db")
    server.start()
    try:
        assert server.asgi is not None and server.admin_token is not None
        admin = server.admin_token
        _make_queues(server.url, admin, "held")
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(_claim_request(admin, 10))
            wait_for(lambda: len(server.asgi._parked) == 1)  # type: ignore[union-attr]
            began = time.monotonic()
            server.request_stop()
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503") and b'"unavailable"' in answer
        assert time.monotonic() - began < 5  # (answered, then the connection closed)
    finally:
        server.stop()


def test_the_short_lane_keeps_uvicorns_keep_alive_flow_control_and_close(tmp_path: Path) -> None:
    """Behind a short answer in the same segment, the keep-alive timer does not cut a
    waiting request; a client that does not read its answers is not answered into an
    unbounded buffer (its requests go to uvicorn, whose cycle waits for the drain, and
    reading pauses); a
    request behind one that closes the connection is never run (the parser refuses what
    follows)."""
    with LocalServer(tmp_path / "plane.db") as server:
        assert server.asgi is not None and server.admin_token is not None
        assert server.uvicorn is not None
        admin, url = server.admin_token, server.url
        _make_queues(url, admin, "held")
        hello = _hello(admin)
        # a claim waiting 1 s behind a hello, with a keep-alive of 0.3 s
        server.uvicorn.config.timeout_keep_alive = 0.3  # type: ignore[assignment]
        first, second = _raw(url, hello + _claim_request(admin, 1.0), 2)
        assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
        assert b'"claims":[]' in second
        server.uvicorn.config.timeout_keep_alive = 65
        # a client sending requests one at a time and reading no answer
        n = 400
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.socket() as sock:
            # small buffers both ways: the answers back up in the server's transport
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(30)
            sock.connect((host, int(port)))
            connections = server.uvicorn.server_state.connections
            me = sock.getsockname()
            wait_for(lambda: any(tuple(c.client) == me for c in list(connections)))  # type: ignore[attr-defined]
            (c,) = [c for c in list(connections) if tuple(c.client) == me]  # type: ignore[attr-defined]
            c.transport.get_extra_info("socket").setsockopt(  # type: ignore[attr-defined]
                socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
            )
            before = server.asgi.answered_now
            state = server.uvicorn.server_state
            done_before = state.total_requests

            def read() -> int:
                """The requests of this connection the server has read so far."""
                cycle = c.cycle  # type: ignore[attr-defined]
                busy = int(cycle is not None and not cycle.response_complete)
                return state.total_requests - done_before + len(c.pipeline) + busy  # type: ignore[attr-defined]

            sent = 0
            while sent < n and not c.flow.read_paused:  # type: ignore[attr-defined]
                sock.sendall(hello)
                sent += 1
                wait_for(lambda k=sent: read() >= k or c.flow.read_paused, every=0.001)  # type: ignore[attr-defined]
            # the lane stopped once the answers backed up; uvicorn's cycle waits for the
            # drain, and reading pauses
            assert sent < n and server.asgi.answered_now - before < n // 2
            assert c.transport.get_write_buffer_size() < 1 << 17  # type: ignore[attr-defined]
            got = b""
            while got.count(b"HTTP/1.1 200") < sent:
                chunk = sock.recv(1 << 20)
                assert chunk
                got += chunk
        # a submit behind a request that closes the connection
        sub = json.dumps(
            {"invocations": [{"id": "behind", "queue": "held", "ref": "math:sqrt", "args": [4]}]}
        ).encode()
        submit = (
            b"POST /v1/invocations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (admin.encode(), len(sub), sub)
        )
        closing = hello.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
        answer, rest = _raw(url, closing + submit, until_closed=True)
        assert answer.startswith(b"HTTP/1.1 200") and rest == b""
        conn = connect(url)
        assert request(conn, "GET", "/v1/invocations/behind", token=admin)[0] == 404
        conn.close()


def test_a_bug_under_a_short_answer_is_a_500_logged_not_a_400(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import dreamlake.lakeshore.server as server_module

    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("a bug")

    with LocalServer(tmp_path / "plane.db") as server:
        assert server.admin_token is not None
        monkeypatch.setattr(server_module, "_http_event", broken)
        (answer,) = _raw(server.url, _hello(server.admin_token))
    assert answer.startswith(b"HTTP/1.1 500") and b'"internal error"' in answer
    assert "a bug" in caplog.text
