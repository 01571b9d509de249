"""The sweeper's Lambda entry point: :meth:`Plane.sweep` on a schedule.

``template.yaml`` runs it once a minute. A sweep hands expired leases on (back to
pending, or dead after ``max_attempts``), purges results past retention and removes
drained queues that asked for it. Every step is a compare-and-set, so a run that
overlaps another, or a claim's own opportunistic sweep, changes nothing twice.
"""

from __future__ import annotations

from typing import Any

from ..api import Service
from ..metrics import Registry
from ..plane import Plane
from . import aws
from .api import write_emf

__all__ = ["handler"]

_plane: Plane | None = None
_metrics: Any = None
_logger: Any = None
#: what the sweep's own failures count (a timeout it records: Failed or Retried, as the
#: API counts a worker's), written as EMF after each run
_registry: Registry | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    """Sweep the plane the environment names; answer how many leases it handed on."""
    global _plane, _metrics, _logger, _registry
    if _plane is None:
        from aws_lambda_powertools import Logger, Metrics

        _metrics = Metrics(namespace="Lakeshore", service="sweeper")
        _logger = Logger(service="lakeshore-sweeper")
        _plane = aws.plane_from_env()
        _registry = Registry(keep_events=True)
        Service(_plane, metrics=_registry)  # (counts the attempts the sweep fails)
    assert _registry is not None
    expired = _plane.sweep()
    write_emf(_registry.drain())
    _metrics.add_metric(name="ExpiredLeases", unit="Count", value=expired)
    _metrics.flush_metrics()
    _logger.info("swept", extra={"expired_leases": expired})
    return {"expired_leases": expired}
