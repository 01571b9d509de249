"""One exception tree for the SDK, the plane and the wire.

::

    LakeshoreError                      every error Lakeshore raises on purpose
    ├── ClientError                     the request itself is wrong (HTTP 4xx)
    │   ├── InvalidRequest              400 malformed or wrong-typed input
    │   ├── SerializationError          400 an argument or result cannot be pickled
    │   ├── Unauthorized                401 no token, a wrong one, a revoked one
    │   ├── Forbidden                   403 the token's role or scopes do not allow it
    │   ├── NotFound                    404 no such route, daemon, token or blob
    │   │   ├── QueueNotFound           404 strict mode, or a queue removed under us
    │   │   └── UnknownInvocation       404 the plane never had this id
    │   ├── MethodNotAllowed            405
    │   ├── Conflict                    409
    │   │   ├── IdempotencyConflict     409 same id or key, different body
    │   │   ├── QueueMismatch           409 the queue exists with other settings
    │   │   └── LeaseLost               409 stale lease token: the answer is refused
    │   ├── ExpiredInvocation           410 the id existed; its result passed retention
    │   ├── PayloadTooLarge             413
    │   ├── UnsupportedMediaType        415 a body neither msgpack nor JSON
    │   └── Throttled                   429 slow down (``retry_after`` seconds)
    ├── Unavailable                     503 the plane cannot answer now; safe to retry
    ├── RemoteError                     the function raised; its type could not be rebuilt
    │   └── JobFailed                   the worker recorded a failure of its own:
    │       ├── WorkerCrashed               the job's process died
    │       ├── CannotLoad                  another Python or pickle protocol
    │       ├── InvalidResult               a return value the plane cannot record
    │       └── DataKeyMissing              a data UDF's manifest names a missing key
    ├── InvocationDead                  its workers were lost more often than max_attempts
    ├── InvocationTimeout               it ran past its per-invocation timeout
    └── CancelledError                  the invocation was cancelled

``result()`` raises the remote exception as its own type when it unpickles (with the
remote traceback attached as ``remote_traceback`` and as a note), else ``RemoteError``.
A wait that runs out raises the builtin ``TimeoutError`` and leaves the invocation be.

Each class carries its wire ``code`` and HTTP ``status``; :data:`BY_CODE` is the one table
that maps a wire code back to a class. Nothing maps errors by message text.
"""

from __future__ import annotations

__all__ = [
    "BY_CODE",
    "CancelledError",
    "CannotLoad",
    "ClientError",
    "Conflict",
    "DataKeyMissing",
    "ExpiredInvocation",
    "Forbidden",
    "IdempotencyConflict",
    "InvocationDead",
    "InvocationTimeout",
    "InvalidRequest",
    "InvalidResult",
    "JobFailed",
    "LakeshoreError",
    "LeaseLost",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "QueueMismatch",
    "QueueNotFound",
    "RemoteError",
    "SerializationError",
    "Throttled",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "UnknownInvocation",
    "WorkerCrashed",
    "from_wire",
]


class LakeshoreError(Exception):
    """Base of every error Lakeshore raises on purpose."""

    #: stable identifier on the wire
    code = "error"
    #: HTTP status an adapter answers with
    status = 500


class ClientError(LakeshoreError):
    code = "client_error"
    status = 400


class InvalidRequest(ClientError):
    code = "invalid_request"
    status = 400


class SerializationError(ClientError):
    code = "serialization"
    status = 400


class Unauthorized(ClientError):
    code = "unauthorized"
    status = 401


class Forbidden(ClientError):
    code = "forbidden"
    status = 403


class NotFound(ClientError):
    code = "not_found"
    status = 404


class MethodNotAllowed(ClientError):
    code = "method_not_allowed"
    status = 405


class QueueNotFound(NotFound):
    code = "queue_not_found"
    status = 404


class UnknownInvocation(NotFound):
    code = "unknown_invocation"
    status = 404


class Conflict(ClientError):
    code = "conflict"
    status = 409


class IdempotencyConflict(Conflict):
    code = "idempotency_conflict"


class QueueMismatch(Conflict):
    code = "queue_mismatch"


class LeaseLost(Conflict):
    code = "lease_lost"


class ExpiredInvocation(ClientError):
    code = "expired"
    status = 410


class PayloadTooLarge(ClientError):
    code = "payload_too_large"
    status = 413


class UnsupportedMediaType(ClientError):
    code = "unsupported_media_type"
    status = 415


class Throttled(ClientError):
    code = "throttled"
    status = 429


class Unavailable(LakeshoreError):
    """The plane could not answer now (a dependency throttled or failed); retry."""

    code = "unavailable"
    status = 503


class RemoteError(LakeshoreError):
    """The remote function raised and its exception could not be rebuilt here.

    ``type_name`` is the remote exception's qualified type, ``remote_traceback`` the
    formatted remote traceback.
    """

    code = "remote_error"
    status = 200

    def __init__(self, message: str, *, type_name: str = "", remote_traceback: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        base = super().__str__()
        return f"{self.type_name}: {base}" if self.type_name else base


class JobFailed(RemoteError):
    """A failure the worker recorded for a job, not an exception of the function's own:
    a :class:`RemoteError` (so ``except RemoteError`` still takes it) of a type of its
    own, named ``dreamlake.lakeshore.<class>`` on the wire (``type_name``)."""

    code = "job_failed"

    def __init__(self, message: str, *, type_name: str = "", remote_traceback: str = "") -> None:
        own = f"dreamlake.lakeshore.{type(self).__name__}"
        super().__init__(message, type_name=type_name or own, remote_traceback=remote_traceback)


class WorkerCrashed(JobFailed):
    """The job's process died (a segfault, ``os._exit``, the memory limit) before it
    answered; its slot was started again."""

    code = "worker_crashed"


class CannotLoad(JobFailed):
    """The worker could not load the call: a pickle protocol or Python newer than its
    own, or a function body it cannot find. (A module the worker does not have raises
    its own ``ModuleNotFoundError`` at the producer.)"""

    code = "cannot_load"


class InvalidResult(JobFailed):
    """The function returned a value the plane could not record (not retried)."""

    code = "invalid_result"


class DataKeyMissing(JobFailed):
    """A function returned a bare ``str`` (a data UDF's manifest of keys) naming keys the
    data store does not have; a function that returns text should wrap it in a dict."""

    code = "data_key_missing"


class InvocationDead(LakeshoreError):
    """Every attempt lost its worker (crash, kill, lease expiry) up to ``max_attempts``."""

    code = "dead"
    status = 200


class InvocationTimeout(LakeshoreError):
    """The invocation ran longer than its ``timeout`` and was stopped."""

    code = "invocation_timeout"
    status = 200


class CancelledError(LakeshoreError):
    """The invocation was cancelled before it produced a result."""

    code = "cancelled"
    status = 200


def _subclasses(cls: type[LakeshoreError]) -> list[type[LakeshoreError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


#: wire code → exception class, the one mapping used by every adapter and client
BY_CODE: dict[str, type[LakeshoreError]] = {c.code: c for c in _subclasses(LakeshoreError)}


def from_wire(code: str, message: str) -> LakeshoreError:
    """Rebuild an error answered by a plane; unknown codes become ``LakeshoreError``."""
    cls = BY_CODE.get(code, LakeshoreError)
    if cls is RemoteError:
        return RemoteError(message)
    return cls(message)
