"""The HTTP API v1 over the plane core, free of any server or Lambda code.

``handlers/api.py`` routes API Gateway events to :class:`Service`; ``lakeshore serve``
and ``lakeshore dev`` run the same handlers behind a small HTTP adapter.
"""

from __future__ import annotations

from .auth import ROLES, Identity, authenticate, bootstrap_admin, create_token
from .service import Limits, Service, invocation_view

__all__ = [
    "ROLES",
    "Identity",
    "Limits",
    "Service",
    "authenticate",
    "bootstrap_admin",
    "create_token",
    "invocation_view",
]
