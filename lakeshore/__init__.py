"""Lakeshore: a broker-mediated task queue for Python functions and shell commands.

::

    import dreamlake.lakeshore as dls

    @dls.udf(queue="fan-out-demo")
    def square(x: int) -> int:
        return x * x

    dp = dls.Dispatch(":memory:")
    inv = square.submit(3, _dispatch=dp)          # a durable invocation id
    dls.run_worker(dls.SyncQueue("fan-out-demo", dispatch=dp), once=True)
    dls.SyncQueue("fan-out-demo", dispatch=dp).result(inv)   # 9
"""

from __future__ import annotations

from . import context, data
from .batching import Batch, batch
from .config import configure
from .dispatch import Dispatch, QueueCreatedWarning
from .errors import (
    CancelledError,
    CannotLoad,
    ClientError,
    Conflict,
    DataKeyMissing,
    ExpiredInvocation,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    InvalidResult,
    InvocationDead,
    InvocationTimeout,
    JobFailed,
    LakeshoreError,
    LeaseLost,
    NotFound,
    PayloadTooLarge,
    QueueMismatch,
    QueueNotFound,
    RemoteError,
    SerializationError,
    Unauthorized,
    Unavailable,
    UnknownInvocation,
    WorkerCrashed,
)
from .plane.model import RetryPolicy as Retry
from .plane.model import State
from .progress import progress
from .queue import (
    BoltzmannQueue,
    FILOQueue,
    Pool,
    PriorityQueue,
    Queue,
    SyncBoltzmannQueue,
    SyncFILOQueue,
    SyncPriorityQueue,
    SyncQueue,
)
from .udf import UDF, udf
from .worker import run_worker

__version__ = "0.4.0"

__all__ = [
    "UDF",
    "Batch",
    "BoltzmannQueue",
    "FILOQueue",
    "Pool",
    "PriorityQueue",
    "QueueCreatedWarning",
    "SyncBoltzmannQueue",
    "SyncFILOQueue",
    "SyncPriorityQueue",
    "context",
    "data",
    "CancelledError",
    "CannotLoad",
    "ClientError",
    "Conflict",
    "DataKeyMissing",
    "Dispatch",
    "ExpiredInvocation",
    "Forbidden",
    "IdempotencyConflict",
    "InvalidRequest",
    "InvalidResult",
    "InvocationDead",
    "InvocationTimeout",
    "JobFailed",
    "LakeshoreError",
    "LeaseLost",
    "NotFound",
    "PayloadTooLarge",
    "Queue",
    "QueueMismatch",
    "QueueNotFound",
    "RemoteError",
    "Retry",
    "SerializationError",
    "State",
    "SyncQueue",
    "Unauthorized",
    "Unavailable",
    "UnknownInvocation",
    "WorkerCrashed",
    "__version__",
    "batch",
    "configure",
    "progress",
    "run_worker",
    "udf",
]
