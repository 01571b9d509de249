"""Conversions between the API's wire views (docs/api.md) and the plane's model objects.

Contract: these functions are pure. A view from the plane becomes the same model object
the embedded plane returns, so the SDK cannot tell the two transports apart:
``scheduled`` is read as pending with its ``available_at`` (as stores keep it), a view
the plane calls expired stays expired whatever this machine's clock says, and fields
this client does not know are ignored. A malformed view raises ``KeyError``,
``TypeError`` or ``ValueError``; a refused batch item raises the error it carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ..errors import LakeshoreError, from_wire
from ..plane.model import (
    Claim,
    DaemonRecord,
    Invocation,
    LogEntry,
    QueueSpec,
    State,
    Submission,
)

__all__ = [
    "claim_of",
    "daemon_of",
    "invocation_of",
    "invocations_in",
    "item_ok",
    "log_entry_of",
    "only_answer",
    "queue_counts",
    "queue_spec",
    "submission_body",
]

_QUEUE_FIELDS = frozenset(f.name for f in fields(QueueSpec))


def submission_body(sub: Submission) -> dict[str, Any]:
    """One item of ``POST /v1/invocations`` (optional fields only when set)."""
    out: dict[str, Any] = {
        "id": sub.id,
        "queue": sub.queue,
        "payload": sub.payload,
        "priority": sub.priority,
        "delay": sub.delay,
    }
    if sub.timeout is not None:
        out["timeout"] = sub.timeout
    if sub.max_attempts is not None:
        out["max_attempts"] = sub.max_attempts
    if sub.retry is not None:
        out["retry"] = sub.retry.to_dict()
    return out


def queue_spec(raw: Mapping[str, Any]) -> QueueSpec:
    return QueueSpec(**{k: v for k, v in raw.items() if k in _QUEUE_FIELDS})


def queue_counts(raw: Any) -> dict[str, int]:
    """A count for every public state (zero for those missing, all zero for no map)."""
    got = raw if isinstance(raw, dict) else {}
    return {s.value: int(got.get(s.value) or 0) for s in State}


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def invocation_of(view: Mapping[str, Any], now: float) -> Invocation:
    """A view as the plane's record. ``scheduled`` is kept as pending with its
    ``available_at``, as stores keep it (``public_state`` says scheduled again)."""
    state = State(view["state"])
    if state is State.SCHEDULED:
        state = State.PENDING
    expires_at = _opt_float(view.get("expires_at"))
    if view.get("expired") and (expires_at is None or expires_at > now):
        expires_at = now  # the plane said expired: do not let clock skew say otherwise
    result = view.get("result")
    return Invocation(
        id=str(view["id"]),
        queue=str(view.get("queue") or ""),
        state=state,
        payload=None,
        request_digest="",
        order_key="",
        priority=float(view.get("priority") or 0.0),
        available_at=float(view.get("available_at") or 0.0),
        created_at=float(view.get("created_at") or 0.0),
        max_attempts=int(view.get("max_attempts") or 1),
        timeout=_opt_float(view.get("timeout")),
        attempt=int(view.get("attempt") or 0),
        worker=view.get("worker"),
        started_at=_opt_float(view.get("started_at")),
        finished_at=_opt_float(view.get("finished_at")),
        expires_at=expires_at,
        result=bytes(result) if result is not None else None,
        error=view.get("error"),
        progress=_opt_float(view.get("progress")),
        progress_message=view.get("progress_message"),
    )


def invocations_in(answer: Mapping[str, Any], now: float) -> list[Invocation]:
    """The records of an answer's ``invocations`` list (none when it is missing)."""
    return [invocation_of(v, now) for v in answer.get("invocations") or ()]


def claim_of(raw: Mapping[str, Any]) -> Claim:
    return Claim(
        id=str(raw["id"]),
        queue=str(raw["queue"]),
        payload=bytes(raw["payload"]),
        lease_token=str(raw["lease_token"]),
        lease_expires_at=float(raw["lease_expires_at"]),
        attempt=int(raw["attempt"]),
        timeout=_opt_float(raw.get("timeout")),
    )


def log_entry_of(raw: Mapping[str, Any]) -> LogEntry:
    return LogEntry(
        seq=int(raw["seq"]),
        stream=str(raw["stream"]),
        text=str(raw["text"]),
        at=float(raw["at"]),
        attempt=int(raw["attempt"]),
    )


def daemon_of(raw: Mapping[str, Any]) -> DaemonRecord:
    return DaemonRecord.from_doc(dict(raw))


def only_answer(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The one item of the ``answers`` of a one-item batch call."""
    answers = answer.get("answers")
    if not isinstance(answers, list) or len(answers) != 1 or not isinstance(answers[0], dict):
        raise LakeshoreError("the plane answered a one-item batch without exactly one answer")
    item: dict[str, Any] = answers[0]
    return item


def item_ok(item: dict[str, Any]) -> dict[str, Any]:
    """The answer of one batch item, or the exception its ``error`` stands for."""
    if item.get("ok"):
        return item
    err = item.get("error") or {}
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    raise from_wire(str(code or "error"), str(message or "refused by the plane"))
