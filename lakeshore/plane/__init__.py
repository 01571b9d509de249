"""The plane core: lifecycle rules over a store of atomic primitives.

Imports nothing of boto3, HTTP or the CLI: the embedded plane, ``lakeshore serve`` and
the Lambda handlers all drive this same code.
"""

from __future__ import annotations

from .core import Plane
from .model import (
    FINISHED,
    Claim,
    HeartbeatAnswer,
    Invocation,
    QueueSpec,
    RetryPolicy,
    State,
    Submission,
)
from .store import Store

__all__ = [
    "FINISHED",
    "Claim",
    "HeartbeatAnswer",
    "Invocation",
    "Plane",
    "QueueSpec",
    "RetryPolicy",
    "State",
    "Store",
    "Submission",
]
