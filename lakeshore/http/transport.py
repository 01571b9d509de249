"""``HttpTransport``: the methods of a remote plane, over the routes of docs/api.md.

Contract: each method is one of the :class:`~..transport.Transport` protocol and answers
as the embedded :class:`~..plane.Plane` does: the same model objects, the same exception
classes (an unknown id is :class:`UnknownInvocation`, a lost lease ``LeaseLost``).
Batch routes are cut to the plane's limits (``max_batch``, ``max_body``,
``max_wait_ids``); a wait longer than the plane's ``max_wait`` becomes several calls.
The request machinery is :class:`~.session.Session`; result watches are
:class:`~.watches.Watches`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from ..errors import (
    Forbidden,
    InvalidRequest,
    LakeshoreError,
    PayloadTooLarge,
    QueueNotFound,
    Unauthorized,
    UnknownInvocation,
)
from ..plane.ids import nameable
from ..plane.model import (
    Claim,
    DaemonRecord,
    HeartbeatAnswer,
    Invocation,
    LogEntry,
    QueueSpec,
    State,
    Submission,
)
from ..transport import Unwatch, put_missing
from ..wire import digest as wire_digest
from ..wire import is_digest, pack, verified
from .answers import date_offset, decode_map
from .connections import origin_of
from .limits import ENVELOPE_ROOM, Limits, batches, carried, carrying_body, size_batches
from .session import Session, is_plane_path
from .views import (
    claim_of,
    daemon_of,
    invocation_of,
    invocations_in,
    item_ok,
    log_entry_of,
    only_answer,
    queue_counts,
    queue_spec,
    submission_body,
)
from .wake import WakeWatch
from .watches import Watches

__all__ = ["HttpTransport"]

#: ids remembered as existing (submitted or read here): watching them needs no check
_KNOWN_IDS = 100_000


def _seg(value: str) -> str:
    """One path segment (a queue name or an id) with everything else escaped."""
    return quote(value, safe="")


def _inv(inv_id: str) -> str:
    """An invocation id as a path segment; one no route can name is no invocation (no
    such id can be submitted), as on the embedded plane, not a request for no route."""
    if not nameable(inv_id):
        raise UnknownInvocation(f"no invocation {inv_id[:40]!r}")
    return _seg(inv_id)


class HttpTransport(Session):
    """A remote plane at ``base_url`` (``https://host[/stage]``). Thread-safe.

    ``timeout`` bounds each request's silence (a long-poll gets its wait on top);
    ``retries`` is how many times a request is repeated after a connection error, a
    ``429`` or a ``5xx`` before the error is raised (``Unavailable`` for connections).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        retries: int = 6,
        backoff: float = 0.2,
        max_backoff: float = 10.0,
        wait_timeout: float = 20.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a plane URL looks like https://host[/stage], not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.wait_timeout = wait_timeout
        self._token = token
        self._origin = origin_of(parts.scheme, parts.hostname, parts.port)
        self._prefix = parts.path.rstrip("/")
        self._ssl = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._threads = weakref.WeakSet()
        self._closed = threading.Event()
        self._hello_lock = threading.Lock()
        self._hello: dict[str, Any] | None = None
        #: the plane's blob directory when this machine can read it (False: it cannot,
        #: None: not looked at yet); see _blob_home
        self._home: Path | bool | None = None
        self._limits = Limits()
        self._offset = 0.0
        self._known: OrderedDict[str, None] = OrderedDict()
        self._uploads: dict[str, str] = {}
        self._watches = Watches(self)
        #: what idle claims on each set of queues watch (planes with wake objects)
        self._wakes: dict[tuple[str, ...], WakeWatch] = {}

    def __repr__(self) -> str:
        return f"HttpTransport({self.base_url!r})"

    # ------------------------------------------------------------------ hello, clock
    def hello(self, *, refresh: bool = False) -> dict[str, Any]:
        """``GET /v1/hello`` (cached): server, version, limits, identity, workers.

        Also measures the offset of the plane's clock (its ``time`` field, else the
        ``Date`` header to the second) from this machine's.
        """
        cached = self._hello
        if cached is not None and not refresh:
            return cached
        with self._hello_lock:
            if self._hello is not None and not refresh:
                return self._hello
            sent = time.time()
            answer = self._call_raw("GET", self._target("/v1/hello"), None)
            received = time.time()
            hello = decode_map(answer)
            middle = (sent + received) / 2
            server_time = hello.get("time")
            if isinstance(server_time, int | float) and not isinstance(server_time, bool):
                self._offset = float(server_time) - middle
            else:
                self._offset = date_offset(answer.headers.get("date"), middle)
            self._limits = Limits.from_hello(hello.get("limits"))
            self._hello = hello
            return hello

    @property
    def limits(self) -> Limits:
        self.hello()
        return self._limits

    def now(self) -> float:
        self.hello()
        return time.time() + self._offset

    def inline_limit(self) -> int:
        """Bytes of arguments or result kept inline: the plane's ``inline_payload``,
        less room for the envelope around them."""
        return max(0, self.limits.inline_payload - ENVELOPE_ROOM)

    # ------------------------------------------------------------------ queues
    def ensure_queue(
        self, spec: QueueSpec, *, create: bool = True, check: Iterable[str] = ()
    ) -> QueueSpec:
        body: dict[str, Any] = {"name": spec.name}
        body.update({k: v for k, v in spec.settings().items() if v is not None})
        if not spec.delete_when_drained:
            del body["delete_when_drained"]  # not in the documented body; False is the default
        body["create"] = create
        body["check"] = list(check)
        return queue_spec(self._call("POST", "/v1/queues", body)["queue"])

    def update_queue(self, name: str, **settings: Any) -> QueueSpec:
        return queue_spec(self._call("PATCH", f"/v1/queues/{_seg(name)}", settings)["queue"])

    def delete_queue(self, name: str, *, force: bool = False) -> int:
        query = {"force": "true"} if force else None
        return int(self._call("DELETE", f"/v1/queues/{_seg(name)}", query=query)["deleted"])

    def list_queues(self) -> list[dict[str, Any]]:
        return [
            {
                "spec": queue_spec(q),
                "last_activity": q.get("last_activity"),
                "counts": queue_counts(q.get("counts")),
                "paused": bool(q.get("paused")),
            }
            for q in self._call("GET", "/v1/queues")["queues"]
        ]

    def prune_queues(self, older_than: float) -> list[str]:
        answer = self._call("POST", "/v1/queues/prune", {"older_than": older_than})
        return [str(n) for n in answer["removed"]]

    def counts(self, name: str) -> dict[str, int]:
        """Counts by public state; a queue that does not exist counts zero (as embedded)."""
        try:
            answer = self._call("GET", f"/v1/queues/{_seg(name)}")
        except QueueNotFound:
            return queue_counts(None)
        queue = answer.get("queue") or {}
        return queue_counts(answer.get("counts", queue.get("counts")))

    # ------------------------------------------------------------------ invocations
    def submit(self, subs: Sequence[Submission]) -> list[str]:
        """Submit in as few calls as ``max_batch`` and ``max_body`` allow.

        Each call is idempotent on the ids, so one retried after a lost answer (or a
        whole submit repeated) never makes a second invocation.
        """
        return self._submit_items([submission_body(s) for s in subs])

    def submit_with_blobs(
        self, subs: Sequence[Submission], blobs: Mapping[str, bytes]
    ) -> list[str]:
        """Submit, with blobs the submissions name that the plane may not have yet.

        On a plane that takes blobs in a submit (hello's ``submit_blobs``), those that
        fit in one request with the submissions travel in it (``blobs``): one request
        instead of a question, an upload each and the submit. The rest are uploaded
        first, as :meth:`missing_blobs` and :meth:`put_blob` do. Idempotent like
        :meth:`submit` (the plane keeps a blob once).
        """
        items = [submission_body(s) for s in subs]
        limits = self.limits
        take: dict[str, bytes] = {}
        if len(items) <= limits.max_batch:
            take = carried(sum(len(pack(item)) for item in items), blobs, limits)
        put_missing(self, {d: b for d, b in blobs.items() if d not in take})
        if not take:
            return self._submit_items(items)
        answer = self._call_parts("POST", "/v1/invocations", carrying_body(items, take))
        ids = [str(i) for i in answer["ids"]]
        self._remember(ids)
        return ids

    def _submit_items(self, items: list[dict[str, Any]]) -> list[str]:
        limits = self.limits
        ids: list[str] = []
        for chunk in size_batches(items, limits.max_batch, limits.max_body):
            ids.extend(
                str(i) for i in self._call("POST", "/v1/invocations", {"invocations": chunk})["ids"]
            )
        self._remember(ids)
        return ids

    def get(self, inv_id: str) -> Invocation:
        view = self._call("GET", f"/v1/invocations/{_inv(inv_id)}")["invocation"]
        self._remember([inv_id])
        return invocation_of(view, self.now())

    def get_many(self, ids: Sequence[str]) -> list[Invocation]:
        """The records of the ids that exist (unknown ones are left out, as embedded)."""
        out = []
        for inv_id in dict.fromkeys(ids):
            with contextlib.suppress(UnknownInvocation):
                out.append(self.get(inv_id))
        return out

    def watch(self, ids: Sequence[str], callback: Callable[[Invocation], None]) -> Unwatch:
        """Call ``callback(record)`` once per id when it is finished.

        Ids this transport has not seen before are checked at once with one zero-second
        wait: an unknown one raises :class:`UnknownInvocation` before anything is
        registered, and finished ones fire from this thread. The rest is awaited by the
        transport's shared long-poll. Returns a function that removes the watch.
        """
        ids = list(dict.fromkeys(ids))
        with self._lock:  # (once for all: a gather's watch has thousands of ids)
            fresh = [i for i in ids if i not in self._known]
        finished = self.finished_now(fresh) if fresh else []
        return self._watches.add(ids, callback, finished)

    def cancel(self, inv_id: str) -> State:
        return State(self._call("POST", f"/v1/invocations/{_inv(inv_id)}/cancel")["state"])

    def set_priority(self, inv_id: str, priority: float) -> Invocation:
        answer = self._call("PATCH", f"/v1/invocations/{_inv(inv_id)}", {"priority": priority})
        return invocation_of(answer["invocation"], self.now())

    def retry(self, inv_id: str) -> Invocation:
        answer = self._call("POST", f"/v1/invocations/{_inv(inv_id)}/retry")
        return invocation_of(answer["invocation"], self.now())

    def list_invocations(
        self, queue: str, state: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Invocation]:
        """A queue's invocations by id after the id ``after`` (views carry no result)."""
        query = {"queue": queue, "limit": str(limit)}
        if state is not None:
            query["state"] = state
        if after is not None:
            query["cursor"] = after
        answer = self._call("GET", "/v1/invocations", query=query)
        return invocations_in(answer, self.now())

    def wait_here(self, inv_id: str, timeout: float | None) -> Invocation | None:
        """Wait for one invocation in the calling thread, one long-poll after another.

        A caller that waits on one result at a time (``SyncQueue.result``) skips the
        shared poller and its two thread hand-overs. Returns None once ``timeout`` has
        passed; raises :class:`UnknownInvocation` for an id the plane does not have.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        cap = self.limits.max_wait
        while True:
            left = cap if deadline is None else min(max(0.0, deadline - time.monotonic()), cap)
            started = time.monotonic()
            for rec in self._wait([inv_id], left):
                if rec.id == inv_id:
                    return rec
            self._remember([inv_id])
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if time.monotonic() - started < left / 2:
                # The plane answered early and empty (it holds no waits): do not spin.
                self._closed.wait(0.1)

    def finished_now(self, ids: Sequence[str]) -> list[Invocation]:
        """The records of those of ``ids`` finished now: one zero-second wait per
        ``max_wait_ids``, not a read of each (a watch hears of a finish only at its
        poller's next answer). Raises :class:`UnknownInvocation` for an id the plane
        does not have; the ids it does have are known from then on (a watch of them
        does not ask again)."""
        out: list[Invocation] = []
        for chunk in batches(list(dict.fromkeys(ids)), self.limits.max_wait_ids):
            out.extend(self._wait(list(chunk), 0.0))
            self._remember(chunk)
        return out

    def _wait(self, ids: list[str], timeout: float) -> list[Invocation]:
        answer = self._call(
            "POST", "/v1/invocations/wait", {"ids": ids, "timeout": timeout}, wait=timeout
        )
        return invocations_in(answer, self.now())

    # ------------------------------------------------------------------ workers
    def claim(
        self,
        queues: Sequence[str],
        worker: str,
        *,
        limit: int = 1,
        wait: float = 0.0,
        lease_seconds: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Claim]:
        """Lease up to ``limit`` invocations, waiting up to ``wait`` seconds for work.

        The server holds each call up to ``max_wait``; longer waits are several calls.
        With ``should_stop`` a call waits at most 2 s so a stop is seen soon.

        A plane with wake objects answers an empty claim at once with what to watch
        (:mod:`.wake`): until its fallback passes, claims on the same queues that may
        wait (``wait`` > 0) only GET the wake objects every ``interval`` seconds (soon
        after a claim that had work, then ever less often up to that), and ask the plane
        again when one changed. The watch outlives the call, so a loop of short claims
        (the process worker's) looks at the same pace.
        """
        if limit < 1:
            raise InvalidRequest("claim limit must be at least 1")
        deadline = time.monotonic() + max(0.0, wait)
        cap = self.limits.max_wait if should_stop is None else min(2.0, self.limits.max_wait)
        key = tuple(sorted(set(queues)))
        while True:
            with self._lock:
                watch = self._wakes.get(key)
            if watch is not None and wait > 0 and not self._watch(watch, deadline, should_stop):
                return []
            chunk = max(0.0, min(deadline - time.monotonic(), cap))
            body: dict[str, Any] = {
                "queues": list(queues),
                "worker": worker,
                "limit": limit,
                "wait": chunk,
            }
            if lease_seconds is not None:
                body["lease_seconds"] = lease_seconds
            started = time.monotonic()
            answer = self._call("POST", "/v1/claims", body, wait=chunk)
            claims = [claim_of(c) for c in answer.get("claims") or ()]
            # (a worker that was watching already, claiming at the fallback, keeps its pace)
            wake = answer.get("wake")
            watch = (
                None if claims else WakeWatch.from_answer(wake, time.monotonic(), soon=not watch)
            )
            with self._lock:
                if watch is not None:
                    self._wakes[key] = watch
                else:
                    self._wakes.pop(key, None)
            remaining = deadline - time.monotonic()
            if claims or remaining <= 0 or (should_stop is not None and should_stop()):
                return claims
            if watch is not None:
                continue
            if time.monotonic() - started < chunk / 2:
                # The server answered early and empty: do not spin on it.
                self._closed.wait(min(0.1, remaining))

    def _watch(
        self, watch: WakeWatch, deadline: float, should_stop: Callable[[], bool] | None
    ) -> bool:
        """Look at the wake objects on the watch's pace until one changed or the
        fallback passed (True: claim now), or until ``deadline``, a stop or close
        (False: answer empty)."""
        while True:
            now = time.monotonic()
            if watch.expired(now):
                return True
            if now >= watch.next_look:
                if watch.look(self._wake_status):
                    return True
                continue
            if now >= deadline or (should_stop is not None and should_stop()):
                return False
            pause = min(watch.next_look, watch.claim_at, deadline) - now
            if should_stop is not None:
                pause = min(pause, 0.5)
            if self._closed.wait(pause):
                return False

    def _wake_status(self, url: str, etag: str) -> int:
        """The HTTP status of a conditional GET of a wake object (0: it failed)."""
        target = self._resolve(url)
        headers = self._headers(target, accept="*/*")
        if etag:
            headers["If-None-Match"] = etag
        try:
            return self._exchange("GET", target, None, headers, self.timeout).status
        except LakeshoreError:
            return 0

    def heartbeat(
        self, inv_id: str, lease_token: str, *, lease_seconds: float | None = None
    ) -> HeartbeatAnswer:
        body: dict[str, Any] = {"leases": [{"id": inv_id, "lease_token": lease_token}]}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        item = only_answer(self._call("POST", "/v1/heartbeats", body))
        expires = item.get("lease_expires_at")
        return HeartbeatAnswer(
            id=str(item.get("id", inv_id)),
            ok=bool(item.get("ok")),
            cancel=bool(item.get("cancel")),
            lease_expires_at=None if expires is None else float(expires),
        )

    def complete(self, inv_id: str, lease_token: str, result: bytes) -> None:
        """Record the result; raises the item's error (``LeaseLost``, ...) if refused."""
        body = {"results": [{"id": inv_id, "lease_token": lease_token, "result": result}]}
        item_ok(only_answer(self._call("POST", "/v1/completions", body)))

    def fail(
        self, inv_id: str, lease_token: str, error: dict[str, Any], *, retryable: bool = True
    ) -> State:
        item = {"id": inv_id, "lease_token": lease_token, "error": error, "retryable": retryable}
        answer = item_ok(only_answer(self._call("POST", "/v1/failures", {"failures": [item]})))
        return State(answer["state"])

    def complete_many(self, items: Sequence[tuple[str, str, bytes]]) -> list[Exception | None]:
        """Several results in as few calls as the limits allow."""
        rows = [{"id": i, "lease_token": t, "result": r} for i, t, r in items]
        return self._batch("/v1/completions", "results", rows)

    def fail_many(
        self, items: Sequence[tuple[str, str, dict[str, Any], bool]]
    ) -> list[Exception | None]:
        rows = [{"id": i, "lease_token": t, "error": e, "retryable": r} for i, t, e, r in items]
        return self._batch("/v1/failures", "failures", rows)

    def _batch(self, path: str, key: str, rows: list[dict[str, Any]]) -> list[Exception | None]:
        out: list[Exception | None] = []
        for run in size_batches(rows, self.limits.max_batch, self.limits.max_body):
            for answer in self._call("POST", path, {key: run})["answers"]:
                try:
                    item_ok(answer)
                    out.append(None)
                except Exception as exc:
                    out.append(exc)
        return out

    def release(self, inv_id: str, lease_token: str) -> None:
        """Hand a claim back untried; raises the item's error (``LeaseLost``)."""
        body = {"leases": [{"id": inv_id, "lease_token": lease_token}]}
        item_ok(only_answer(self._call("POST", "/v1/releases", body)))

    def report_progress(
        self, inv_id: str, lease_token: str, fraction: float, message: str | None = None
    ) -> None:
        body = {"id": inv_id, "lease_token": lease_token, "fraction": fraction, "message": message}
        self._call("POST", "/v1/progress", body)

    def append_logs(
        self, inv_id: str, lease_token: str, chunks: Sequence[tuple[int, str, str]]
    ) -> None:
        """Send output chunks, ``max_batch`` a call (a resent chunk is kept once)."""
        rows = [[n, stream, text] for n, stream, text in chunks]
        for batch in size_batches(rows, self.limits.max_batch, self.limits.max_body):
            body = {"id": inv_id, "lease_token": lease_token, "chunks": batch}
            self._call("POST", "/v1/logs", body)

    def read_logs(self, inv_id: str, after: int = 0, limit: int = 1000) -> list[LogEntry]:
        query = {"after": str(after), "limit": str(limit)}
        answer = self._call("GET", f"/v1/invocations/{_inv(inv_id)}/logs", query=query)
        return [log_entry_of(e) for e in answer.get("entries") or ()]

    # ------------------------------------------------------------------ daemons
    def register_daemon(
        self,
        name: str,
        *,
        daemon_id: str | None = None,
        queues: Sequence[str] = (),
        concurrency: int = 1,
        python: str = "",
        pickle_protocols: Sequence[int] = (),
        host: str = "",
    ) -> DaemonRecord:
        body: dict[str, Any] = {
            "name": name,
            "queues": list(queues),
            "concurrency": concurrency,
            "python": python,
            "pickle_protocols": list(pickle_protocols),
            "host": host,
        }
        if daemon_id is not None:
            body["id"] = daemon_id
        return daemon_of(self._call("POST", "/v1/daemons", body)["daemon"])

    def daemon_heartbeat(
        self, daemon_id: str, running: int | None = None, *, stopped: bool = False
    ) -> DaemonRecord:
        body: dict[str, Any] = {} if running is None else {"running": running}
        if stopped:
            body["stopped"] = True
        path = f"/v1/daemons/{_seg(daemon_id)}/heartbeat"
        return daemon_of(self._call("POST", path, body)["daemon"])

    def list_daemons(self) -> list[DaemonRecord]:
        return [daemon_of(d) for d in self._call("GET", "/v1/daemons")["daemons"]]

    def update_daemon(
        self,
        daemon_id: str,
        *,
        add_queues: Sequence[str] = (),
        remove_queues: Sequence[str] = (),
        concurrency: int | None = None,
    ) -> DaemonRecord:
        body: dict[str, Any] = {
            "add_queues": list(add_queues),
            "remove_queues": list(remove_queues),
        }
        if concurrency is not None:
            body["concurrency"] = concurrency
        return daemon_of(self._call("PATCH", f"/v1/daemons/{_seg(daemon_id)}", body)["daemon"])

    def drain_daemon(self, daemon_id: str) -> DaemonRecord:
        return daemon_of(self._call("POST", f"/v1/daemons/{_seg(daemon_id)}/drain")["daemon"])

    def remove_daemon(self, daemon_id: str) -> bool:
        return bool(self._call("DELETE", f"/v1/daemons/{_seg(daemon_id)}")["removed"])

    # ------------------------------------------------------------------ tokens (admin)
    def create_token(
        self, role: str, queues: Sequence[str] = ("*",), name: str = ""
    ) -> dict[str, Any]:
        """Make a token: the answer holds its secret (``token``), shown this once."""
        body = {"role": role, "queues": list(queues), "name": name}
        return self._call("POST", "/v1/tokens", body)

    def list_tokens(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/tokens")["tokens"])

    def revoke_token(self, token_id: str) -> None:
        self._call("DELETE", f"/v1/tokens/{_seg(token_id)}")

    # ------------------------------------------------------------------ data keys
    def put_data(self, key: str, digest: str) -> None:
        """Point ``key`` at an uploaded blob (``POST /v1/data``)."""
        self._call("POST", "/v1/data", {"key": key, "digest": digest})

    def data_digests(self, keys: Sequence[str]) -> dict[str, str]:
        """The digests of the keys that exist (``POST /v1/data/lookup``)."""
        found: dict[str, str] = {}
        for batch in batches(list(keys), self.limits.max_batch):
            answer = self._call("POST", "/v1/data/lookup", {"keys": list(batch)})
            found.update({str(k): str(d) for k, d in (answer.get("digests") or {}).items()})
        return found

    def blob_url(self, digest: str) -> str:
        """A URL that serves the blob without a token (``GET /v1/blobs/{digest}/url``);
        a relative one is made absolute on this plane's base URL."""
        url = str(self._call("GET", f"/v1/blobs/{digest}/url")["url"])
        return self.base_url + url if is_plane_path(url) else url

    # ------------------------------------------------------------------ blobs
    def missing_blobs(self, digests: Iterable[str]) -> set[str]:
        """The digests the plane lacks; their signed upload URLs are kept for put_blob."""
        wanted = list(dict.fromkeys(digests))
        missing: set[str] = set()
        for chunk in batches(wanted, self.limits.max_batch):
            answer = self._call("POST", "/v1/blobs/missing", {"digests": list(chunk)})
            missing.update(str(d) for d in answer.get("missing") or ())
            uploads = answer.get("upload") or {}
            with self._lock:
                self._uploads.update({str(d): str(u) for d, u in uploads.items()})
        return missing

    def put_blob(self, digest: str, data: bytes) -> None:
        """Upload by the signed URL :meth:`missing_blobs` got, else ``PUT /v1/blobs``.

        A relative URL is the plane's own; an absolute one (an S3 presigned URL) is used
        as it is, without the bearer token. A signature that has run out is asked for
        again once.
        """
        if wire_digest(data) != digest:
            raise InvalidRequest("blob digest does not match its bytes")
        limit = self.limits.max_blob
        if limit and len(data) > limit:
            raise PayloadTooLarge(
                f"blob of {len(data)} bytes is over the plane's {limit} byte blob limit"
            )
        with self._lock:
            url = self._uploads.pop(digest, None)
        if url is not None:
            try:
                self._blob("PUT", self._resolve(url), data)
                return
            except (Unauthorized, Forbidden):
                if digest not in self.missing_blobs([digest]):
                    return
                with self._lock:
                    url = self._uploads.pop(digest, None)
                if url is not None:
                    self._blob("PUT", self._resolve(url), data)
                    return
        self._blob("PUT", self._target(f"/v1/blobs/{digest}"), data)

    def get_blob(self, digest: str, *, check: bool = True) -> bytes:
        """The blob's bytes, checked against the digest; a redirect (to S3, say) is
        followed without the token.

        ``check=False`` leaves the check to the caller (one hash of the bytes, not two):
        only for a caller that checks them itself before use, as the worker's executor
        does with every blob it loads.
        """
        local = self._local_blob(digest)
        if local is not None and (not check or wire_digest(local) == digest):
            return local
        data = self._blob("GET", self._target(f"/v1/blobs/{digest}"), None)
        return verified(digest, data) if check else data

    def _local_blob(self, digest: str) -> bytes | None:
        """The blob read from the plane's own blob directory, when this process can see
        it (a client on the machine of ``lakeshore serve``): no request, and its bytes
        are checked as those of an HTTP read are. None otherwise, and for a blob the
        plane keeps elsewhere (a plane file from before blob files)."""
        home = self._blob_home()
        if home is None or not is_digest(digest):
            return None
        try:
            return (home / digest).read_bytes()
        except OSError:
            return None

    def _blob_home(self) -> Path | None:
        """The directory ``GET /v1/hello`` names under ``blobs``, if this process finds
        the same id in its ``.id`` file (the same plane's files, not some other
        directory of that name on another machine); looked at once."""
        home = self._home
        if home is None:
            home = False
            named = self.hello().get("blobs")
            if isinstance(named, Mapping):
                where, ident = named.get("dir"), named.get("id")
                if isinstance(where, str) and isinstance(ident, str) and ident:
                    path = Path(where)
                    with contextlib.suppress(OSError, ValueError):
                        if path.is_absolute() and (path / ".id").read_text().strip() == ident:
                            home = path
            self._home = home
        return home if isinstance(home, Path) else None

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the watch threads and close every connection. Calls after it fail."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._watches.close()
        self._close_connections()

    # ------------------------------------------------------------------ known ids
    def _remember(self, ids: Iterable[str]) -> None:
        with self._lock:
            for inv_id in ids:
                self._known[inv_id] = None
                self._known.move_to_end(inv_id)
            while len(self._known) > _KNOWN_IDS:
                self._known.popitem(last=False)
