"""The plane's records: queue specs, invocations, claims. Plain data, no behaviour."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "FINISHED",
    "Claim",
    "DaemonRecord",
    "LogEntry",
    "HeartbeatAnswer",
    "Invocation",
    "QueueSpec",
    "RetryPolicy",
    "State",
    "Submission",
    "TokenRecord",
]


class State(enum.StrEnum):
    #: accepted, waiting for its delay or retry backoff to pass
    SCHEDULED = "scheduled"
    #: claimable now
    PENDING = "pending"
    #: leased to a worker
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    #: the function raised (after any retries), or timed out
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: its worker was lost more often than ``max_attempts`` allows
    DEAD = "dead"


#: states an invocation never leaves
FINISHED = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.DEAD})


@dataclass(frozen=True)
class RetryPolicy:
    """Opt-in retries for a function that raises.

    A raise is retried while the invocation has had at most ``max`` retries, after
    ``backoff * 2**n`` seconds (capped by ``max_backoff``) for the n-th retry.
    """

    max: int = 3
    backoff: float = 1.0
    max_backoff: float = 300.0

    def delay(self, retry_number: int) -> float:
        return float(min(self.max_backoff, self.backoff * (2**retry_number)))

    def to_dict(self) -> dict[str, Any]:
        return {"max": self.max, "backoff": self.backoff, "max_backoff": self.max_backoff}


@dataclass(frozen=True)
class QueueSpec:
    """A queue's settings as the plane enforces them."""

    name: str
    kind: str = "fifo"
    priority_field: str = "priority"
    temperature: float | None = None
    anneal: dict[str, Any] | None = None
    elasticity: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    #: remove the queue (not its invocations) once nothing is pending or running:
    #: set when the run that scoped it has ended
    delete_when_drained: bool = False

    def settings(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}


@dataclass(frozen=True)
class Submission:
    """What a producer hands the plane for one invocation."""

    id: str
    queue: str
    payload: bytes
    priority: float = 0.0
    delay: float = 0.0
    timeout: float | None = None
    max_attempts: int | None = None
    retry: RetryPolicy | None = None


@dataclass
class Invocation:
    """The plane's record of one invocation. Stores persist every field."""

    id: str
    queue: str
    state: State
    payload: bytes | None
    request_digest: str
    order_key: str
    priority: float
    available_at: float
    created_at: float
    max_attempts: int
    timeout: float | None = None
    retry: RetryPolicy | None = None
    attempt: int = 0
    lease_token: str | None = None
    lease_expires_at: float | None = None
    worker: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = None
    result: bytes | None = None
    error: dict[str, Any] | None = None
    #: last progress the job reported: a fraction in [0, 1] and a message
    progress: float | None = None
    progress_message: str | None = None

    def public_state(self, now: float) -> State:
        """``scheduled`` is a pending invocation whose time has not come yet."""
        if self.state is State.PENDING and self.available_at > now:
            return State.SCHEDULED
        return self.state

    def is_expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True)
class Claim:
    """A leased invocation handed to a worker."""

    id: str
    queue: str
    payload: bytes
    lease_token: str
    lease_expires_at: float
    attempt: int
    timeout: float | None


@dataclass(frozen=True)
class HeartbeatAnswer:
    id: str
    #: the lease still holds; False means stop: the answer will be refused
    ok: bool
    #: the producer cancelled it (or its timeout passed): stop the job now
    cancel: bool
    lease_expires_at: float | None


@dataclass
class TokenRecord:
    """An API token as stored: never the secret, only its hash."""

    id: str
    secret_hash: str
    role: str
    queues: list[str]
    name: str
    created_at: float
    revoked_at: float | None = None


@dataclass
class DaemonRecord:
    """A long-running worker process as registered with the plane."""

    id: str
    name: str
    host: str
    queues: list[str]
    concurrency: int
    python: str
    pickle_protocols: list[int]
    registered_at: float
    last_heartbeat: float
    running: int = 0
    draining: bool = False
    #: when it last stopped of its own accord (its last heartbeat said so); None while
    #: it runs, and for one that was killed or lost its host (then it falls silent)
    stopped_at: float | None = None

    def doc(self) -> dict[str, Any]:
        """The record as a store keeps it: its fields, but those added since the first
        version left out while unset, so code of that version reads it too (a
        downgrade, or old and new functions side by side while a stack deploys)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        if doc["stopped_at"] is None:
            del doc["stopped_at"]
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> DaemonRecord:
        """A record from a stored or sent doc; fields this version does not know (a
        newer one's) are left out."""
        return cls(**{k: v for k, v in doc.items() if k in _DAEMON_FIELDS})


_DAEMON_FIELDS = frozenset(f.name for f in fields(DaemonRecord))


@dataclass(frozen=True)
class LogEntry:
    """One chunk of a job's output, numbered per invocation from 1."""

    seq: int
    stream: str
    text: str
    at: float
    attempt: int
