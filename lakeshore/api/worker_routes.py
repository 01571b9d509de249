"""The worker routes of HTTP API v1: claims (with wake objects on the AWS plane),
heartbeats, completions, failures, releases, output and progress.

Mixed into :class:`.service.Service`: like every route, each method takes the caller's
:class:`~.auth.Identity` and the decoded request map, checks role, scope and fields,
calls the plane, and returns the answer map.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .. import logs
from ..dashboard import PauseFlags
from ..errors import InvalidRequest, LakeshoreError
from ..metrics import Registry
from ..plane import Plane
from ..plane.model import Claim, Invocation, State
from ..plane.store import WakeObjects
from ..wire import check_result, result_blob
from .auth import Identity
from .codec import NUM, OPT_NUM, as_bytes, error_view, fields

if TYPE_CHECKING:
    from .service import Limits

__all__ = ["WorkerRoutes"]

_log = logging.getLogger("dreamlake.lakeshore.api")

#: how often a claim on paused queues only looks again whether one was resumed
_PAUSE_RECHECK = 1.0
#: seconds a claim's wake URLs stay valid (past the fallback, so a worker that follows
#: the answer never holds an expired one; a 403 still just means "claim")
_WAKE_URL_TTL = 3600


def _claim_view(c: Claim) -> dict[str, Any]:
    """A claim as the API answers it (dataclasses.asdict, without its deep copies)."""
    return {
        "id": c.id,
        "queue": c.queue,
        "payload": c.payload,
        "lease_token": c.lease_token,
        "lease_expires_at": c.lease_expires_at,
        "attempt": c.attempt,
        "timeout": c.timeout,
    }


def _unreadable(result: bytes) -> InvalidRequest | None:
    """Why a completion's result is not a result envelope a reader can decode, if so."""
    try:
        check_result(result)
    except InvalidRequest as exc:
        return InvalidRequest(f"the result is not a result envelope: {exc}")
    return None


def _refused(inv_id: str, exc: Exception) -> dict[str, str]:
    """One item's refusal as a batch answer carries it, logged."""
    view = error_view(exc)
    logs.event(_log, "answer.refused", inv_id, code=view["code"], reason=str(exc))
    return view


class WorkerRoutes:
    """The routes a worker token calls."""

    plane: Plane
    limits: Limits
    metrics: Registry
    pauses: PauseFlags
    #: the store's wake objects (the AWS plane), or None
    wakes: WakeObjects | None

    def claim(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("worker")
        schema: dict[str, Any] = {
            "queues": list,
            "worker": str,
            "limit": int,
            "wait": NUM,
            "lease_seconds": OPT_NUM,
        }
        body = fields(body, schema, required=("queues", "worker"))
        queues = body["queues"]
        if not queues or not all(isinstance(q, str) for q in queues):
            raise InvalidRequest("queues must be a non-empty list of names")
        for name in queues:
            ident.check_queue(name)
        limit = body.get("limit", 1)
        if not 1 <= limit <= self.limits.max_batch:
            raise InvalidRequest(f"limit must be 1 to {self.limits.max_batch}")
        lease = body.get("lease_seconds")
        if lease is not None and not 1 <= lease <= 3600:
            raise InvalidRequest("lease_seconds must be 1 to 3600")
        wakes = self.wakes
        wait = min(max(0.0, float(body.get("wait", 0.0))), self.limits.max_wait)
        if wakes is not None:
            wait = 0.0  # nothing waits inside the function: an empty answer says what to watch
        deadline = time.monotonic() + wait
        changes = self.plane.changes
        seen: int | None = None
        while True:
            generation = changes.generation
            paused = self.pauses.paused(queues)
            if wakes is not None and len(paused) == len(set(queues)):
                # (an idle answer makes its worker watch until a resume wakes it: a claim
                # made on that wake must not be answered from a pause cached here)
                paused = self.pauses.paused(queues, fresh=True)
            open_queues = [q for q in queues if q not in paused]
            if open_queues:
                break
            if seen is not None and generation != seen:
                changes.pass_on()  # woken for work it cannot take: wake another
            seen = generation
            left = deadline - time.monotonic()
            # every queue named is paused: nothing to hand out (a server parking the
            # request asks again after the recheck)
            recheck = min(left, _PAUSE_RECHECK)
            if (
                left <= 0
                or changes.closed
                or not changes.wait(generation, recheck, until=deadline, queues=queues)
            ):
                if wakes is not None:
                    return self._idle_answer(wakes, queues, [], body["worker"], limit, lease)
                return {"claims": []}
        left = max(0.0, deadline - time.monotonic())
        if len(open_queues) < len(queues):
            # Some named queues are paused: answer (empty) by the next recheck, so one
            # resumed meanwhile — by another server process too, which wakes no one
            # here — is looked at again by the worker's next claim.
            left = min(left, _PAUSE_RECHECK)
        claims = self.plane.claim(
            open_queues, body["worker"], limit=limit, wait=left, lease_seconds=lease
        )
        if not claims and wakes is not None:
            return self._idle_answer(wakes, queues, open_queues, body["worker"], limit, lease)
        if not claims and changes.parks:
            # (parked: claims a submit hands it are answered as a look's would be)
            worker = body["worker"]
            changes.then(lambda inner: lambda got: self._claimed(inner(got), worker))
        return self._claimed(claims, body["worker"])

    def _claimed(self, claims: list[Any], worker: str) -> dict[str, Any]:
        if claims:
            # A queue paused while this claim waited hands its claims straight back.
            # (Leased already: an error here answers them rather than leaving them leased
            # to a failed request until their leases run out.)
            try:
                paused_now = self.pauses.paused({c.queue for c in claims})
            except Exception:
                _log.warning("reading the queues' pauses failed; answering", exc_info=True)
                paused_now = set()
            for c in [c for c in claims if c.queue in paused_now]:
                try:
                    self.plane.release(c.id, c.lease_token)
                except Exception:  # (held until its lease runs out, then pending, paused)
                    _log.warning("handing back %s failed", c.id, exc_info=True)
            claims = [c for c in claims if c.queue not in paused_now]
        for c in claims:
            self.metrics.claimed(c.queue)
            logs.event(
                _log,
                "invocation.claimed",
                c.id,
                queue=c.queue,
                worker=worker,
                attempt=c.attempt,
            )
        return {"claims": [_claim_view(c) for c in claims]}

    def _idle_answer(
        self,
        wakes: WakeObjects,
        queues: list[str],
        open_queues: list[str],
        worker: str,
        limit: int,
        lease: float | None,
    ) -> dict[str, Any]:
        """An empty claim on a plane with wake objects: mark the queues idle, look for
        work once more (a submit that read the queue before the mark was set wakes no
        one, but its work is pending by now), else tell the worker what to watch.

        ``wake``: ``urls`` and ``etags`` per queue (GET with ``If-None-Match``; any
        other answer than 304 means claim), ``interval`` between GETs, ``fallback``
        seconds after which to claim anyway, and ``due_in`` when a scheduled invocation
        of these queues comes due sooner (claim then).
        """
        now = self.plane.now()
        marked = {q: wakes.mark_idle(q, now) for q in dict.fromkeys(queues)}
        etags = {q: etag for q, (etag, _) in marked.items()}
        if open_queues:
            claims = self.plane.claim(open_queues, worker, limit=limit, lease_seconds=lease)
            if claims:
                return self._claimed(claims, worker)
        wake: dict[str, Any] = {
            "urls": {q: wakes.wake_url(q, _WAKE_URL_TTL) for q in etags},
            "etags": etags,
            "interval": self.limits.wake_interval,
            "fallback": self.limits.wake_fallback,
        }
        if not all(exists for _, exists in marked.values()):
            # a queue that does not exist has no mark: making it rewrites its object
            # (the plane's ensure_queue), but a wake is best effort, so claim again sooner
            wake["fallback"] = min(self.limits.wake_fallback, 4 * self.limits.wake_interval)
        due = [t for q in open_queues if (t := self.plane.store.next_available_at(q)) is not None]
        if due:
            wake["due_in"] = max(0.0, min(due) - now)
        return {"claims": [], "wake": wake}

    def _batch(
        self, body: dict[str, Any], key: str, schema: dict[str, Any], required: tuple[str, ...]
    ) -> list[dict[str, Any]]:
        items = body.get(key)
        if not isinstance(items, list) or not 1 <= len(items) <= self.limits.max_batch:
            raise InvalidRequest(f"{key} must hold 1 to {self.limits.max_batch} items")
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidRequest(f"{key}[{i}] must be a map")
            out.append(fields(item, schema, required=required, where=f"{key}[{i}]"))
        return out

    def _leased_in_scope(self, ident: Identity, ids: list[str]) -> dict[str, Invocation]:
        """The records of ``ids``, by id. A worker answers only for invocations of queues
        in its scopes (a lease token alone is not enough: it could have leaked)."""
        recs = {rec.id: rec for rec in self.plane.get_many(ids)}
        if ident.role != "admin":
            for rec in recs.values():
                ident.check_queue(rec.queue)
        return recs

    def _finished(self, rec: Invocation | None, outcome: str, **fields: Any) -> None:
        """Count and log the end of an attempt of ``rec`` (as it was while running)."""
        if rec is None:
            return
        now = self.plane.now()
        started = rec.started_at
        queue_time = None if started is None else started - rec.available_at
        run_time = None if started is None else now - started
        self.metrics.finished(rec.queue, outcome, queue_time, run_time)
        logs.event(
            _log,
            f"invocation.{outcome}",
            rec.id,
            queue=rec.queue,
            worker=rec.worker,
            attempt=rec.attempt,
            run_time=run_time,
            **fields,
        )

    def heartbeat(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("worker")
        body = fields(body, {"leases": list, "lease_seconds": OPT_NUM}, required=("leases",))
        leases = self._batch(body, "leases", {"id": str, "lease_token": str}, ("id", "lease_token"))
        recs = self._leased_in_scope(ident, [x["id"] for x in leases])
        for rec in recs.values():
            self.metrics.heartbeat(rec.worker or "unknown", "lease")
        answers = [
            asdict(
                self.plane.heartbeat(
                    x["id"], x["lease_token"], lease_seconds=body.get("lease_seconds")
                )
            )
            for x in leases
        ]
        return {"answers": answers}

    def complete(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("worker")
        fields(body, {"results": list}, required=("results",))
        items = self._batch(
            body,
            "results",
            {"id": str, "lease_token": str, "result": (bytes, str)},
            ("id", "lease_token", "result"),
        )
        if not ident.unscoped:  # (an unscoped token's completions need no read first)
            self._leased_in_scope(ident, [x["id"] for x in items])
        results = [as_bytes(x["result"], "result") for x in items]
        if any(len(result) > self.limits.inline_payload for result in results):
            raise InvalidRequest("result is over the inline limit: send it as a blob")
        # A result no reader could decode is refused on its own (nothing is written for
        # it); the others of the batch are recorded.
        outcomes: list[Invocation | Exception | None] = [_unreadable(r) for r in results]
        self._refuse_missing_blobs(results, outcomes)
        readable = [i for i, refused in enumerate(outcomes) if refused is None]
        recorded = self.plane.complete_records(
            [(items[i]["id"], items[i]["lease_token"], results[i]) for i in readable]
        )
        for i, outcome in zip(readable, recorded, strict=True):
            outcomes[i] = outcome
        answers = []
        for x, answer in zip(items, outcomes, strict=True):
            assert answer is not None
            if isinstance(answer, Exception):  # LeaseLost and the like answer per item
                answers.append({"id": x["id"], "ok": False, "error": _refused(x["id"], answer)})
            else:  # (started_at, worker, attempt: as they were while it ran)
                answers.append({"id": x["id"], "ok": True, "error": None})
                self._finished(answer, "succeeded")
        return {"answers": answers}

    def _refuse_missing_blobs(
        self, results: list[bytes], outcomes: list[Invocation | Exception | None]
    ) -> None:
        """A readable result that stands for a blob the plane does not hold is refused on
        its own, as an unreadable one is (its reader could not fetch it): a worker
        uploads a result's blob before the completion that names it."""
        refs = {
            i: ref
            for i, result in enumerate(results)
            if outcomes[i] is None and (ref := result_blob(result)) is not None
        }
        if not refs:
            return
        missing = self.plane.missing_blobs(refs.values())
        for i, ref in refs.items():
            if ref in missing:
                outcomes[i] = InvalidRequest(
                    f"the result envelope names blob {ref[:12]}…, which is not on the plane:"
                    " upload it before the completion"
                )

    def fail(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("worker")
        fields(body, {"failures": list}, required=("failures",))
        schema = {"id": str, "lease_token": str, "error": dict, "retryable": bool}
        items = self._batch(body, "failures", schema, ("id", "lease_token", "error"))
        recs = self._leased_in_scope(ident, [x["id"] for x in items])
        errors = [
            fields(
                x["error"],
                {"type": str, "message": str, "traceback": str, "pickled": (bytes, type(None))},
                where="error",
            )
            for x in items
        ]
        states = self.plane.fail_states(
            [
                (x["id"], x["lease_token"], error, x.get("retryable", True))
                for x, error in zip(items, errors, strict=True)
            ]
        )
        answers = []
        for x, error, state in zip(items, errors, states, strict=True):
            if isinstance(state, Exception):
                refused = _refused(x["id"], state)
                answers.append({"id": x["id"], "ok": False, "state": None, "error": refused})
                continue
            answers.append({"id": x["id"], "ok": True, "state": state.value, "error": None})
            outcome = "failed" if state is State.FAILED else "retried"
            self._finished(recs.get(x["id"]), outcome, error_type=error.get("type"))
        return {"answers": answers}

    def release(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("worker")
        fields(body, {"leases": list}, required=("leases",))
        items = self._batch(body, "leases", {"id": str, "lease_token": str}, ("id", "lease_token"))
        self._leased_in_scope(ident, [x["id"] for x in items])
        answers = []
        for x in items:
            try:
                self.plane.release(x["id"], x["lease_token"])
                answers.append({"id": x["id"], "ok": True, "error": None})
            except LakeshoreError as exc:
                answers.append({"id": x["id"], "ok": False, "error": error_view(exc)})
        return {"answers": answers}

    def append_logs(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("worker")
        body = fields(
            body,
            {"id": str, "lease_token": str, "chunks": list},
            required=("id", "lease_token", "chunks"),
        )
        chunks = body["chunks"]
        if not 1 <= len(chunks) <= self.limits.max_batch:
            raise InvalidRequest(f"chunks must hold 1 to {self.limits.max_batch} items")
        parsed = []
        for i, c in enumerate(chunks):
            ok = (
                isinstance(c, list)
                and len(c) == 3
                and isinstance(c[0], int)
                and isinstance(c[1], str)
                and isinstance(c[2], str)
            )
            if not ok:
                raise InvalidRequest(f"chunks[{i}] must be [n, stream, text]")
            parsed.append((c[0], c[1], c[2]))
        self._leased_in_scope(ident, [body["id"]])
        self.plane.append_logs(body["id"], body["lease_token"], parsed)
        return {"ok": True}

    def report_progress(self, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        ident.require("worker")
        schema: dict[str, Any] = {
            "id": str,
            "lease_token": str,
            "fraction": NUM,
            "message": (str, type(None)),
        }
        body = fields(body, schema, required=("id", "lease_token", "fraction"))
        self._leased_in_scope(ident, [body["id"]])
        self.plane.report_progress(
            body["id"], body["lease_token"], float(body["fraction"]), body.get("message")
        )
        return {"ok": True}
