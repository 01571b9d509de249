"""The HTTP API v1 over the plane core: one method per route, transport-free.

Each method takes the caller's :class:`~.auth.Identity`, the decoded request map and
path parameters, checks role, scope and fields, calls the plane, and returns the answer
map. It knows nothing of Lambda, ASGI or content types (see ``handlers/api.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .. import __version__, logs
from ..dashboard import PauseFlags, call_summary, queue_stats
from ..errors import InvalidRequest, LakeshoreError, NotFound, PayloadTooLarge, QueueNotFound
from ..metrics import Registry
from ..plane import Plane
from ..plane.blobs import BlobUpload
from ..plane.model import Invocation, QueueSpec, RetryPolicy, Submission
from ..plane.store import blob_home, wake_objects
from ..submit import IdGroups, new_id
from ..wire import (
    PICKLE_PROTOCOL,
    PY_VERSION,
    WIRE_VERSION,
    decode_payload,
    encode_exec,
    encode_ref_call,
    is_digest,
    unpack,
)
from . import auth
from .auth import Identity, create_token
from .codec import NUM, OPT_NUM, as_bytes, fields
from .worker_routes import WorkerRoutes

__all__ = ["Limits", "Service"]

_log = logging.getLogger("dreamlake.lakeshore.api")

_QUEUE_FIELDS: dict[str, Any] = {
    "name": str,
    "kind": (str, type(None)),
    "priority_field": (str, type(None)),
    "temperature": OPT_NUM,
    "anneal": (dict, type(None)),
    "elasticity": (dict, type(None)),
    "retry": (dict, type(None)),
    "delete_when_drained": bool,
}
_SUBMISSION: dict[str, Any] = {
    "id": (str, type(None)),
    "queue": str,
    "payload": (bytes, str, type(None)),
    "ref": (str, type(None)),
    "args": (list, type(None)),
    "kwargs": (dict, type(None)),
    "exec": (dict, type(None)),
    "priority": OPT_NUM,
    "delay": OPT_NUM,
    "timeout": OPT_NUM,
    "max_attempts": (int, type(None)),
    "retry": (dict, type(None)),
}
_SUBMIT: dict[str, Any] = {"invocations": list, "blobs": (dict, type(None))}
#: the longest delay a submit may ask for (a year)
_MAX_DELAY = 366 * 86400.0
#: a daemon not heard from for this long no longer counts as a live worker
_DAEMON_STALE = 300.0


@dataclass(frozen=True)
class Limits:
    #: bytes of one request body (API Gateway allows 10 MB; Lambda ≈ 4.4 MB of binary)
    max_body: int = 4 * 1024 * 1024
    #: bytes a payload or result may have inline; larger ones travel as blobs
    inline_payload: int = 256 * 1024
    #: bytes of one blob (an upload to ``lakeshore serve`` streams to a file past
    #: ``max_body``; on AWS blobs go to S3, whose single PUT takes 5 GiB)
    max_blob: int = 5 * 1024**3
    #: items in one batch call
    max_batch: int = 500
    #: seconds a claim or wait may block on the server (a plane with wake objects
    #: answers an empty claim at once instead: see ``wake_interval``)
    max_wait: float = 20.0
    #: on a plane with wake objects (DynamoDB + S3): how often an idle worker GETs the
    #: wake objects of its queues, and how long it goes without a real claim at most
    wake_interval: float = 4.5
    wake_fallback: float = 120.0


def _retry(value: Any) -> RetryPolicy | None:
    if value is None:
        return None
    body = fields(value, {"max": int, "backoff": NUM, "max_backoff": NUM}, where="retry")
    return RetryPolicy(**body)  # (its values are the plane's to check)


def _spec_view(spec: QueueSpec) -> dict[str, Any]:
    return {"name": spec.name, **spec.settings()}


def invocation_view(rec: Invocation, now: float, *, result: bool = True) -> dict[str, Any]:
    """The wire form of an invocation record."""
    expired = rec.is_expired(now)
    view: dict[str, Any] = {
        "id": rec.id,
        "queue": rec.queue,
        "state": rec.public_state(now).value,
        "attempt": rec.attempt,
        "max_attempts": rec.max_attempts,
        "priority": rec.priority,
        "created_at": rec.created_at,
        "available_at": rec.available_at,
        "started_at": rec.started_at,
        "finished_at": rec.finished_at,
        "expires_at": rec.expires_at,
        "expired": expired,
        "worker": rec.worker,
        "timeout": rec.timeout,
        "error": rec.error,
        "progress": rec.progress,
        "progress_message": rec.progress_message,
    }
    if result and rec.result is not None and not expired:
        view["result"] = rec.result
        env = unpack(rec.result)
        if isinstance(env, dict) and env.get("kind") == "msgpack":
            view["value"] = env.get("data")
    return view


class Service(WorkerRoutes):
    """The API over one plane. Thread-safe (the plane is). The worker routes are in
    :mod:`.worker_routes`."""

    def __init__(
        self,
        plane: Plane,
        *,
        limits: Limits | None = None,
        signing_key: bytes | None = None,
        server: str = "lakeshore",
        metrics: Registry | None = None,
    ) -> None:
        self.plane = plane
        self.limits = limits or Limits()
        self._key = signing_key or secrets.token_bytes(32)
        self.server = server
        #: what the service counts (``GET /metrics``; EMF on Lambda)
        self.metrics = metrics or Registry()
        #: called with :attr:`metrics` before each ``GET /metrics`` answer, for what a
        #: server around the service counts (``lakeshore serve``: the requests it holds)
        self.gauges: list[Callable[[Registry], None]] = []
        self.pauses = PauseFlags(plane)
        self.wakes = wake_objects(plane.store)
        # attempts the plane fails itself (past their timeout) count as a worker's do
        plane.on_attempt_ended = self._attempt_ended

    def _attempt_ended(self, rec: Invocation, outcome: str, error_type: str | None) -> None:
        self._finished(rec, outcome, error_type=error_type)

    # ------------------------------------------------------------------ hello
    def hello(self, ident: Identity) -> dict[str, Any]:
        now = self.plane.now()
        live = [
            d
            for d in self.plane.store.list_daemons()
            if now - d.last_heartbeat < _DAEMON_STALE and d.stopped_at is None
        ]
        return {
            "server": self.server,
            "version": __version__,
            "time": now,
            "wire": [WIRE_VERSION],
            "limits": {
                "max_body": self.limits.max_body,
                "inline_payload": self.limits.inline_payload,
                "max_batch": self.limits.max_batch,
                "max_wait": self.limits.max_wait,
                "max_wait_ids": self.limits.max_batch * 20,
                "submit_blobs": self.limits.max_body,
                "max_blob": self.max_blob,
            },
            "identity": {
                "token_id": ident.token_id,
                "role": ident.role,
                "queues": list(ident.queues),
            },
            "workers": {
                "python": sorted({d.python for d in live}),
                "pickle_protocols": sorted({p for d in live for p in d.pickle_protocols}),
            },
            "plane": {"python": PY_VERSION, "pickle_protocol": PICKLE_PROTOCOL},
            **self._blob_home(),
        }

    def _blob_home(self) -> dict[str, Any]:
        """``blobs``: the directory a plane file keeps its blobs in and its id, for
        clients on this machine to read them there (none for other stores)."""
        home = blob_home(self.plane.store)
        return {} if home is None else {"blobs": {"dir": home[0], "id": home[1]}}

    # ------------------------------------------------------------------ queues
    def create_queue(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("producer", "worker")
        schema = {**_QUEUE_FIELDS, "create": bool, "check": list}
        body = fields(body, schema, required=("name",))
        create = body.pop("create", True)
        check = body.pop("check", [])
        ident.check_queue(body["name"])
        if not all(isinstance(c, str) and c in _QUEUE_FIELDS and c != "name" for c in check):
            raise InvalidRequest("check must list queue settings")
        spec = QueueSpec(**{k: v for k, v in body.items() if v is not None})
        stored = self.plane.ensure_queue(spec, create=create, check=check)
        return {"queue": _spec_view(stored)}

    def _queue_views(self, ident: Identity) -> list[dict[str, Any]]:
        found = [q for q in self.plane.list_queues() if ident.may_use(q["spec"].name)]
        paused = self.pauses.paused(q["spec"].name for q in found)
        out = []
        for q in found:
            spec: QueueSpec = q["spec"]
            self.metrics.counts(spec.name, q["counts"])
            view = {**_spec_view(spec), "last_activity": q["last_activity"]}
            out.append({**view, "counts": q["counts"], "paused": spec.name in paused})
        return out

    def list_queues(self, ident: Identity) -> dict[str, Any]:
        return {"queues": self._queue_views(ident)}

    def get_queue(self, ident: Identity, name: str) -> dict[str, Any]:
        ident.check_queue(name)
        for view in self._queue_views(ident):
            if view["name"] == name:
                return {"queue": view}
        raise QueueNotFound(f"queue {name!r} does not exist")

    def update_queue(self, ident: Identity, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Change settings; ``paused`` (true or false) holds back or releases claims."""
        ident.require("producer")
        ident.check_queue(name)
        schema = {k: v for k, v in _QUEUE_FIELDS.items() if k not in ("name", "kind")}
        changes = fields(body, {**schema, "paused": bool})
        paused = changes.pop("paused", None)
        spec = self.plane.update_queue(name, **changes) if changes else self.plane.get_queue(name)
        if paused is not None:
            self.pauses.set_paused(name, paused)
            logs.event(_log, "queue.paused" if paused else "queue.resumed", queue=name)
            if not paused:
                self.plane.wake_idle([name])  # (its idle workers claim again)
        return {"queue": {**_spec_view(spec), "paused": name in self.pauses.paused([name])}}

    def stats(self, ident: Identity, query: dict[str, str]) -> dict[str, Any]:
        """Per-minute submits, outcomes and queue times over the last ``window`` seconds
        (3600 by default, 300 to 21600), for ``queue`` or every queue in scope."""
        q = fields(query, {"queue": str, "window": str}, where="query")
        try:
            window = float(q.get("window", "3600"))
        except ValueError:
            raise InvalidRequest("window must be a number of seconds") from None
        if not 300 <= window <= 21600:
            raise InvalidRequest("window must be 300 to 21600 seconds")
        if "queue" in q:
            ident.check_queue(q["queue"])
            self.plane.get_queue(q["queue"])
            names = [q["queue"]]
        else:
            names = [s.name for s, _ in self.plane.store.list_queues() if ident.may_use(s.name)]
        return {
            "time": self.plane.now(),
            "window": window,
            "queues": [queue_stats(self.plane, name, window=window) for name in sorted(names)],
        }

    def metrics_text(self, ident: Identity) -> str:
        """The Prometheus exposition of :attr:`metrics`, queue gauges read just now."""
        ident.require()
        self._queue_views(ident)
        for gauge in self.gauges:
            gauge(self.metrics)
        return self.metrics.prometheus()

    def delete_queue(self, ident: Identity, name: str, force: bool) -> dict[str, Any]:
        ident.require("producer")
        ident.check_queue(name)
        return {"deleted": self.plane.delete_queue(name, force=force)}

    def prune_queues(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require()
        body = fields(body, {"older_than": NUM}, required=("older_than",))
        return {"removed": self.plane.prune_queues(float(body["older_than"]))}

    # ------------------------------------------------------------------ invocations
    def submit(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        """Submit invocations; ``blobs`` (digest → bytes), when given, are stored first,
        each checked against its digest (a mismatch stores nothing and submits nothing),
        so a call's argument blob needs no upload of its own."""
        subs, blobs = self._submit_parts(ident, body)
        if blobs:
            self.plane.put_blobs(blobs)
        created = []
        for name in sorted({s.queue for s in subs}):
            if self.plane.store.get_queue(name) is None:
                self.plane.ensure_queue(QueueSpec(name))  # first submit creates, as in the SDK
                created.append(name)
        try:
            # (making a queue woke its watchers before the records exist: one that claimed
            # in between marked it idle, which the plane's submit reads again after its write)
            ids = self.plane.submit(subs)
        except LakeshoreError:
            for name in created:  # a refused submit leaves no queue behind
                if not any(self.plane.counts(name).values()):
                    self.plane.delete_queue(name)
            raise
        per_queue: dict[str, int] = {}
        for sub in subs:
            per_queue[sub.queue] = per_queue.get(sub.queue, 0) + 1
            logs.event(_log, "invocation.submitted", sub.id, queue=sub.queue)
        for name, n in per_queue.items():
            self.metrics.submitted(name, n)
        return {"ids": ids}

    def carry(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any] | None:
        """The first half of a submit that carries blobs, for a caller that makes its
        records apart (``lakeshore serve`` stores a large submit's blobs on a request
        thread and submits the rest on its event loop, where a call can be handed to a
        parked claim): the submit checked as :meth:`submit` checks it, its blobs stored,
        and its body without them returned, to submit next; None when it carries none
        (nothing done). Raises as :meth:`submit` would, having stored nothing."""
        if not isinstance(body, dict) or not body.get("blobs"):
            return None
        _, blobs = self._submit_parts(ident, body)
        self.plane.put_blobs(blobs)
        return {key: value for key, value in body.items() if key != "blobs"}

    def _submit_parts(
        self, ident: Identity, body: dict[str, Any]
    ) -> tuple[list[Submission], dict[str, bytes]]:
        """A submit's records to make and the blobs it carries, each checked (the blobs
        not yet against their digests: storing them does that)."""
        ident.require("producer")
        body = fields(body, _SUBMIT, required=("invocations",))
        items = body["invocations"]
        if not items or len(items) > self.limits.max_batch:
            raise InvalidRequest(f"invocations must hold 1 to {self.limits.max_batch} items")
        groups = IdGroups() if len(items) > 1 else None
        subs = [self._submission(ident, item, i, groups) for i, item in enumerate(items)]
        return subs, self._carried_blobs(body.get("blobs"))

    def _carried_blobs(self, raw: dict[str, Any] | None) -> dict[str, bytes]:
        """The ``blobs`` of a submit, each named by a sha256 (not yet checked)."""
        if not raw:
            return {}
        if len(raw) > self.limits.max_batch:
            raise InvalidRequest(f"blobs must hold at most {self.limits.max_batch} blobs")
        out = {}
        for digest, data in raw.items():
            if not is_digest(digest):
                raise InvalidRequest("blobs are named by their sha256 (64 lower-case hex digits)")
            out[digest] = as_bytes(data, f"blobs[{digest[:12]}…]")
            if len(out[digest]) > self.max_blob:
                raise PayloadTooLarge(
                    f"blob of {len(out[digest])} bytes is over the {self.max_blob} byte blob limit"
                )
        return out

    def _submission(
        self, ident: Identity, item: Any, i: int, groups: IdGroups | None
    ) -> Submission:
        """One item of a submit; without an id it takes the next of its queue's group."""
        where = f"invocations[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be a map")
        body = fields(item, _SUBMISSION, required=("queue",), where=where)
        ident.check_queue(body["queue"])
        kinds = [k for k in ("payload", "ref", "exec") if body.get(k) is not None]
        if len(kinds) != 1:
            raise InvalidRequest(f"{where} needs exactly one of payload, ref, exec")
        kwargs: dict[str, Any] = {}
        if kinds == ["payload"]:
            payload = as_bytes(body["payload"], f"{where}.payload")
            if len(payload) > self.limits.inline_payload:
                raise InvalidRequest(
                    f"{where}.payload is over the {self.limits.inline_payload} byte inline "
                    "limit: send its arguments as a blob"
                )
            decode_payload(payload)
        elif kinds == ["ref"]:
            kwargs = body.get("kwargs") or {}
            payload = encode_ref_call(body["ref"], tuple(body.get("args") or ()), kwargs).payload
        else:
            spec = fields(
                body["exec"],
                {"cmd": (str, list), "env": dict, "cwd": (str, type(None))},
                required=("cmd",),
                where=f"{where}.exec",
            )
            payload = encode_exec(spec["cmd"], spec.get("env"), spec.get("cwd")).payload
        if not 0 <= float(body.get("delay") or 0.0) <= _MAX_DELAY:
            raise InvalidRequest(f"{where}.delay must be 0 to {_MAX_DELAY:.0f} seconds")
        priority = body.get("priority")
        if priority is None:
            stored = self.plane.store.get_queue(body["queue"])
            if stored is not None and stored.kind in ("priority", "boltzmann"):
                priority = kwargs.get(stored.priority_field)
            if not isinstance(priority, NUM) or isinstance(priority, bool):
                priority = 0.0
        inv_id = body.get("id") or (new_id() if groups is None else groups.next_id(body["queue"]))
        return Submission(
            id=inv_id,
            queue=body["queue"],
            payload=payload,
            priority=float(priority),
            delay=float(body.get("delay") or 0.0),
            timeout=body.get("timeout"),
            max_attempts=body.get("max_attempts"),
            retry=_retry(body.get("retry")),
        )

    def _readable(self, ident: Identity, inv_id: str) -> Invocation:
        ident.require("producer")
        rec = self.plane.get(inv_id)
        ident.check_queue(rec.queue)
        return rec

    def get_invocation(self, ident: Identity, inv_id: str) -> dict[str, Any]:
        rec = self._readable(ident, inv_id)
        view = invocation_view(rec, self.plane.now())
        return {"invocation": {**view, "call": call_summary(rec.payload)}}

    def list_invocations(self, ident: Identity, query: dict[str, str]) -> dict[str, Any]:
        ident.require("producer")
        q = fields(
            query,
            {"queue": str, "state": str, "limit": str, "cursor": str},
            required=("queue",),
            where="query",
        )
        ident.check_queue(q["queue"])
        try:
            limit = int(q.get("limit", "100"))
        except ValueError:
            raise InvalidRequest("limit must be a whole number") from None
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be 1 to 1000")
        now = self.plane.now()
        recs = self.plane.list_invocations(q["queue"], q.get("state"), q.get("cursor"), limit)
        nxt = recs[-1].id if len(recs) == limit else None
        return {"invocations": [invocation_view(r, now, result=False) for r in recs], "next": nxt}

    def wait(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("producer")
        body = fields(body, {"ids": list, "timeout": NUM, "since": NUM}, required=("ids",))
        ids = body["ids"]
        if (
            not ids
            or len(ids) > self.limits.max_batch * 20
            or not all(isinstance(i, str) for i in ids)
        ):
            raise InvalidRequest(
                f"ids must hold 1 to {self.limits.max_batch * 20} invocation ids, each a string"
            )
        if not ident.unscoped:  # (a wait on thousands of ids must not read them twice)
            for rec in self.plane.get_many(ids):
                ident.check_queue(rec.queue)
        timeout = min(max(0.0, float(body.get("timeout", 0.0))), self.limits.max_wait)
        since = body.get("since")
        # The cursor for the caller's next wait on these ids, taken before this one looks.
        cursor = self.plane.wait_cursor()
        done = self.plane.wait(ids, timeout, since=None if since is None else float(since))

        def answer(records: list[Invocation]) -> dict[str, Any]:
            now = self.plane.now()
            return {"invocations": [invocation_view(r, now) for r in records], "cursor": cursor}

        # parked (lakeshore serve): the finish that wakes it brings its answer
        self.plane.changes.then(lambda records_of: lambda recs: answer(records_of(recs)))
        return answer(done)

    def cancel(self, ident: Identity, inv_id: str) -> dict[str, Any]:
        rec = self._readable(ident, inv_id)
        state = self.plane.cancel(inv_id).value
        logs.event(_log, "invocation.cancelled", inv_id, queue=rec.queue, state=state)
        return {"state": state}

    def update_invocation(
        self, ident: Identity, inv_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self._readable(ident, inv_id)
        body = fields(body, {"priority": NUM}, required=("priority",))
        rec = self.plane.set_priority(inv_id, float(body["priority"]))
        return {"invocation": invocation_view(rec, self.plane.now())}

    def retry(self, ident: Identity, inv_id: str) -> dict[str, Any]:
        rec = self._readable(ident, inv_id)
        again = self.plane.retry(inv_id)
        logs.event(_log, "invocation.retried", inv_id, queue=rec.queue, by="request")
        return {"invocation": invocation_view(again, self.plane.now())}

    def read_logs(self, ident: Identity, inv_id: str, query: dict[str, str]) -> dict[str, Any]:
        self._readable(ident, inv_id)
        q = fields(query, {"after": str, "limit": str}, where="query")
        try:
            after, limit = int(q.get("after", "0")), int(q.get("limit", "1000"))
        except ValueError:
            raise InvalidRequest("after and limit must be whole numbers") from None
        if not 1 <= limit <= 10_000:
            raise InvalidRequest("limit must be 1 to 10000")
        if after < 0:
            raise InvalidRequest("after must be a sequence number >= 0")
        entries = self.plane.read_logs(inv_id, after, limit)
        rec = self.plane.get(inv_id)
        return {
            "entries": [asdict(e) for e in entries],
            "next": entries[-1].seq if entries else after,
            "state": rec.public_state(self.plane.now()).value,
        }

    # ------------------------------------------------------------------ blobs
    def sign(self, method: str, digest: str, expires: int) -> str:
        msg = f"{method}:{digest}:{expires}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def signed_url(self, method: str, digest: str, ttl: int = 900) -> str:
        """A URL that moves one blob without a token: the store's own (S3 presigned)
        when it has one, else this API's ``/v1/blobs/{digest}`` with an HMAC signature."""
        store_url = getattr(self.plane.store, "blob_url", None)
        if store_url is not None:
            return str(store_url(method, digest, ttl))
        expires = int(time.time()) + ttl
        return f"/v1/blobs/{digest}?expires={expires}&sig={self.sign(method, digest, expires)}"

    def check_signature(self, method: str, digest: str, query: dict[str, str]) -> bool:
        """Whether the query carries a valid, unexpired signature for this request."""
        try:
            expires = int(query.get("expires", ""))
        except ValueError:
            return False
        if expires < time.time():
            return False
        given = query.get("sig", "")
        return given.isascii() and hmac.compare_digest(self.sign(method, digest, expires), given)

    def missing_blobs(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("producer", "worker")
        body = fields(body, {"digests": list}, required=("digests",))
        digests = body["digests"]
        if len(digests) > self.limits.max_batch or not all(is_digest(d) for d in digests):
            raise InvalidRequest("digests must be sha256s (64 lower-case hex digits)")
        missing = sorted(self.plane.missing_blobs(digests))
        return {"missing": missing, "upload": {d: self.signed_url("PUT", d) for d in missing}}

    @property
    def max_blob(self) -> int:
        """Bytes of one blob this plane takes: ``limits.max_blob`` where blobs are files
        (a plane file) or S3 objects (signed URLs); no more than a request where they
        are rows of the database (a ``":memory:"`` plane)."""
        store = self.plane.store
        if blob_home(store) is not None or callable(getattr(store, "blob_url", None)):
            return self.limits.max_blob
        return min(self.limits.max_blob, self.limits.max_body)

    def put_blob(self, digest: str, data: bytes) -> None:
        if len(data) > self.max_blob:
            raise PayloadTooLarge(
                f"blob of {len(data)} bytes is over the {self.max_blob} byte blob limit"
            )
        self.plane.put_blob(digest, data)

    def upload_blob(self, digest: str, size: int | None) -> BlobUpload:
        """A blob ``PUT`` in pieces as its body arrives (``size``: its declared length,
        refused at once when over the limit, as is the upload that grows past it). Only
        a plane that writes blob files takes more than a request this way: another one
        keeps the pieces in memory until the end (on AWS, large blobs go to S3 by the
        signed URLs of ``POST /v1/blobs/missing``)."""
        limit, where = self.max_blob, "blob limit"
        if blob_home(self.plane.store) is None and limit > self.limits.max_body:
            limit, where = self.limits.max_body, "limit of a blob put through the API"
            if callable(getattr(self.plane.store, "blob_url", None)):
                where += " (larger ones go by the signed URLs of POST /v1/blobs/missing)"
        if size is not None and size > limit:
            raise PayloadTooLarge(f"blob of {size} bytes is over the {limit} byte {where}")
        return self.plane.blob_upload(digest, limit=limit)

    def get_blob(self, digest: str) -> bytes:
        return self.plane.get_blob(digest)

    def blob_file(self, digest: str) -> str | None:
        """The path of the file a plane file keeps the blob in, for a server to send
        it from in pieces; None when there is no such file (read it with get_blob)."""
        home = blob_home(self.plane.store)
        if home is None or not is_digest(digest):
            return None
        path = os.path.join(home[0], digest)
        return path if os.path.isfile(path) else None

    def blob_url(self, ident: Identity, digest: str) -> dict[str, Any]:
        """A signed URL that serves one blob without a token, for a while."""
        ident.require("producer", "worker")
        if not self.plane.store.has_blobs([digest]):
            raise NotFound(f"no blob {digest!r} on this plane")
        return {"url": self.signed_url("GET", digest)}

    # ------------------------------------------------------------------ data keys
    def put_data(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("producer", "worker")
        body = fields(body, {"key": str, "digest": str}, required=("key", "digest"))
        self.plane.put_data(body["key"], body["digest"])
        return {"ok": True}

    def data_lookup(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("producer", "worker")
        body = fields(body, {"keys": list}, required=("keys",))
        keys = body["keys"]
        if len(keys) > self.limits.max_batch or not all(isinstance(k, str) for k in keys):
            raise InvalidRequest(f"keys must be 0 to {self.limits.max_batch} strings")
        return {"digests": self.plane.data_digests(keys)}

    # ------------------------------------------------------------------ daemons
    def register_daemon(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("worker")
        schema: dict[str, Any] = {
            "id": (str, type(None)),
            "name": str,
            "queues": list,
            "concurrency": int,
            "python": str,
            "pickle_protocols": list,
            "host": str,
        }
        body = fields(body, schema, required=("name",))
        queues, protocols = body.get("queues", []), body.get("pickle_protocols", [])
        if not all(isinstance(q, str) for q in queues):
            raise InvalidRequest("queues must be names")
        if not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 100 for p in protocols
        ):
            raise InvalidRequest("pickle_protocols must be small whole numbers")
        for name in queues:
            ident.check_queue(name)
        if body.get("id") and not ident.unscoped:
            # Registering a daemon the plane knows keeps its queues (an operator's say):
            # a worker token may take it over only if they are all in its scopes.
            old = self.plane.store.get_daemon(body["id"])
            for name in old.queues if old is not None else ():
                ident.check_queue(name)
        rec = self.plane.register_daemon(
            body["name"],
            daemon_id=body.get("id"),
            queues=[str(q) for q in body.get("queues", [])],
            concurrency=body.get("concurrency", 1),
            python=body.get("python", ""),
            pickle_protocols=body.get("pickle_protocols", []),
            host=body.get("host", ""),
        )
        return {"daemon": asdict(rec)}

    def daemon_heartbeat(
        self, ident: Identity, daemon_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        ident.require("worker")
        body = fields(body, {"running": int, "stopped": bool})
        rec = self.plane.daemon_heartbeat(
            daemon_id, body.get("running"), stopped=body.get("stopped", False)
        )
        self.metrics.heartbeat(rec.name, "daemon")
        self.metrics.busy(rec.name, rec.running)
        return {"daemon": asdict(rec)}

    def list_daemons(self, ident: Identity) -> dict[str, Any]:
        return {"daemons": [asdict(d) for d in self.plane.list_daemons()]}

    def update_daemon(
        self, ident: Identity, daemon_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        ident.require()
        body = fields(body, {"add_queues": list, "remove_queues": list, "concurrency": int})
        rec = self.plane.update_daemon(daemon_id, **body)
        return {"daemon": asdict(rec)}

    def remove_daemon(self, ident: Identity, daemon_id: str) -> dict[str, Any]:
        ident.require("worker")
        rec = self.plane.store.get_daemon(daemon_id)
        if rec is None:
            return {"removed": False}
        for queue in rec.queues:  # (a worker removes only a daemon of its own queues)
            ident.check_queue(queue)
        return {"removed": self.plane.remove_daemon(daemon_id)}

    def drain_daemon(self, ident: Identity, daemon_id: str) -> dict[str, Any]:
        ident.require()
        return {"daemon": asdict(self.plane.drain_daemon(daemon_id))}

    # ------------------------------------------------------------------ tokens
    def create_token(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require()
        body = fields(body, {"role": str, "queues": list, "name": str}, required=("role",))
        secret, rec = create_token(
            self.plane, body["role"], body.get("queues", ["*"]), body.get("name", "")
        )
        view = asdict(rec)
        del view["secret_hash"]
        return {"token": secret, **view}

    def list_tokens(self, ident: Identity) -> dict[str, Any]:
        ident.require()
        views = []
        for rec in self.plane.store.list_tokens():
            view = asdict(rec)
            del view["secret_hash"]
            views.append(view)
        return {"tokens": views}

    def revoke_token(self, ident: Identity, token_id: str) -> dict[str, Any]:
        ident.require()
        if not auth.revoke(self.plane, token_id):
            raise NotFound(f"no token {token_id!r}")
        return {"revoked": True}
