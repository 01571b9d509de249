"""Lakeshore's pytest plugin: a plane, a served plane and workers for your tests.

Installed with the package (entry point ``pytest11``), so the fixtures are there in any
project that has Lakeshore installed; ``-p no:lakeshore`` turns them off.

``lakeshore_plane``
    An embedded plane, ``Dispatch(":memory:")``, closed after the test. It has the remote
    semantics (arguments and results are serialised as over HTTP), so a test that passes
    here behaves the same against a deployed plane::

        def test_square(lakeshore_plane, lakeshore_worker):
            q = dls.SyncQueue("squares", dispatch=lakeshore_plane)
            lakeshore_worker(q)
            assert q.result(square.submit(3, _dispatch=lakeshore_plane), timeout=10) == 9

``lakeshore_server``
    A plane served over HTTP on loopback (``lakeshore serve`` in a thread, a SQLite file
    in a temporary folder, tokens on), stopped after the test. It has ``url``,
    ``admin_token``, ``plane_path``, and ``dispatch(role="producer", queues=["*"])``,
    which makes a token with that role and those queue scopes through the API
    (``POST /v1/tokens``) and returns a remote ``Dispatch(url, token=...)``::

        def test_scopes(lakeshore_server):
            producer = lakeshore_server.dispatch("producer", queues=["jobs-*"])
            worker = lakeshore_server.dispatch("worker")

    Needs the ``serve`` extra (uvicorn, aws-lambda-powertools).

``lakeshore_worker``
    A factory: ``lakeshore_worker(queue, dispatch=None, count=1)`` starts ``count``
    threads running :func:`~dreamlake.lakeshore.run_worker` on ``queue`` (a queue handle
    or a name) and returns a :class:`WorkerGroup`. The plane is ``dispatch`` if given,
    else the handle's own Dispatch, else ``lakeshore_plane``'s. Every worker is stopped
    and joined after the test, before the plane it runs against is closed; an exception
    that ended a worker thread fails the test at teardown.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .dispatch import Dispatch
from .queue import SyncQueue, _QueueHandle
from .worker import run_worker

__all__ = [
    "LakeshoreServer",
    "WorkerGroup",
    "lakeshore_plane",
    "lakeshore_server",
    "lakeshore_worker",
]

#: how long teardown waits for one worker thread to finish its job and stop
_JOIN_SECONDS = 30.0


class WorkerGroup:
    """Worker threads serving one queue; :meth:`stop` ends and joins them."""

    def __init__(self, queue: _QueueHandle, dispatch: Dispatch, count: int, **options: Any) -> None:
        self.queue = queue
        self.dispatch = dispatch
        self._stop = threading.Event()
        #: invocations each thread ran, filled in as the threads end
        self.ran: list[int] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(
                target=self._run, args=(options,), name=f"lakeshore-worker-{queue.name}-{i}"
            )
            for i in range(count)
        ]
        for t in self.threads:
            t.daemon = True
            t.start()

    def _run(self, options: dict[str, Any]) -> None:
        try:
            ran = run_worker(self.queue, stop=self._stop.is_set, dispatch=self.dispatch, **options)
        except BaseException as exc:
            with self._lock:
                self.errors.append(exc)
        else:
            with self._lock:
                self.ran.append(ran)

    def stop(self, timeout: float = _JOIN_SECONDS) -> None:
        """Stop claiming, let jobs in hand finish, join; raise what ended a thread
        (once: stopping again after that is a no-op)."""
        self._stop.set()
        for t in self.threads:
            t.join(timeout)
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"worker threads still running after {timeout}s: {alive}")
        with self._lock:
            errors, self.errors = self.errors, []
        if errors:
            raise errors[0]


class LakeshoreServer:
    """A plane served over HTTP on loopback (the ``lakeshore_server`` fixture)."""

    def __init__(self, url: str, admin_token: str, plane_path: Path) -> None:
        self.url = url
        self.admin_token = admin_token
        self.plane_path = plane_path
        self._dispatches: list[Dispatch] = []

    def token(
        self, role: str = "producer", queues: Sequence[str] = ("*",), name: str = "pytest"
    ) -> str:
        """A new token with this role and these queue scopes (made through the API)."""
        request = urllib.request.Request(
            f"{self.url}/v1/tokens",
            method="POST",
            data=json.dumps({"role": role, "queues": list(queues), "name": name}).encode(),
            headers={
                "Authorization": f"Bearer {self.admin_token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return str(json.load(answer)["token"])

    def dispatch(self, role: str = "producer", queues: Sequence[str] = ("*",)) -> Dispatch:
        """A remote Dispatch on this plane with a new token of ``role`` (closed after)."""
        dp = Dispatch(self.url, token=self.token(role, queues))
        self._dispatches.append(dp)
        return dp

    def close(self) -> None:
        for dp in self._dispatches:
            dp.close()
        self._dispatches.clear()


_GROUPS = pytest.StashKey[list[WorkerGroup]]()


def _stop_workers(stash: pytest.Stash, dispatch: Dispatch | None = None) -> None:
    """Stop the test's worker groups (those on ``dispatch`` only, when given)."""
    groups = stash.get(_GROUPS, [])
    mine = [g for g in groups if dispatch is None or g.dispatch is dispatch]
    for group in mine:
        groups.remove(group)
    errors: list[BaseException] = []
    for group in mine:
        try:
            group.stop()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def lakeshore_plane(request: pytest.FixtureRequest) -> Iterator[Dispatch]:
    """An embedded in-memory plane, ``Dispatch(":memory:")``, closed after the test."""
    dp = Dispatch(":memory:")
    yield dp
    try:
        _stop_workers(request.node.stash, dp)
    finally:
        dp.close()


@pytest.fixture
def lakeshore_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeshoreServer]:
    """A plane served over HTTP on loopback in a temporary folder, stopped after."""
    from .server import serve_in_thread

    path = tmp_path_factory.mktemp("lakeshore") / "plane.db"
    with serve_in_thread(path) as (url, admin_token):
        assert admin_token is not None  # a fresh plane always gets one
        server = LakeshoreServer(url, admin_token, path)
        try:
            yield server
        finally:
            try:
                for dp in server._dispatches:
                    _stop_workers(request.node.stash, dp)
            finally:
                server.close()


@pytest.fixture
def lakeshore_worker(
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., WorkerGroup]]:
    """``lakeshore_worker(queue, dispatch=None, count=1)``: worker threads, joined after."""
    groups = request.node.stash.setdefault(_GROUPS, [])

    def start(
        queue: _QueueHandle | str, dispatch: Dispatch | None = None, count: int = 1, **kw: Any
    ) -> WorkerGroup:
        if count < 1:
            raise ValueError("count must be at least 1")
        if isinstance(queue, str):
            dp = dispatch or request.getfixturevalue("lakeshore_plane")
            handle: _QueueHandle = SyncQueue(queue, dispatch=dp)
        else:
            handle = queue
            dp = dispatch or handle._dispatch or request.getfixturevalue("lakeshore_plane")
        group = WorkerGroup(handle, dp, count, **kw)
        groups.append(group)
        return group

    yield start
    _stop_workers(request.node.stash)
