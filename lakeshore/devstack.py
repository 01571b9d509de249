"""``lakeshore dev``: the AWS path on one machine, for users who test their stack with moto.

::

    SDK / workers ──HTTP + token──▶ DevServer = lakeshore serve's adapter (uvicorn → API GW
                                      │         v2 events → thread-safe powertools router)
                                      │ handlers.api.make_app(Service(plane))  the Lambda's code
                                      ▼
                                Plane(DynamoStore) ──boto3──▶ moto server on 127.0.0.1
                                      ▲                       one lock around its WSGI app;
            Sweeper thread: plane.sweep()                     tables + bucket built from
            every ``sweep_every`` s (the template's schedule) template.yaml (infra/tables.py)

The same handlers behind the same adapter as ``lakeshore serve``; only the store differs,
and it is the store the deployed stack uses, talking to moto instead of AWS. Everything
lives in this process's memory: stopping the stack drops its account (and its tables).

:class:`DevStack` is the whole thing (the command and tests use it);
:func:`dev_in_thread` is the programmatic form, yielding ``(url, admin_token,
moto_endpoint)``. A producer or worker may also reach the tables directly with
``Dispatch(stack.aws_target)`` (``aws://env?region=...&endpoint=...``).

One dev stack per process: moto's backends are process-wide state, shared by every moto
server and every ``mock_aws`` in the process (and ``mock_aws`` patches botocore for the
whole process, so clients meant for the server would be intercepted). Do not run a
``mock_aws`` block while a dev stack runs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from .api.service import Limits
from .awsdirect import LOCAL_CREDENTIALS
from .server import DEFAULT_THREADS, LocalServer
from .stores.keys import TABLE_RESOURCES, Resources

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer

    from .plane import Plane

__all__ = [
    "DEFAULT_REGION",
    "DEFAULT_SWEEP_EVERY",
    "DevServer",
    "DevStack",
    "SerialisedWSGI",
    "Sweeper",
    "dev_in_thread",
    "moto_server",
]

log = logging.getLogger("dreamlake.lakeshore.dev")

#: the region of the dev account (moto keeps each region's tables apart)
DEFAULT_REGION = "us-east-1"
#: seconds between sweeps, as the stack's scheduled sweeper runs (``rate(1 minute)``)
DEFAULT_SWEEP_EVERY = 60.0

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


# --- the moto server -----------------------------------------------------------------------


class SerialisedWSGI:
    """A WSGI app that lets one request at a time into ``app`` (the moto server's).

    Why: moto is not atomic under concurrent requests. It evaluates a conditional
    ``UpdateItem`` (read the item, check the condition, write) in plain Python on the
    request's thread, over backend dicts that every request thread shares, with nothing
    making the check and the write one step. Two workers claiming the same pending
    invocation can both find ``state = pending`` and both win: a double claim, which
    DynamoDB's conditional writes exclude and on which the plane's first invariant rests
    (a result is recorded once). AWS-NOTES saw double claims under moto in both modes;
    here, tests/test_dev.py's race (4 workers, 300 jobs) run without this lock
    double-claimed a job; with it, no run has.

    One lock for the whole server is coarser than DynamoDB's per-item atomicity, but it
    is the only granularity a WSGI wrapper has, and moto's work per request is a few
    milliseconds. The lock covers that work only: the request body is read before it is
    taken and the response body is drained into memory before it is released, so a
    slow client never holds it.
    """

    def __init__(self, app: WSGIApp, lock: threading.Lock | None = None) -> None:
        self.app = app
        #: taken around every request into ``app``
        self.lock = lock or threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        _buffer_body(environ)
        with self.lock:
            answer = self.app(environ, start_response)
            try:
                chunks = list(answer)
            finally:
                close = getattr(answer, "close", None)
                if close is not None:
                    close()
        return chunks


def _buffer_body(environ: dict[str, Any]) -> None:
    """Read the request body now (outside the lock) and hand the app a copy."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return
    length = environ.get("CONTENT_LENGTH") or ""
    if length.isdigit():
        data = stream.read(int(length))
    elif environ.get("wsgi.input_terminated"):  # chunked: the server ends the stream
        data = stream.read()
    else:
        return
    environ["wsgi.input"] = io.BytesIO(data)
    environ["CONTENT_LENGTH"] = str(len(data))
    environ["wsgi.input_terminated"] = False


def moto_server(port: int = 0, *, host: str = "127.0.0.1") -> ThreadedMotoServer:
    """A moto server (not started) on ``host:port`` whose requests are serialised by
    :class:`SerialisedWSGI` and not logged. ``port=0`` picks a free port."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class QuietHandler(MotoRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass  # one line per request would drown the dev output

    class SerialisedMotoServer(ThreadedMotoServer):
        # ThreadedMotoServer builds its app inside the server thread; this is its
        # _server_entry with the app wrapped (and the request log off).
        def _server_entry(self) -> None:
            app = SerialisedWSGI(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(
                self._ip_address, self._port, app, True, request_handler=QuietHandler
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    return SerialisedMotoServer(host, port, verbose=False)


def _reset_moto(endpoint: str) -> None:
    """Drop every resource of the process's moto account (moto's own reset API)."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


# --- the plane's parts -----------------------------------------------------------------------


#: seconds a result wait blocks in the API function of a stack deployed with the
#: template's defaults (its MaxWaitSeconds; LAKESHORE_MAX_WAIT)
STACK_MAX_WAIT = 2.0


class DevServer(LocalServer):
    """``lakeshore serve``'s HTTP front over a plane made by ``open``: the same adapter,
    handlers and token bootstrap; no plane file (``plane_path`` is unused)."""

    name = "lakeshore dev"

    def __init__(self, open: Callable[[], Plane], **options: Any) -> None:
        super().__init__(os.devnull, **options)
        self._open = open

    def open_plane(self) -> Plane:
        return self._open()

    def limits(self) -> Limits:
        # a wait blocks as long as in the deployed API function (the template's
        # MaxWaitSeconds default), so code tried here polls as it will there
        return replace(super().limits(), max_wait=STACK_MAX_WAIT)

    def answers_inline(self, method: str, path: str, size: int = 0) -> bool:
        return False  # every plane call is a round trip to the emulator: use the threads

    def parks(self, method: str, path: str, size: int) -> bool:
        return False  # (and a claim or a wait looks once on AWS: nothing waits inside)


class Sweeper:
    """Calls ``plane.sweep()`` every ``every`` seconds on a thread of its own.

    In AWS a scheduled function sweeps: expired leases go back to pending (or dead) and
    past-retention records are purged even when no worker claims. Here a thread does the
    same on the same schedule. A failed sweep is logged and the next one runs.
    """

    def __init__(self, plane: Plane, every: float) -> None:
        if every <= 0:
            raise ValueError("sweep_every must be positive")
        self.plane = plane
        self.every = every
        #: sweeps made so far, and invocations they handed on or ended
        self.rounds = 0
        self.handled = 0
        self._ended = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lakeshore-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop; wait up to ``timeout`` for a sweep under way to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wait_until(self, done: Callable[[Sweeper], bool], timeout: float) -> bool:
        """Block until ``done(self)`` holds after a round has ended (or now); False
        after ``timeout`` seconds."""
        with self._ended:
            return self._ended.wait_for(lambda: done(self), timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            handled = 0
            try:
                handled = self.plane.sweep()
            except Exception:
                log.exception("sweep failed (the next one runs in %gs)", self.every)
            with self._ended:
                self.handled += handled
                self.rounds += 1
                self._ended.notify_all()


# --- the stack -------------------------------------------------------------------------------


class DevStack:
    """A moto server, the template's tables and bucket in it, a plane over
    :class:`~dreamlake.lakeshore.stores.dynamo.DynamoStore` on them, the API handlers
    served over HTTP, and the sweeper.

    ``start()`` returns once everything answers: :attr:`url` (the API), :attr:`admin_token`
    (the fresh account's first admin token) and :attr:`moto_endpoint` are set. ``stop()``
    stops the HTTP front, the sweeper and the moto server, and drops the account.
    ``port`` is the API's port and ``moto_port`` moto's (0: any free port).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        moto_port: int = 0,
        region: str = DEFAULT_REGION,
        sweep_every: float = DEFAULT_SWEEP_EVERY,
        resources: Resources | None = None,
        threads: int = DEFAULT_THREADS,
        access_log: bool = False,
    ) -> None:
        if sweep_every <= 0:
            raise ValueError("sweep_every must be positive")
        self.port = port
        self.moto_port = moto_port
        self.region = region
        self.sweep_every = sweep_every
        self.resources = resources or Resources()
        self.threads = threads
        self.access_log = access_log
        self.url = ""
        self.admin_token = ""
        self.moto_endpoint = ""
        self.moto: ThreadedMotoServer | None = None
        self.server: DevServer | None = None
        self.sweeper: Sweeper | None = None
        self._clients: tuple[Any, Any] | None = None
        #: the moto account holds what this stack built: stop() drops it
        self._owns_account = False
        #: a stop asked before the HTTP front existed (a signal during start)
        self._stop_asked = False

    @property
    def plane(self) -> Plane:
        """The plane the API serves (while the stack runs)."""
        if self.server is None or self.server.plane is None:
            raise RuntimeError("the dev stack is not running")
        return self.server.plane

    @property
    def aws_target(self) -> str:
        """``Dispatch(...)`` target reaching this stack's tables directly (aws://)."""
        query = urlencode({"region": self.region, "endpoint": self.moto_endpoint}, safe=":/")
        return f"aws://env?{query}"

    def start(self) -> None:
        try:
            self._start_moto()
            self._build()
            self._serve()
        except BaseException:
            self.stop()
            raise

    def _start_moto(self) -> None:
        self.moto = moto_server(self.moto_port)
        self.moto.start()
        host, port = self.moto.get_host_and_port()
        self.moto_endpoint = f"http://{host}:{port}"

    def _build(self) -> None:
        import boto3  # type: ignore[import-untyped]

        from .infra.tables import build_stack
        from .stores.dynamo import make_clients

        session = boto3.Session(region_name=self.region, **LOCAL_CREDENTIALS)
        ddb, s3 = self._clients = make_clients(self.region, self.moto_endpoint, session=session)
        ours = {getattr(self.resources, field) for field in TABLE_RESOURCES.values()}
        found = ours & set(ddb.list_tables()["TableNames"])
        if found:
            raise RuntimeError(
                f"moto in this process already has {', '.join(sorted(found))}: another "
                "dev stack or a mock_aws is running here (one dev stack per process)"
            )
        self._owns_account = True
        build_stack(ddb, s3, self.resources, self.region)

    def _open_plane(self) -> Plane:
        from .handlers.aws import map_errors
        from .plane import Plane
        from .stores.dynamo import DynamoStore

        assert self._clients is not None
        ddb, s3 = self._clients
        # storage failures answer 503 with Retry-After, as in the stack's API function
        store = DynamoStore(self.resources, dynamodb=map_errors(ddb), s3=map_errors(s3))
        return Plane(store)

    def _serve(self) -> None:
        self.server = DevServer(
            self._open_plane, port=self.port, threads=self.threads, access_log=self.access_log
        )
        self.server.start()
        self.url = self.server.url
        # moto's account is fresh on every start, so the bootstrap always makes a token
        assert self.server.admin_token is not None
        self.admin_token = self.server.admin_token
        self.sweeper = Sweeper(self.plane, self.sweep_every)
        self.sweeper.start()
        if self._stop_asked:
            self.server.request_stop()

    def request_stop(self, *, force: bool = False) -> None:
        """Ask the HTTP front to stop (safe from a signal handler, also while the
        stack is starting); see :meth:`LocalServer.request_stop`."""
        self._stop_asked = True
        if self.server is not None:
            self.server.request_stop(force=force)

    @property
    def stopping(self) -> bool:
        return self.server is not None and self.server.stopping

    def wait(self) -> None:
        """Block until the HTTP front stops (signals are handled meanwhile)."""
        if self.server is not None:
            self.server.wait()

    def stop(self) -> bool:
        """Stop everything; True when every request thread ended (see
        :meth:`LocalServer.stop`). Safe to call twice."""
        idle = True
        if self.sweeper is not None:
            self.sweeper.stop()
            self.sweeper = None
        if self.server is not None:
            idle = self.server.stop()
            self.server = None
        if self._clients is not None:
            for client in self._clients:
                client.close()
            self._clients = None
        if self.moto is not None:
            if self._owns_account:
                with contextlib.suppress(OSError):
                    _reset_moto(self.moto_endpoint)
                self._owns_account = False
            self.moto.stop()
            self.moto = None
        return idle

    def __enter__(self) -> DevStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def dev_in_thread(
    port: int = 0,
    *,
    sweep_every: float = DEFAULT_SWEEP_EVERY,
    moto_port: int = 0,
    region: str = DEFAULT_REGION,
) -> Iterator[tuple[str, str, str]]:
    """Run a dev stack while the block runs; yield ``(url, admin_token, moto_endpoint)``.

    ``url`` is the API (``LAKESHORE_URL``), ``admin_token`` the account's first admin
    token, ``moto_endpoint`` the moto server (for boto3 clients, or
    ``Dispatch(f"aws://env?region={region}&endpoint={moto_endpoint}")``).
    """
    stack = DevStack(port=port, moto_port=moto_port, region=region, sweep_every=sweep_every)
    with stack:
        yield stack.url, stack.admin_token, stack.moto_endpoint
