"""Bearer tokens: stored hashed, compared in constant time; roles and queue scopes.

A token reads ``lks_<id>_<secret>``. The id finds the record; the secret is never
stored — only its SHA-256 (tokens are 190 random bits, so a fast hash is the right
one) — and is compared with :func:`hmac.compare_digest`. A plane's first admin token is
made by :func:`bootstrap_admin` when the plane has no token at all; ``lakeshore serve``
prints it once.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import secrets
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import Forbidden, InvalidRequest, Unauthorized
from ..plane import Plane
from ..plane.model import TokenRecord

__all__ = [
    "ROLES",
    "Identity",
    "authenticate",
    "bootstrap_admin",
    "create_token",
    "forget",
    "revoke",
]

#: roles a token can have
ROLES = ("admin", "producer", "worker")
_PREFIX = "lks_"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Identity:
    """Who is calling: the token's id, role and queue scopes."""

    token_id: str
    role: str
    queues: tuple[str, ...]

    def require(self, *roles: str) -> None:
        """Raise :class:`Forbidden` unless the role is admin or one of ``roles``."""
        if self.role != "admin" and self.role not in roles:
            needs = " or ".join(("admin", *roles)) if roles else "admin"
            raise Forbidden(f"a {self.role} token cannot do this (needs {needs})")

    @property
    def unscoped(self) -> bool:
        """Whether every queue is in scope (an admin, or a ``*`` scope)."""
        return self.role == "admin" or "*" in self.queues

    def may_use(self, queue: str) -> bool:
        return self.role == "admin" or any(fnmatch.fnmatchcase(queue, g) for g in self.queues)

    def check_queue(self, queue: str) -> None:
        if not self.may_use(queue):
            raise Forbidden(f"this token's scopes do not include queue {queue!r}")


#: seconds a token record read from the store is used again (every request reads one)
TOKEN_CACHE_SECONDS = 1.0
#: most entries kept per plane in each cache below (past it, the plane's is emptied)
_CACHE_ENTRIES = 10_000
_cache_lock = threading.Lock()


class _Kept:
    """What one plane's process keeps of its tokens (held by the plane object, weakly:
    a plane gone takes its entries with it, and a new one at the same address starts
    empty): records by token id and callers by header, each with until when."""

    __slots__ = ("callers", "records")

    def __init__(self) -> None:
        self.records: dict[str, tuple[float, TokenRecord]] = {}
        #: the callers of headers checked lately, as long as their token's record is
        #: kept (a hit is a secret that matched that record: no hash again)
        self.callers: dict[str, tuple[float, Identity]] = {}


_kept: weakref.WeakKeyDictionary[Plane, _Kept] = weakref.WeakKeyDictionary()
#: how many times :func:`forget` ran: a record read, or a caller checked, across one is
#: not kept (the revocation it was told of may have landed after the read)
_forgets = [0]


def _of(plane: Plane) -> _Kept:
    kept = _kept.get(plane)
    if kept is None:
        with _cache_lock:
            kept = _kept.setdefault(plane, _Kept())
    return kept


def _keep(
    entries: dict[str, tuple[float, _T]], key: str, entry: tuple[float, _T], forgets: int
) -> None:
    """Keep ``entry`` unless :func:`forget` ran since ``forgets`` was read."""
    with _cache_lock:
        if _forgets[0] != forgets:
            return
        if len(entries) > _CACHE_ENTRIES:
            entries.clear()
        entries[key] = entry


def _token_record(plane: Plane, token_id: str) -> tuple[TokenRecord | None, float]:
    """The token's record, read at most once a second per plane and token: a token
    revoked elsewhere (another server process, another Lambda) is refused within
    :data:`TOKEN_CACHE_SECONDS`; one revoked through this process at once (:func:`forget`).
    With it, until when the record read is used again (now: not kept)."""
    records = _of(plane).records
    now = time.monotonic()
    hit = records.get(token_id)
    if hit is not None and hit[0] > now:
        return hit[1], hit[0]
    forgets = _forgets[0]
    record = plane.store.get_token(token_id)
    if record is None:
        return None, now
    _keep(records, token_id, (now + TOKEN_CACHE_SECONDS, record), forgets)
    return record, now + TOKEN_CACHE_SECONDS


def revoke(plane: Plane, token_id: str) -> bool:
    """Revoke a token (once; revoking again changes nothing). False: no such token.

    Refused at once by this process; by others within :data:`TOKEN_CACHE_SECONDS`."""
    rec = plane.store.get_token(token_id)
    if rec is None:
        return False
    if rec.revoked_at is None:
        rec.revoked_at = plane.now()
        plane.store.put_token(rec)
    forget(plane, token_id)
    return True


def forget(plane: Plane, token_id: str) -> None:
    """Drop a cached token record (its token was just revoked or changed)."""
    kept = _of(plane)
    with _cache_lock:
        _forgets[0] += 1
        kept.records.pop(token_id, None)
        kept.callers.clear()


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(
    plane: Plane, role: str, queues: Iterable[str] = ("*",), name: str = ""
) -> tuple[str, TokenRecord]:
    """Make a token; return its secret form (shown once) and its stored record."""
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}")
    scopes = list(queues)
    if not scopes or not all(isinstance(g, str) and g for g in scopes):
        raise InvalidRequest("queues must be a non-empty list of glob patterns")
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(24)
    record = TokenRecord(
        id=token_id,
        secret_hash=_hash(secret),
        role=role,
        queues=scopes,
        name=str(name),
        created_at=plane.now(),
    )
    plane.store.put_token(record)
    return f"{_PREFIX}{token_id}_{secret}", record


def bootstrap_admin(plane: Plane) -> str | None:
    """The first admin token of a fresh plane (None when the plane has tokens)."""
    if plane.store.list_tokens():
        return None
    secret, _ = create_token(plane, "admin", name="bootstrap")
    return secret


def authenticate(plane: Plane, authorization: str | None) -> Identity:
    """The caller of an ``Authorization: Bearer ...`` header, or :class:`Unauthorized`."""
    callers = _of(plane).callers
    forgets = _forgets[0]
    hit = callers.get(authorization or "")
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    if not authorization:
        raise Unauthorized("missing bearer token (Authorization: Bearer lks_...)")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.startswith(_PREFIX):
        raise Unauthorized("malformed bearer token")
    token_id, _, secret = token[len(_PREFIX) :].partition("_")
    record, until = _token_record(plane, token_id) if token_id and secret else (None, 0.0)
    # Compare even when the id is unknown, so timing does not tell ids apart.
    expected = record.secret_hash if record is not None else _hash("")
    if not hmac.compare_digest(expected, _hash(secret)) or record is None:
        raise Unauthorized("unknown or wrong token")
    if record.revoked_at is not None:
        raise Unauthorized("this token was revoked")
    ident = Identity(token_id=record.id, role=record.role, queues=tuple(record.queues))
    _keep(callers, authorization, (until, ident), forgets)
    return ident
