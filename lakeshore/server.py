"""The plane over HTTP on one machine: the server behind ``lakeshore serve``.

::

    client ──HTTP/1.1──▶ uvicorn (httptools parser, uvloop, TCP_NODELAY on every socket)
                           │ PlaneASGI: method, path, query, headers, body (≤ max_body, else 413)
                           │ apigw.http_event(...)          the one module that knows the event
                           ▼
                 a pool of `threads` threads, one per request in flight
                           │ resolver.resolve(event, ctx)   the code the Lambda runs
                           ▼
                 apigw.http_response(...) → one response, Content-Length, one body message

The resolver is synchronous. Short requests are answered on the event loop itself, and
they and the parked ones below come by the *short lane*: uvicorn's protocol, subclassed
(:func:`_protocol`), hands each to the app whole from its parser's callbacks, without an
ASGI cycle, and writes its answer in one write.
Some routes wait (claims with ``wait``, invocation waits: up to ``limits.max_wait``):
with the plane's :class:`~.plane.changes.Changes` given, small ones are *parked* — the
event loop resolves them with waits that do not block (the route answers as if its time
were up and says what it waited for), keeps the request, and resolves it again when the
plane tells of a change it waited for or its nap ends; until its own deadline, then the
last (empty) answer goes out. A submit answered on the loop thus wakes a waiting claim
on the same thread, with no hand-over. Other requests (blob transfers, waits on many ids,
every request of ``lakeshore dev``) run on a thread of a dedicated pool, never on anyio's
40-thread default. A request that finds every thread busy is answered ``503
unavailable`` at once instead of queueing behind long polls.

Powertools' resolver keeps the request it answers on the class (``current_event``,
``lambda_context``) and in one dict (``context``, which carries the route's path
arguments): right in a Lambda, which answers one request at a time, wrong under threads.
:func:`thread_safe` moves that state into thread-locals.

:func:`serve_in_thread` is the programmatic form (tests, the pytest plugin);
:class:`LocalServer` is what both it and the command use.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, cast

from .handlers import apigw

if TYPE_CHECKING:
    import uvicorn

    from .api import Limits
    from .plane import Plane
    from .plane.changes import Changes, Park

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_THREADS",
    "LocalServer",
    "PlaneASGI",
    "serve_in_thread",
    "thread_safe",
]

log = logging.getLogger("dreamlake.lakeshore.server")

#: threads answering requests: every one may sit in a long poll for up to max_wait
DEFAULT_THREADS = 512
#: request body limit of a bare PlaneASGI (LocalServer uses the service's ``max_body``)
DEFAULT_MAX_BODY = 10 * 1024 * 1024
#: seconds in-flight requests get to finish once a stop is asked (long polls are cut)
GRACEFUL_SECONDS = 1.0
#: seconds between checks for writes made to the plane file by other processes
_SHARED_POLL = 0.05
#: the routes that may hold a request for up to ``max_wait``
_WAITING_PATHS = frozenset({"/v1/claims", "/v1/invocations/wait"})
#: a request with a body over this many bytes runs on a thread (a submit carrying its
#: blobs: checking and writing megabytes would hold up every other request on the loop)
INLINE_BODY = 64 * 1024
#: bytes of a streamed blob upload gathered before a request thread hashes and writes
#: them (meanwhile the rest of the body waits in the connection's buffers)
UPLOAD_SLICE = 1024 * 1024
#: seconds a blob transfer may go without a byte moving before it is cut
TRANSFER_IDLE = 60.0
#: seconds a request begun and not ended (its head or its body still arriving) may go
#: without a byte before it is answered 408 and its connection closed (see _protocol; a
#: blob upload's body is bounded by TRANSFER_IDLE instead)
REQUEST_IDLE = 60.0
#: seconds a connection may sit with no request in it — between requests, or from its
#: opening — before the server closes it (idle SDK connections stay open between calls;
#: the client reopens one the server closed)
KEEP_ALIVE = 65
#: a waiting request with a body up to this many bytes is parked on the event loop (a
#: wait on many ids, costlier to look at again on each change, keeps its own thread)
PARK_BODY = 4096

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Resolver(Protocol):
    """What the adapter needs of a powertools resolver."""

    def resolve(self, event: dict[str, Any], context: Any) -> dict[str, Any]: ...


# --- powertools under threads ------------------------------------------------------------


def _per_thread_class(cls: type) -> type:
    """A subclass of a powertools resolver class whose per-request state is per thread.

    Powertools' ``resolve`` assigns ``BaseRouter.current_event`` (a class attribute shared
    by every resolver in the process) and keeps the matched route and its path arguments
    in ``self.context``: two threads answering at once would read each other's request.
    The properties here shadow those names, and ``resolve`` sets them for the calling
    thread before handing over to powertools (whose own class-level assignment then
    goes unread).
    """

    class PerThread(cls):  # type: ignore[misc]
        def _slot(self) -> threading.local:
            return cast(threading.local, self.__dict__["_lakeshore_local"])

        @property
        def current_event(self) -> Any:
            return getattr(self._slot(), "current_event", None)

        @current_event.setter
        def current_event(self, value: Any) -> None:
            self._slot().current_event = value

        @property
        def lambda_context(self) -> Any:
            return getattr(self._slot(), "lambda_context", None)

        @lambda_context.setter
        def lambda_context(self, value: Any) -> None:
            self._slot().lambda_context = value

        @property
        def context(self) -> dict[str, Any]:
            slot = self._slot()
            if not hasattr(slot, "context"):
                slot.context = {}
            return cast(dict[str, Any], slot.context)

        @context.setter
        def context(self, value: dict[str, Any]) -> None:
            self._slot().context = value

        @property
        def processed_stack_frames(self) -> list[str]:
            slot = self._slot()
            if not hasattr(slot, "frames"):
                slot.frames = []
            return cast(list[str], slot.frames)

        @processed_stack_frames.setter
        def processed_stack_frames(self, value: list[str]) -> None:
            self._slot().frames = value

        def resolve(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
            slot = self._slot()
            slot.current_event = self._to_proxy_event(event)
            slot.lambda_context = context
            try:
                return cast(dict[str, Any], super().resolve(event, context))
            finally:
                slot.current_event = slot.lambda_context = None

    PerThread.__name__ = PerThread.__qualname__ = f"ThreadSafe{cls.__name__}"
    PerThread._lakeshore_thread_safe = True
    return PerThread


R = TypeVar("R")
_T = TypeVar("_T")
_safe_classes: dict[type, type] = {}


def thread_safe(app: R) -> R:
    """Make a powertools resolver answer requests from many threads at once (in place).

    Route handlers that read ``app.current_event`` see their own thread's request.
    """
    cls = type(app)
    if getattr(cls, "_lakeshore_thread_safe", False):
        return app
    safe = _safe_classes.get(cls)
    if safe is None:
        safe = _safe_classes[cls] = _per_thread_class(cls)
    app.__dict__["_lakeshore_local"] = threading.local()
    app.__class__ = safe
    return app


class _LocalContext:
    """Stands in for the Lambda context object (nothing here is a Lambda)."""

    function_name = "lakeshore-serve"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:local:000000000000:function:lakeshore-serve"
    memory_limit_in_mb = 0
    log_group_name = log_stream_name = "local"

    def __init__(self, request_id: str) -> None:
        self.aws_request_id = request_id

    def get_remaining_time_in_millis(self) -> int:
        return 900_000


# --- the ASGI adapter --------------------------------------------------------------------


Answer = tuple[int, list[tuple[str, str]], bytes]


class PlaneASGI:
    """An ASGI app answering every request with ``resolver`` (HTTP only; no lifespan).

    ``max_body`` bounds one request body: a larger ``Content-Length`` is refused with 413
    before any of the body is read (a client sending ``Expect: 100-continue`` never sends
    it), a chunked body as soon as it passes the limit. ``threads`` requests run at once;
    one more is ``503 unavailable`` with ``Retry-After``, and so is every request once
    :meth:`stop` is called — including those still waiting in a long poll, so a stopping
    server answers everyone at once (a cut claim or wait is safe to retry).
    """

    def __init__(
        self,
        resolver: Resolver,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        threads: int = DEFAULT_THREADS,
        inline: Callable[[str, str, int], bool] | None = None,
        parks: Callable[[str, str, int], bool] | None = None,
        changes: Changes | None = None,
        fast: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
        uploads: Callable[[dict[str, Any]], Any] | None = None,
        downloads: Callable[[dict[str, Any]], str | dict[str, Any] | None] | None = None,
        sweep: Callable[[], object] | None = None,
        sweep_every: float = 1.0,
        carry: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self.resolver = resolver
        #: the plane's sweep (expired leases handed on, timeouts, purge), run in a
        #: request thread every ``sweep_every`` seconds while claims are parked: a
        #: parked claim is looked at again only when its work comes due, so it is not
        #: what sweeps (see :meth:`_sweeping`)
        self.sweep = sweep
        self.sweep_every = max(sweep_every, 0.05)
        self._sweeper: asyncio.Future[None] | None = None
        #: answers what it can before the resolver does (None: ask the resolver); see
        #: handlers.api.fast_path
        self.fast = fast
        #: opens a streamed blob upload (``PUT /v1/blobs/{digest}``) from the request's
        #: event without its body: an upload to write the body into, or the answer
        #: refusing it; see handlers.api.upload_path
        self.uploads = uploads
        #: blob transfers under way (each holds no request thread while it waits on
        #: the network; at most ``threads`` at once)
        self._transfers = 0
        #: whether the plane answers short requests on the loop (then a transfer's
        #: checks run there too; else in a request thread)
        self._quick = inline is not None and inline("GET", "/v1/hello", 0)
        #: the same for ``GET /v1/blobs/{digest}``: the path of the blob's file to send
        #: in pieces, the answer refusing it, or None (the resolver answers it)
        self.downloads = downloads
        #: requests ``inline(method, path, body size)`` accepts are answered on the loop
        self.inline = inline
        #: the first half of a submit too large for the loop, carrying blobs: in a request
        #: thread, its blobs checked and stored; the event of the rest, which the loop
        #: resolves (where its call may be handed to a parked claim); None: resolved whole
        #: in the thread. Only where the loop answers short requests; see
        #: handlers.api.carry_path
        self.carry = carry if self._quick else None
        #: requests ``parks(method, path, body size)`` accepts are parked (with ``changes``)
        self.parks = parks if changes is not None else None
        self.changes = changes
        self.max_body = max_body
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lakeshore-api")
        self._idle = threading.Condition()
        #: requests handed to the pool and not yet answered (never more than ``threads``),
        #: and the slices of blob transfers being hashed, written or read there
        self.in_flight = 0
        #: parked requests dropped because their client hung up
        self.dropped = 0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: answers being awaited (event loop only) → the request's headers
        self._waiting: dict[asyncio.Future[Answer | None], Mapping[str, str]] = {}
        #: parked requests' wake-ups (event loop only) → what each waits for
        self._parked: dict[asyncio.Future[Answer | None], Park] = {}
        #: the queues of the work each woken parked claim was woken for (event loop only;
        #: empty: any)
        self._woken_for: dict[asyncio.Future[Answer | None], frozenset[str]] = {}
        #: wake-ups of capped claims woken by a finish, not by new work (event loop only)
        self._freed: set[asyncio.Future[Answer | None]] = set()
        self._wake_due = False
        #: claim waits the changes since the last wake are worth waking (None: all), and
        #: the queues of that work (None: any)
        self._wake_budget: int | None = 0
        self._wake_queues: set[str] | None = set()
        #: the queues of the finishes since the last wake (None: some unknown): a claim
        #: held back by a cap is woken for a slot only by a finish on one of its queues
        self._finish_queues: set[str] | None = set()
        self._wake_lock = threading.Lock()
        self._loop_thread = 0
        self._unsubscribe = changes.subscribe(self._on_change) if changes is not None else None
        #: whether the server's protocol may answer short requests without an ASGI cycle
        #: (:meth:`takes`, :meth:`answer_now`), and how many it answered so
        self.lane = True
        self.answered_now = 0

    # --- lifecycle (any thread) ------------------------------------------------------------
    def stop(self) -> None:
        """Refuse new requests and answer those in flight with 503 now (thread-safe)."""
        self._stopping = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits
                loop.call_soon_threadsafe(self._cut_waits)

    def close(self, timeout: float | None = None) -> bool:
        """Stop; wait up to ``timeout`` for request threads to end. True when all did."""
        self.stop()
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._pool.shutdown(wait=False)
        with self._idle:
            return self._idle.wait_for(lambda: self.in_flight == 0, timeout)

    def is_stopping(self) -> bool:
        return self._stopping

    def held(self) -> tuple[int, int]:
        """The claims and the result waits parked on the loop now (any thread: a look
        that races a change is taken again)."""
        for _ in range(10):
            try:
                kinds = [park.kind for park in list(self._parked.values())]
                break
            except RuntimeError:  # (changed while read)
                continue
        else:
            return 0, 0
        claims = sum(kind == "generation" for kind in kinds)
        return claims, len(kinds) - claims

    def _cut_waits(self) -> None:
        for waiter, headers in list(self._waiting.items()):
            if not waiter.done():
                waiter.set_result(_stopping_response(headers))

    # --- one request -------------------------------------------------------------------------
    def _take_thread(self) -> bool:
        with self._idle:
            if self.in_flight >= self.threads:
                return False
            self.in_flight += 1
            return True

    def _give_thread(self) -> None:
        with self._idle:
            self.in_flight -= 1
            self._idle.notify_all()

    def _resolve(self, event: dict[str, Any]) -> Answer:
        try:
            fast = self.fast
            result = fast(event) if fast is not None else None
            if result is None:
                ctx = _LocalContext(event["requestContext"]["requestId"])
                result = self.resolver.resolve(event, ctx)
            return apigw.http_response(result)
        except Exception:
            # The resolver turns every error it knows into an answer; this is a bug.
            log.exception("unhandled error answering %s", event.get("rawPath"))
            return _error_response(500, "error", "internal error", event.get("headers") or {})

    def _run(
        self,
        event: dict[str, Any],
        waiter: asyncio.Future[Answer | None],
        loop: asyncio.AbstractEventLoop,
        carry: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> None:
        """In a pool thread: resolve the request and hand the answer to the event loop;
        or, for a request ``carry`` takes (a submit carrying blobs), do that first half
        here and hand the rest to the loop to resolve (:meth:`_resolve_rest`) if it is
        one the loop answers (its size), else resolve the rest here."""
        rest = None
        try:
            if carry is not None:
                try:
                    rest = carry(event)
                except Exception:  # (it answers None for what it refuses: this is a bug)
                    log.exception("unhandled error storing the blobs of %s", event["rawPath"])
            if rest is not None and not self._loop_takes(rest):
                event, rest = rest, None  # (a rest too large for the loop: resolved here)
            answer = self._resolve(event) if rest is None else None
        finally:
            self._give_thread()
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for it
            if rest is None:
                loop.call_soon_threadsafe(_settle, waiter, answer)
            else:
                loop.call_soon_threadsafe(self._resolve_rest, waiter, rest)

    def _loop_takes(self, event: dict[str, Any]) -> bool:
        """Whether the loop answers a request like ``event`` (by its method, path and
        body size) itself."""
        inline = self.inline
        method = event["requestContext"]["http"]["method"]
        return inline is not None and inline(method, event["rawPath"], len(event["body"]))

    def _resolve_rest(self, waiter: asyncio.Future[Answer | None], event: dict[str, Any]) -> None:
        """On the event loop: resolve the rest of a request a thread began (unless a stop
        answered it meanwhile) and settle its waiter with the answer."""
        if not waiter.done():
            _settle(waiter, self._resolve(event))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not part of the API
        headers = _headers(scope["headers"])
        blob = scope["path"].startswith(_BLOBS) and "/" not in scope["path"][len(_BLOBS) :]
        if blob and scope["method"] == "PUT" and self.uploads is not None:
            uploaded = await self._upload(scope, headers, receive)
            if uploaded is not _GONE:
                await _send(send, *uploaded)
            return
        downloaded = (
            blob
            and scope["method"] == "GET"
            and self.downloads is not None
            and await self._download(scope, headers, receive, send)
        )
        if downloaded:
            return
        body = await self._read_body(headers, receive)
        answer: Answer
        if isinstance(body, tuple):  # _GONE: its client hung up, or the protocol cut it
            return
        if body is None:
            answer = _error_response(
                413,
                "payload_too_large",
                f"request body over the {self.max_body} byte limit",
                headers,
            )
        elif self._stopping:
            answer = _stopping_response(headers)
        elif self.parks is not None and self.parks(scope["method"], scope["path"], len(body)):
            event = self._event(scope, headers, body)
            answer = await self._answer_parked(event, headers, receive)
            if answer is _GONE:
                self.dropped += 1
        elif self.inline is not None and self.inline(scope["method"], scope["path"], len(body)):
            # Short requests skip the two thread hand-overs (~0.1 ms each under the GIL).
            answer = self._resolve(self._event(scope, headers, body))
        elif not self._take_thread():
            answer = _busy_response("request threads", self.threads, headers)
        else:
            carry = self.carry if scope["method"] == "POST" else None
            answer = await self._threaded(self._event(scope, headers, body), headers, carry)
        await _send(send, *answer, head=scope["method"] == "HEAD")

    async def _threaded(
        self,
        event: dict[str, Any],
        headers: Mapping[str, str],
        carry: Callable[[dict[str, Any]], dict[str, Any] | None] | None,
    ) -> Answer:
        """The answer of a request resolved in a pool thread (:meth:`_run`), the thread
        taken already (given back here if the pool is shut down)."""
        loop = self._loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Answer | None] = loop.create_future()
        try:
            self._pool.submit(self._run, event, waiter, loop, carry)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._give_thread()
            return _stopping_response(headers)
        self._waiting[waiter] = headers
        try:
            return cast(Answer, await waiter)
        finally:
            del self._waiting[waiter]

    # --- the short lane (see _protocol) ---------------------------------------------------
    def takes(self, method: str, path: str, size: int) -> int:
        """Whether a request whose head declares a body of ``size`` bytes is one this app
        answers on the loop, so the server's protocol may hand it over whole, without an
        ASGI cycle: :data:`AT_ONCE` (a short request: :meth:`answer_now`), :data:`HELD`
        (a waiting one, parked: :meth:`answer_held`), :data:`CARRIED` (a submit too
        large for the loop, answered by a request thread: :meth:`answer_carried`), else
        0 (through ``__call__``)."""
        if not self.lane or self.inline is None or size > self.max_body:
            return 0
        if path.startswith(_BLOBS):
            return 0
        if self.parks is not None and self.parks(method, path, size):
            return HELD
        if self.inline(method, path, size):
            return AT_ONCE
        return CARRIED if self.carry is not None and (method, path) == _SUBMIT else 0

    def answer_now(self, request: ShortRequest) -> Answer:
        """The answer to a request :meth:`takes` took at once, as :meth:`__call__` makes it."""
        headers = _headers(request.headers)
        if self._stopping:
            return _stopping_response(headers)
        self.answered_now += 1
        return self._resolve(request.event(headers))

    async def answer_held(
        self,
        request: ShortRequest,
        hung_up: asyncio.Future[None],
        closing: Callable[[], bool] = lambda: False,
    ) -> Answer:
        """The answer to a waiting request :meth:`takes` took, parked as :meth:`__call__`
        parks it (``hung_up`` is done when its client goes away: :data:`_GONE`;
        ``closing()``, whether its connection is closing: an answer would not be
        written)."""
        headers = _headers(request.headers)
        if self._stopping:
            return _stopping_response(headers)
        self.answered_now += 1

        async def receive() -> Message:
            await hung_up
            return {"type": "http.disconnect"}

        def going() -> bool:
            return hung_up.done() or closing()

        answer = await self._answer_parked(request.event(headers), headers, receive, going)
        if answer is _GONE:
            self.dropped += 1
        return answer

    async def answer_carried(self, request: ShortRequest) -> Answer:
        """The answer to a submit too large for the loop that :meth:`takes` took whole:
        resolved in a request thread as :meth:`__call__` resolves it, its blobs stored
        there and the rest resolved on the loop (:meth:`_run`)."""
        headers = _headers(request.headers)
        if self._stopping:
            return _stopping_response(headers)
        if not self._take_thread():
            return _busy_response("request threads", self.threads, headers)
        self.answered_now += 1
        return await self._threaded(request.event(headers), headers, self.carry)

    # --- streamed blob transfers (event loop; the disk work in the pool) ------------------
    async def _upload(self, scope: Scope, headers: dict[str, str], receive: Receive) -> Answer:
        """A blob ``PUT`` written into the plane as its body arrives, in slices of
        :data:`UPLOAD_SLICE` handed to a request thread (hashed and written to the
        blob's file there), so no upload is held whole and the loop never waits on a
        disk. Its limit is the plane's blob limit, not ``max_body``; its checks (token
        or signature, digest, declared size) are made before any of the body is read.
        A stop ends it (503) at the next slice; a client that sends nothing for
        :data:`TRANSFER_IDLE` seconds is answered 408."""
        if self.is_stopping():
            return _stopping_response(headers)
        if not self._take_transfer():
            return _busy_response("blob transfers", self.threads, headers)
        upload: Any = None
        self._loop = asyncio.get_running_loop()
        try:
            opened = await self._transfer_start(self.uploads, scope, headers)
            if isinstance(opened, dict):
                return apigw.http_response(opened)  # refused before the body (left unread)
            upload = opened
            pieces: list[bytes] = []
            held = 0
            while True:
                try:
                    message = await self._transfer_wait(receive(), headers)
                except _Cut as cut:
                    if cut.stopping:
                        return _stopping_response(headers)
                    return _error_response(
                        408, "timeout", f"no bytes of the upload for {TRANSFER_IDLE:g} s", headers
                    )
                if message["type"] != "http.request":
                    return _GONE  # the client went away: the finally drops the upload
                piece = message.get("body", b"")
                more = message.get("more_body", False)
                pieces.append(piece)
                held += len(piece)
                if held >= UPLOAD_SLICE or not more:
                    data, pieces, held = b"".join(pieces), [], 0
                    step = functools.partial(_upload_step, upload, data, last=not more)
                    answered = await self._in_pool(step)
                    if answered is not None:  # (the last slice always is)
                        upload = None  # kept, or refused and dropped by itself
                        return apigw.http_response(answered)
        except Exception:
            if self.is_stopping():
                return _stopping_response(headers)
            log.exception("unhandled error in a blob upload to %s", scope.get("path"))
            return _error_response(500, "error", "internal error", headers)
        finally:
            if upload is not None:
                upload.abort()
            self._give_transfer()

    async def _download(
        self, scope: Scope, headers: dict[str, str], receive: Receive, send: Send
    ) -> bool:
        """A blob ``GET`` sent from the blob's file in slices of :data:`UPLOAD_SLICE`
        (each read in a request thread), so no download is held whole, nor read on for
        a client that hung up, stopped reading for :data:`TRANSFER_IDLE` seconds, or a
        server that stops. False when the resolver is to answer it (the blob is not in
        a file)."""
        if self.is_stopping():
            await _send(send, *_stopping_response(headers))
            return True
        if not self._take_transfer():
            await _send(send, *_busy_response("blob transfers", self.threads, headers))
            return True
        gone: asyncio.Future[Message] | None = None
        fd: int | None = None
        started = False
        self._loop = asyncio.get_running_loop()
        try:
            found = await self._transfer_start(self.downloads, scope, headers)
            if found is None:
                return False
            if isinstance(found, dict):
                await _send(send, *apigw.http_response(found))
                return True
            try:
                fd = os.open(found, os.O_RDONLY)
            except OSError:
                return False  # (gone since it was found: the resolver answers)
            size = os.fstat(fd).st_size
            start = {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/octet-stream"),
                    (b"content-length", str(size).encode()),
                ],
            }
            await send(start)
            started = True
            await receive()  # the (empty) body; from here receive() ends on a hang-up
            gone = asyncio.ensure_future(receive())
            sent = 0
            while True:
                want = min(UPLOAD_SLICE, size - sent)
                piece = await self._in_pool(functools.partial(os.pread, fd, want, sent))
                sent += len(piece)
                more = bool(piece) and sent < size  # (a blob file never shrinks)
                body = {"type": "http.response.body", "body": piece, "more_body": more}
                try:
                    await self._transfer_wait(send(body), headers)
                except _Cut:
                    return True  # a stop, or a reader that stopped reading: cut short
                if not more or _disconnected(gone):
                    return True
        except Exception:
            if not self.is_stopping():
                log.exception("unhandled error sending the blob %s", scope.get("path"))
            if not started:  # (nothing sent yet: an answer in the API's shape)
                failed = (
                    _stopping_response(headers)
                    if self.is_stopping()
                    else _error_response(500, "error", "internal error", headers)
                )
                await _send(send, *failed)
            return True  # (else the response is cut short: the client sees it unended)
        finally:
            if fd is not None:
                os.close(fd)
            if gone is not None and not gone.done():
                gone.cancel()
            self._give_transfer()

    async def _transfer_start(
        self, start: Callable[[dict[str, Any]], Any] | None, scope: Scope, headers: dict[str, str]
    ) -> Any:
        """A transfer's checks (the route's: token or signature, digest, size), on the
        loop where short requests are answered there, else in a request thread (a
        plane whose every call is a round trip, as ``lakeshore dev``'s)."""
        opening = functools.partial(
            cast(Callable[..., Any], start), self._event(scope, headers, b"")
        )
        return opening() if self._quick else await self._in_pool(opening)

    async def _in_pool(self, work: Callable[[], _T]) -> _T:
        """``work()`` in a request thread, counted in :attr:`in_flight` (so ``close``
        waits for it). Cancelled meanwhile (a stop past its grace), the request still
        waits for it to end before it goes on: its file is not closed under it."""
        with self._idle:
            self.in_flight += 1
        try:
            running = asyncio.get_running_loop().run_in_executor(self._pool, self._counted, work)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._give_thread()
            raise
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            while not running.done():  # (through every further cancel: a shutdown's too)
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({running})
            raise

    async def _transfer_wait(self, step: Awaitable[_T], headers: Mapping[str, str]) -> _T:
        """``step`` (a transfer's receive or send), or :class:`_Cut` when the server
        stops first or it takes over :data:`TRANSFER_IDLE` seconds."""
        task = asyncio.ensure_future(step)
        stop: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._waiting[stop] = headers  # (a stop settles it: see _cut_waits)
        try:
            if self.is_stopping():
                raise _Cut(stopping=True)
            both: set[asyncio.Future[Any]] = {task, stop}
            done, _ = await asyncio.wait(
                both, timeout=TRANSFER_IDLE, return_when=asyncio.FIRST_COMPLETED
            )
            if task in done:
                return task.result()
            raise _Cut(stopping=stop in done)
        finally:
            del self._waiting[stop]
            if not task.done():
                task.cancel()

    def _counted(self, work: Callable[[], _T]) -> _T:
        try:
            return work()
        finally:
            self._give_thread()

    def _take_transfer(self) -> bool:
        with self._idle:
            if self._transfers >= self.threads:
                return False
            self._transfers += 1
            return True

    def _give_transfer(self) -> None:
        with self._idle:
            self._transfers -= 1

    # --- parked requests (event loop only, but for _on_change) -----------------------
    async def _answer_parked(
        self,
        event: dict[str, Any],
        headers: Mapping[str, str],
        receive: Receive,
        going: Callable[[], bool] = lambda: False,
    ) -> Answer:
        """Resolve a waiting request on the event loop, again after each change it
        waits for, until it gets an answer that is not a park or its deadline passes.

        A request whose client hung up while parked is dropped, not resolved again (a
        killed worker's claim must not lease the next call to a closed connection).
        ``going()``: whether its connection is going, known before ``receive`` says so (the
        short lane's, which writes the answer as this returns): a claim handed calls
        then hands them back instead of answering into a closed connection."""
        changes = cast("Changes", self.changes)
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        until: float | None = None
        woken = False
        #: the queues of the work the claim was woken for: a wake it could not use goes
        #: to a claim on one of them (empty: not known, any claim)
        woken_for: frozenset[str] = frozenset()
        #: the waiter of the park now (the hang-up settles it), and the hang-up's watch
        current: list[asyncio.Future[Answer | None]] = []
        gone: asyncio.Future[Message] | None = None

        def hung_up(task: asyncio.Future[Message]) -> None:
            if current and _disconnected(task):
                _settle(current[0], _GONE)

        park: Park | None = None
        try:
            while True:
                if (gone is not None and _disconnected(gone)) or going():
                    # It hung up as a wake came (the wake settled the waiter first):
                    # not resolved again, and the wake goes to the next one (what it
                    # was handed, the finally's release hands back).
                    if woken:
                        self._pass_on(woken_for)
                    return _GONE
                if park is not None:
                    # A result wait's watch stayed while it was parked: the records a
                    # finish brought make its answer without resolving it again; so do
                    # the claims a submit handed a parked claim (Changes.claimant).
                    settled = self._settled(park)
                    if settled is not None and park.box is not None:
                        park.box.clear()  # (answered: nothing of it to hand back)
                    _let_go(park)
                    park = None
                    if settled is not None:
                        return settled
                with changes.parking() as parked:
                    try:
                        answer = self._resolve(event)
                    except BaseException:
                        _let_go(parked())
                        raise
                park = parked()
                if park is None or changes.closed:
                    if woken and woken_for and parked.took and not parked.took & woken_for:
                        # It took work only on queues it was not woken for (the wake for
                        # that went to another claim, which finds nothing and passes it
                        # on there): the work it was woken for may still wait.
                        self._pass_on(woken_for)
                    return answer  # (a closed plane answers every wait empty)
                if woken:
                    # Woken for work it could not take (another took it, or it was on a
                    # queue this one does not claim): the next claim that has not seen
                    # the change gets the wake.
                    self._pass_on(woken_for)
                until = park.until if until is None else until
                left = until - time.monotonic()
                if left <= 0:
                    return answer  # the request's time is up: its empty answer goes out
                waiter: asyncio.Future[Answer | None] = loop.create_future()
                current[:] = [waiter]
                if gone is None:  # (after the body: receive() now returns on a hang-up)
                    gone = asyncio.ensure_future(receive())
                    gone.add_done_callback(hung_up)
                # Registered before the look at the counters: a change made by another
                # thread from here on finds the waiter (see _on_change).
                self._waiting[waiter] = headers
                self._parked[waiter] = park
                if park.kind == "generation":
                    self._ensure_sweeper()
                held = False
                timer = None
                if park.taker is not None:
                    park.taker.on_handed = functools.partial(_settle, waiter, None)
                try:
                    changes.hold(park)
                    held = True
                    if self._stopping:
                        return _stopping_response(headers)
                    if not changes.changed(park):
                        timer = loop.call_later(min(park.timeout, left), _settle, waiter, None)
                        cut = await waiter
                        if cut is not None:
                            return cut  # the server is stopping, or the client is gone
                finally:
                    if timer is not None:
                        timer.cancel()
                    if held:
                        changes.unhold(park)
                    del self._parked[waiter], self._waiting[waiter]
                    woken_for = self._woken_for.pop(waiter, frozenset())
                    freed = waiter in self._freed
                    self._freed.discard(waiter)
                woken = park.kind == "generation" and changes.changed(park) and not freed
        finally:
            _let_go(park)
            if gone is not None and not gone.done():
                gone.cancel()

    def _ensure_sweeper(self) -> None:
        if self.sweep is not None and (self._sweeper is None or self._sweeper.done()):
            self._sweeper = asyncio.ensure_future(self._sweeping())

    async def _sweeping(self) -> None:
        """Sweep every ``sweep_every`` seconds while any claim is parked (one task, in a
        request thread: a purge may take a while), so a lease that runs out while every
        worker waits is handed on as soon as if they were looking; the sweep's change
        wakes them."""
        sweep = self.sweep
        assert sweep is not None
        while not self._stopping and any(p.kind == "generation" for p in self._parked.values()):
            await asyncio.sleep(self.sweep_every)
            if self.in_flight >= self.threads:
                continue  # every request thread is busy: sweep at the next turn
            try:
                await self._in_pool(sweep)
            except Exception:
                if self.is_stopping():
                    return  # (the pool is shut down)
                log.exception("lakeshore serve: the plane's sweep failed; trying again")

    @staticmethod
    def _settled(park: Park) -> Answer | None:
        """The answer a parked result wait's box makes, if it has records; None to
        resolve the request again."""
        try:
            result = park.settled()
            if not isinstance(result, dict) or "statusCode" not in result:
                return None  # (no resolver layer made it an HTTP answer: look again)
            return apigw.http_response(result)
        except Exception:
            log.exception("answering a parked wait from its records failed; looking again")
            return None

    def _on_change(self, waiters: int | None, queues: frozenset[str]) -> None:
        """From whichever thread changed the plane: wake the parked requests it may
        concern (once per loop turn, however many changes came in between). A submit
        of n records wakes n parked claims (``waiters``), not every idle worker's."""
        loop = self._loop
        if not self._parked or loop is None:
            return
        with self._wake_lock:
            budget = self._wake_budget
            self._wake_budget = None if budget is None or waiters is None else budget + waiters
            if self._wake_queues is not None and waiters != 0:  # (0: a finish, no work)
                if queues and waiters is not None:
                    self._wake_queues |= queues
                else:
                    self._wake_queues = None
            if self._finish_queues is not None and waiters == 0:
                if queues:
                    self._finish_queues |= queues
                else:
                    self._finish_queues = None
            if self._wake_due:
                return
            self._wake_due = True
        try:
            if threading.get_ident() == self._loop_thread:
                loop.call_soon(self._wake)
            else:
                loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nothing is parked any more
            self._wake_due = False

    def _wake(self) -> None:
        with self._wake_lock:  # first: a change from here on schedules another wake
            self._wake_due = False
            budget, self._wake_budget = self._wake_budget, 0
            queues, self._wake_queues = self._wake_queues, set()
            finished, self._finish_queues = self._finish_queues, set()
        changes = cast("Changes", self.changes)
        for waiter, park in list(self._parked.items()):
            if not changes.changed(park) or waiter.done():
                continue
            if park.kind == "finishes" and park.box == [] and not changes.closed:
                continue  # a result wait whose ids did not finish: its watch tells it
            if park.kind == "generation" and budget is not None:
                if (queues and park.queues and not park.queues & queues) or budget <= 0:
                    # New work on other queues, or not worth this wake (a pass-on or its
                    # nap wakes it) — unless a finish may have freed a slot for it (a
                    # capped claim): woken for the slot, it passes no wake on.
                    if park.finish_since in (None, changes.finishes):
                        continue
                    if finished is not None and park.queues and not park.queues & finished:
                        continue  # the finishes were on other queues: no slot for it
                    self._freed.add(waiter)
                else:
                    budget -= 1
            if park.kind == "generation" and queues:
                self._woken_for[waiter] = frozenset(queues)
            waiter.set_result(None)

    def _pass_on(self, queues: frozenset[str]) -> None:
        """Wake the next parked claim that has not seen the latest change and may take
        work on ``queues`` (those of the work the claim passing the wake on was woken
        for; empty: any claim)."""
        changes = cast("Changes", self.changes)
        for waiter, park in self._parked.items():
            if park.kind != "generation" or waiter.done() or not changes.changed(park):
                continue
            if queues and park.queues and not queues & park.queues:
                continue  # idle on other queues: the wake is not for it
            if queues:
                self._woken_for[waiter] = queues
            waiter.set_result(None)
            return

    @staticmethod
    def _event(scope: Scope, headers: dict[str, str], body: bytes) -> dict[str, Any]:
        return _http_event(
            scope["method"],
            scope["path"],
            scope["query_string"],
            headers,
            body,
            scope.get("client"),
        )

    async def _read_body(
        self, headers: Mapping[str, str], receive: Receive
    ) -> bytes | Answer | None:
        """The whole body, or None when it is over the limit (then left unread), or
        :data:`_GONE` when the connection ends before the body does (a client that hung
        up, or one whose body stopped arriving, answered 408 by the protocol): a body cut
        short is never resolved."""
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return None
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return _GONE
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)


#: what a parked request whose client hung up "answers" (never sent: nobody listens)
_GONE: Answer = (499, [], b"")
#: blob uploads (``PUT`` of one of these paths) are streamed: see PlaneASGI._upload
_BLOBS = "/v1/blobs/"
#: the lanes of PlaneASGI.takes: a short request answered at once, a waiting one parked,
#: a submit too large for the loop answered by a request thread (its blobs stored there)
AT_ONCE = 1
HELD = 2
CARRIED = 3
#: the route of a submit
_SUBMIT = ("POST", "/v1/invocations")


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """A request's headers by lower-case name (a repeated one joined with commas)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in raw:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


class ShortRequest(NamedTuple):
    """A whole request the server's protocol hands to :class:`PlaneASGI` by the short
    lane (see :meth:`PlaneASGI.takes`)."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    client: tuple[str, int] | None

    def event(self, headers: dict[str, str]) -> dict[str, Any]:
        """Its API Gateway event, with ``headers`` (its headers by name)."""
        return _http_event(self.method, self.path, self.query, headers, self.body, self.client)


def _http_event(
    method: str,
    path: str,
    query: bytes,
    headers: dict[str, str],
    body: bytes,
    client: tuple[str, int] | None,
) -> dict[str, Any]:
    return apigw.http_event(
        method,
        path,
        query_string=query.decode("latin-1"),
        headers=headers,
        body=body,
        source_ip=client[0] if client else "127.0.0.1",
        raw_body=True,
    )


class _Cut(Exception):
    """A blob transfer cut short: the server stops (``stopping``), or its client went
    quiet for :data:`TRANSFER_IDLE` seconds."""

    def __init__(self, *, stopping: bool) -> None:
        super().__init__("stopping" if stopping else "idle")
        self.stopping = stopping


def _upload_step(upload: Any, data: bytes, *, last: bool) -> dict[str, Any] | None:
    """In a request thread: write one slice of an upload, and end it after the last.
    None to go on; else the request's answer (a refusal, or the end's answer)."""
    refused: dict[str, Any] | None = upload.write(data)
    if refused is not None or not last:
        return refused
    ended: dict[str, Any] = upload.end()
    return ended


def _let_go(park: Park | None) -> None:
    """Release what a park kept (a result wait's watch)."""
    if park is not None and park.release is not None:
        park.release()


def _disconnected(receiving: asyncio.Future[Message]) -> bool:
    """Whether a parked request's ``receive()`` ended with its client hanging up."""
    if not receiving.done() or receiving.cancelled() or receiving.exception() is not None:
        return False
    return receiving.result().get("type") == "http.disconnect"


def _settle(waiter: asyncio.Future[Answer | None], answer: Answer | None) -> None:
    if not waiter.done():  # a stop may have answered it already
        waiter.set_result(answer)


def _busy_response(what: str, limit: int, headers: Mapping[str, str]) -> Answer:
    answer = _error_response(503, "unavailable", f"all {limit} {what} are busy", headers)
    answer[1].append(("retry-after", "1"))
    return answer


def _stopping_response(headers: Mapping[str, str]) -> Answer:
    answer = _error_response(503, "unavailable", "the server is stopping; retry", headers)
    answer[1].append(("retry-after", "1"))
    return answer


def _error_response(status: int, code: str, message: str, headers: Mapping[str, str]) -> Answer:
    """An error in the API's shape and the client's content type (the codec decides)."""
    from .api import codec

    media = codec.pick_type(headers.get("content-type"), headers.get("accept"))
    body = codec.encode_body({"error": {"code": code, "message": message}}, media)
    return status, [("content-type", media)], body


def _raw_headers(headers: list[tuple[str, str]], body: bytes) -> list[tuple[bytes, bytes]]:
    """An answer's headers as they go out: lower-case names, its own length (a length
    or transfer encoding it named is dropped)."""
    raw = [
        (k.lower().encode("latin-1"), v.encode("latin-1"))
        for k, v in headers
        if k.lower() not in ("content-length", "transfer-encoding")
    ]
    raw.append((b"content-length", str(len(body)).encode()))
    return raw


async def _send(
    send: Send, status: int, headers: list[tuple[str, str]], body: bytes, *, head: bool = False
) -> None:
    raw = _raw_headers(headers, body)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": b"" if head else body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# --- the server ----------------------------------------------------------------------------


def _protocol(app: PlaneASGI | None = None) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, answering a request it cannot parse (a malformed
    header, say) in the API's error shape instead of plain text.

    With ``app``, the short lane: a request ``app`` answers on the event loop (see
    :meth:`PlaneASGI.takes`) is handed to it whole from the parser's callbacks, without
    an ASGI scope, cycle or messages (uvicorn's part of a request is ~60 µs of the
    server's CPU), and its answer goes out head and body in one write. A short one (a
    submit, a completion) is answered as its last byte arrives; a waiting one (a claim,
    a result wait) is parked as ``__call__`` parks it, in a task of its own, standing as
    the connection's cycle meanwhile (uvicorn queues requests behind it; a stop and a
    hang-up reach it as they reach a cycle: a hang-up is heard while nothing is queued
    behind it, as for uvicorn's own cycles, whose reading pauses then); so is a submit
    too large for the loop (it carries blobs), its body taken whole (up to the body
    limit) and answered by a request thread. Every other request (blob transfers, other
    requests on threads, a request behind one still being
    answered, ``Expect: 100-continue``, a chunked body, a proxy's forwarding headers)
    goes through uvicorn and the ASGI app as before, and so does a pipelined burst past
    its first request in one read, and a connection whose client is slow to read. Not
    used with the access log on (uvicorn writes it per cycle).

    With or without ``app``, a request whose head or body stops arriving is answered
    ``408 timeout`` and its connection closed once its client has sent nothing for
    :data:`REQUEST_IDLE` seconds, on the lane and through ASGI alike (a blob upload's
    body is left to :meth:`PlaneASGI._upload`, bounded by :data:`TRANSFER_IDLE`). The
    timer costs nothing on a request that arrives in one read: it is armed only when a
    read ends inside a request, and only once per connection (later reads stamp the
    time); it waits while the server is not reading (flow control) or a request ahead is
    still being answered. A keep-alive connection between requests is not in a request:
    uvicorn's keep-alive timeout (:data:`KEEP_ALIVE`) bounds it, and a connection that
    never sends a request is closed after as long."""
    import httptools
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    class PlaneProtocol(HttpToolsProtocol):
        #: the request the lane is taking: method, path, query, keep-alive, lane
        _lane: tuple[str, str, bytes, bool, int] | None = None
        _lane_body: list[bytes]
        #: requests the lane took from the bytes being read now (see _LANE_PER_READ)
        _taken = 0
        #: where the parser is: between requests (0), in a head (_HEAD), in a body (_BODY)
        _reading = 0
        #: the timer of a request begun and not ended (see _stalled), and the loop's time
        #: of the last read that ended inside it
        _stall: asyncio.TimerHandle | None = None
        _heard = 0.0

        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"error": {"code": "invalid_request", "message": msg}}).encode()
            head = (
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            )
            self.transport.write(head + body)
            self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # (silent from the start: bounded as an idle keep-alive connection is; its
            # first request's first byte cancels the timer, as a later request's does)
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def data_received(self, data: bytes) -> None:
            self._taken = 0
            super().data_received(data)
            if self._reading and not self.transport.is_closing():
                # (a read that ends inside a request: its silence from now is bounded)
                self._heard = self.loop.time()
                if self._stall is None:
                    self._stall = self.loop.call_later(REQUEST_IDLE, self._stalled)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None
            self._unset_keepalive_if_required()  # (uvicorn's only on a clean close)
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            self._reading = _HEAD
            super().on_message_begin()
            # (a request in the segment of a short answer: that answer armed the
            # keep-alive timer, which must not cut this one)
            self._unset_keepalive_if_required()

        def on_headers_complete(self) -> None:
            self._reading = _BODY
            if app is None or not self._take():
                super().on_headers_complete()

        def _take(self) -> bool:
            """Whether the lane takes the request whose head just ended."""
            if (
                self.expect_100_continue
                or self.parser.should_upgrade()
                or (self.cycle is not None and not self.cycle.response_complete)
                or self.pipeline
                or self.flow.write_paused  # (its client reads slowly: uvicorn's drain)
                or self._taken >= _LANE_PER_READ  # (a pipelined burst: a task each)
            ):
                return False
            size = 0
            for name, value in self.headers:
                if name == b"content-length":
                    if not value.isdigit() or size:
                        return False
                    size = int(value)
                elif name in _NOT_SHORT:
                    return False
            parsed = httptools.parse_url(self.url)
            path = parsed.path.decode("ascii")
            method = self.parser.get_method().decode("ascii")
            lane = 0 if "%" in path or app is None else app.takes(method, path, size)
            if not lane:
                return False
            version = self.parser.get_http_version()
            keep = version != "1.0" and self.parser.should_keep_alive()
            self._lane = (method, path, parsed.query or b"", keep, lane)
            self._lane_body = []
            self._taken += 1
            return True

        def shutdown(self) -> None:
            lane = self._lane
            if lane is None:
                super().shutdown()
            else:  # (its body still arriving: answered, then closed, as uvicorn does)
                self._lane = (*lane[:3], False, lane[4])

        def on_body(self, body: bytes) -> None:
            if self._lane is not None:
                self._lane_body.append(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._reading = 0
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None
            lane = self._lane
            if lane is None:
                super().on_message_complete()
                return
            self._lane = None
            method, path, query, keep, kind = lane
            body = b"".join(self._lane_body)
            self._lane_body = []
            assert app is not None
            request = ShortRequest(method, path, query, self.headers, body, self.client)
            if kind == AT_ONCE:
                try:
                    answer = app.answer_now(request)
                except Exception:  # (the resolver answers what it knows: this is a bug)
                    log.exception("unhandled error answering %s", path)
                    answer = _error_response(500, "error", "internal error", {})
                self._answer(method, answer, keep)
                return
            held = _Held(keep, self.loop.create_future())
            self.cycle = held  # type: ignore[assignment]
            if kind == HELD:
                hold = app.answer_held(request, held.hung_up, self.transport.is_closing)
            else:
                hold = app.answer_carried(request)
            task = self.loop.create_task(self._hold(method, held, hold))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        def _stalled(self) -> None:
            """The timer of a request begun and not ended: once its client has sent
            nothing for :data:`REQUEST_IDLE` seconds, it is answered 408 and the
            connection closed; until then, armed again for what is left."""
            self._stall = None
            reading = self._reading
            if not reading or self.transport.is_closing():
                return
            now = self.loop.time()
            cycle = self.cycle
            if self.flow.read_paused:
                self._heard = now  # (the server is not reading: not the client's silence)
            elif self.pipeline or (
                reading == _HEAD and cycle is not None and not cycle.response_complete
            ):
                pass  # (a request ahead is still being answered: its answer goes first)
            elif (
                reading == _BODY
                and self._lane is None
                and cycle is not None
                and not cycle.response_started
                and _streamed(cycle.scope["method"], cycle.scope["path"])
            ):
                return  # (a blob upload: PlaneASGI._upload bounds it, by TRANSFER_IDLE)
            elif now - self._heard >= REQUEST_IDLE:
                self._cut(reading)
                return
            left = self._heard + REQUEST_IDLE - now
            self._stall = self.loop.call_later(left if left > 0 else REQUEST_IDLE, self._stalled)

        def _cut(self, reading: int) -> None:
            """Answer the request whose head or body stopped arriving 408, and close
            the connection (a request the app has begun to answer is only closed)."""
            self._reading = 0
            method = ""
            lane = self._lane
            cycle = self.cycle
            if lane is not None:  # (the lane's body: never handed over)
                self._lane = None
                self._lane_body = []
                method = lane[0]
            elif reading == _BODY and cycle is not None:
                method = cycle.scope["method"]
                if cycle.response_started:  # (answered before its body came: a 413)
                    self.transport.close()
                    return
                # its app, waiting on receive(), hears a hang-up (and answers nothing)
                cycle.disconnected = True
                cycle.keep_alive = False
                cycle.message_event.set()
            what = "body" if reading == _BODY else "head"
            reason = f"the request's {what} stopped arriving: nothing for {REQUEST_IDLE:g} s"
            headers = _headers(self.headers or ())
            self._answer(method, _error_response(408, "timeout", reason, headers), False)

        async def _hold(self, method: str, held: _Held, hold: Awaitable[Answer]) -> None:
            try:
                answer = await hold
            except Exception:
                log.exception("unhandled error answering a held request")
                answer = _error_response(500, "error", "internal error", {})
            held.response_complete = True
            if answer is _GONE or self.transport.is_closing():
                return  # (its client hung up: nobody to answer)
            self._answer(method, answer, held.keep_alive)

        def _answer(self, method: str, answer: Answer, keep: bool) -> None:
            """Write ``answer`` as uvicorn would, in one write; then what uvicorn does
            when an answer is complete (the next request queued, or the keep-alive
            timer), or close."""
            status, headers, content = answer
            out = [STATUS_LINE[status]]
            for raw_name, raw_value in self.server_state.default_headers:
                out += [raw_name, b": ", raw_value, b"\r\n"]
            closes = False
            for name, value in _raw_headers(headers, content):
                if name == b"connection" and b"close" in value.lower():
                    keep, closes = False, True
                out += [name, b": ", value, b"\r\n"]
            if not keep and not closes:
                out.append(b"connection: close\r\n")
            out.append(b"\r\n")
            if method != "HEAD":
                out.append(content)
            self.transport.write(b"".join(out))
            if keep:
                self.on_response_complete()  # (uvicorn's: count it, arm the keep-alive)
            else:
                self.server_state.total_requests += 1
                self.transport.close()

    return PlaneProtocol


class _HangUp:
    """A held request's stand-in for its cycle's ``message_event``: uvicorn sets it when
    the connection is lost, which settles the request's hang-up future."""

    __slots__ = ("_hung_up",)

    def __init__(self, hung_up: asyncio.Future[None]) -> None:
        self._hung_up = hung_up

    def set(self) -> None:
        if not self._hung_up.done():
            self._hung_up.set_result(None)


class _Held:
    """A parked request of the short lane, standing as its connection's cycle while it
    waits (what uvicorn reads and sets on a cycle)."""

    __slots__ = ("disconnected", "hung_up", "keep_alive", "message_event", "response_complete")

    def __init__(self, keep_alive: bool, hung_up: asyncio.Future[None]) -> None:
        self.response_complete = False
        self.keep_alive = keep_alive  # (a stop sets it False: closed once answered)
        self.disconnected = False
        self.hung_up = hung_up
        self.message_event = _HangUp(hung_up)


#: requests the short lane takes from one read of a connection: the rest of a pipelined
#: burst goes through uvicorn, a task turn each, so one client cannot hold the event loop
#: for the whole burst
_LANE_PER_READ = 1
#: request headers that keep a request off the short lane (see _protocol)
_NOT_SHORT = frozenset({b"transfer-encoding", b"x-forwarded-for", b"x-forwarded-proto"})
#: where a connection's parser is in a request (see _protocol): its head, its body
_HEAD = 1
_BODY = 2


def _streamed(method: str, path: str) -> bool:
    """Whether a request is a blob upload, whose body PlaneASGI streams (_upload)."""
    return method == "PUT" and path.startswith(_BLOBS) and "/" not in path[len(_BLOBS) :]


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class LocalServer:
    """A plane in a SQLite file, served over HTTP by uvicorn in a background thread.

    ``start()`` binds (``port=0`` picks a free port; :attr:`url` has the real one), opens
    the plane, makes the first admin token of a fresh plane (or a new one with
    ``new_admin_token``) and returns once the server accepts connections. ``stop()`` cuts
    long polls after :data:`GRACEFUL_SECONDS` and closes the plane.
    """

    #: the server's name in ``/v1/hello`` answers
    name = "lakeshore serve"

    def __init__(
        self,
        plane_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        new_admin_token: bool = False,
        threads: int = DEFAULT_THREADS,
        access_log: bool = False,
        max_blob: int | None = None,
    ) -> None:
        self.plane_path = Path(plane_path)
        #: bytes of one blob (None: the API's default, 5 GiB)
        self.max_blob = max_blob
        self.host = host
        self.port = port
        self.new_admin_token = new_admin_token
        self.threads = threads
        self.access_log = access_log
        self.url = ""
        #: the admin token made at start (fresh plane or ``new_admin_token``), else None
        self.admin_token: str | None = None
        #: whether that token came from bootstrapping a fresh plane
        self.bootstrapped = False
        self.plane: Plane | None = None
        self.asgi: PlaneASGI | None = None
        self.uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def limits(self) -> Limits:
        """The API's limits on this server."""
        from .api import Limits

        return Limits() if self.max_blob is None else Limits(max_blob=self.max_blob)

    def open_plane(self) -> Plane:
        """The plane to serve (called once by :meth:`start`; closed by :meth:`stop`).

        Here the SQLite file at ``plane_path``; ``lakeshore dev`` overrides it with a
        DynamoDB + S3 plane, so both commands share this adapter.
        """
        from .plane import Plane
        from .stores import SqliteStore

        store = SqliteStore(self.plane_path)
        # Everything reaches this plane through the server, whose writes wake waiters at
        # once; another process writing the file directly is noticed within 50 ms.
        store.poll_interval = _SHARED_POLL
        return Plane(store)

    def answers_inline(self, method: str, path: str, size: int = 0) -> bool:
        """Whether a request is short enough to answer on the event loop.

        With the SQLite plane every call but the waiting ones (claims, invocation waits),
        blob transfers and large bodies (a submit carrying its blobs) takes well under a
        millisecond, so handing it to a thread and back costs more than it saves.
        ``lakeshore dev`` answers everything on threads (each of its plane calls is a
        round trip to the emulator).
        """
        return size <= INLINE_BODY and not (
            path in _WAITING_PATHS or path.startswith("/v1/blobs") or path.startswith("/v1/data")
        )

    def _held(self) -> tuple[int, int]:
        return (0, 0) if self.asgi is None else self.asgi.held()

    def parks(self, method: str, path: str, size: int) -> bool:
        """Whether a waiting request is parked on the event loop (see :class:`PlaneASGI`):
        claims and waits small enough to look at again on each change."""
        return path in _WAITING_PATHS and size <= PARK_BODY

    def start(self, timeout: float = 30.0) -> None:
        import uvicorn

        from .api import Service, bootstrap_admin, create_token
        from .handlers.api import carry_path, download_path, fast_path, make_app, upload_path

        sock = _bind(self.host, self.port)
        try:
            self.url = _url(sock)
            self.plane = self.open_plane()
            service = Service(self.plane, limits=self.limits(), server=self.name)
            self.admin_token = bootstrap_admin(self.plane)
            self.bootstrapped = self.admin_token is not None
            if self.admin_token is None and self.new_admin_token:
                self.admin_token, _ = create_token(self.plane, "admin", name="lakeshore serve")
            app = thread_safe(make_app(service))
            service.gauges.append(lambda registry: registry.held(*self._held()))
            self.asgi = PlaneASGI(
                app,
                max_body=service.limits.max_body,
                threads=self.threads,
                inline=self.answers_inline,
                parks=self.parks,
                changes=self.plane.changes,
                fast=fast_path(app),
                uploads=upload_path(app),
                downloads=download_path(app),
                carry=carry_path(app),
                sweep=self.plane.maybe_sweep,
                sweep_every=self.plane.sweep_interval,
            )
            config = uvicorn.Config(
                self.asgi,
                http=_protocol(None if self.access_log else self.asgi),
                loop="auto",  # uvloop where it exists
                ws="none",
                lifespan="off",
                log_config=None,
                access_log=self.access_log,
                server_header=False,
                timeout_graceful_shutdown=int(GRACEFUL_SECONDS) or 1,
                timeout_keep_alive=KEEP_ALIVE,
                backlog=2048,
            )
            self.uvicorn = server = uvicorn.Server(config)
            self._thread = threading.Thread(
                target=server.run, kwargs={"sockets": [sock]}, name="lakeshore-serve", daemon=True
            )
            self._thread.start()
            deadline = time.monotonic() + timeout
            while not server.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"lakeshore serve did not start on {self.url}")
                time.sleep(0.005)
        except BaseException:
            self.request_stop()
            sock.close()
            self._close_plane()
            raise

    def request_stop(self, *, force: bool = False) -> None:
        """Ask the server to stop (safe from a signal handler): requests still in flight,
        long polls included, are answered 503 at once. ``force`` drops them unanswered."""
        if self.asgi is not None:
            self.asgi.stop()
        if self.uvicorn is not None:
            self.uvicorn.should_exit = True
            if force:
                self.uvicorn.force_exit = True

    @property
    def stopping(self) -> bool:
        return self.uvicorn is not None and self.uvicorn.should_exit

    def wait(self) -> None:
        """Block until the server stops (in short joins, so signals are handled)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.2)

    def stop(self) -> bool:
        """Stop serving and close the plane. True when every request thread has ended;
        False when some still sit in a plane call (their answers go nowhere)."""
        self.request_stop()
        self.wait()
        return self._close_plane()

    def _close_plane(self) -> bool:
        asgi, plane = self.asgi, self.plane
        self.asgi = self.plane = None
        # Threads still in a plane call get a moment to end by themselves; closing the
        # plane then ends the claims still waiting (with an error nobody receives).
        idle = asgi.close(timeout=GRACEFUL_SECONDS) if asgi is not None else True
        if plane is not None:
            plane.close()
        if asgi is not None and not idle:
            idle = asgi.close(timeout=GRACEFUL_SECONDS)
        return idle

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_thread(
    plane_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    new_admin_token: bool = False,
    threads: int = DEFAULT_THREADS,
) -> Iterator[tuple[str, str | None]]:
    """Serve the plane in ``plane_path`` while the block runs; yield ``(url, admin_token)``.

    ``port=0`` binds a free port (the url has it). ``admin_token`` is the bootstrap token
    of a fresh plane, a new one with ``new_admin_token``, else None.
    """
    server = LocalServer(
        plane_path, host=host, port=port, new_admin_token=new_admin_token, threads=threads
    )
    with server:
        yield server.url, server.admin_token
