"""The sweeper's Lambda entry point: :meth:`Plane.sweep` on a schedule.

``template.yaml`` runs it once a minute. A sweep hands expired leases on (back to
pending, or dead after ``max_attempts``), purges results past retention and removes
drained queues that asked for it. Every step is a compare-and-set, so a run that
overlaps another, or a claim's own opportunistic sweep, changes nothing twice.
"""

from __future__ import annotations

from typing import Any

from ..plane import Plane
from . import aws

__all__ = ["handler"]

_plane: Plane | None = None
_metrics: Any = None
_logger: Any = None


def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    """Sweep the plane the environment names; answer how many leases it handed on."""
    global _plane, _metrics, _logger
    if _plane is None:
        from aws_lambda_powertools import Logger, Metrics

        _metrics = Metrics(namespace="Lakeshore", service="sweeper")
        _logger = Logger(service="lakeshore-sweeper")
        _plane = aws.plane_from_env()
    expired = _plane.sweep()
    _metrics.add_metric(name="ExpiredLeases", unit="Count", value=expired)
    _metrics.flush_metrics()
    _logger.info("swept", extra={"expired_leases": expired})
    return {"expired_leases": expired}
