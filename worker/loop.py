"""``run_worker``: claim, run and report in this thread, heartbeating leases meanwhile.

This is the in-thread form (tests, notebooks, the seed examples). It claims one
invocation at a time, so a job that blocks blocks this worker only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence

from .. import data, logs
from ..dispatch import Dispatch
from ..errors import LakeshoreError, Throttled, Unavailable
from ..plane.model import Claim
from ..progress import Reporter
from ..queue import _QueueHandle
from ..transport import Transport
from .execute import Executor
from .report import report

__all__ = ["run_worker"]

_log = logging.getLogger("dreamlake.lakeshore.worker")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident():x}"


class _Heartbeat:
    """Extends the lease of the job in hand every third of the lease."""

    def __init__(self, transport: Transport, lease_seconds: float) -> None:
        self._transport = transport
        self._interval = max(0.05, lease_seconds / 3)
        self._lease_seconds = lease_seconds
        self._claim: Claim | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.cancelled = False
        self._thread = threading.Thread(target=self._run, name="lakeshore-heartbeat", daemon=True)
        self._thread.start()

    def hold(self, claim: Claim | None) -> None:
        with self._lock:
            self._claim = claim
            self.cancelled = False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                claim = self._claim
            if claim is None:
                continue
            try:
                answer = self._transport.heartbeat(
                    claim.id, claim.lease_token, lease_seconds=self._lease_seconds
                )
            except Exception:
                continue  # the next beat tries again; the lease has slack
            if answer.cancel or not answer.ok:
                with self._lock:
                    if self._claim is claim:
                        self.cancelled = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _progress_to(transport: Transport, claim: Claim) -> Reporter:
    def report(fraction: float, message: str | None) -> None:
        with contextlib.suppress(LakeshoreError):  # progress is best effort
            transport.report_progress(claim.id, claim.lease_token, fraction, message)

    return report


def run_worker(
    queue: _QueueHandle | Sequence[_QueueHandle],
    *,
    stop: Callable[[], bool] | None = None,
    once: bool = False,
    dispatch: Dispatch | None = None,
    worker_id: str | None = None,
    lease_seconds: float = 60.0,
    poll: float = 0.25,
) -> int:
    """Run invocations of ``queue`` in this thread; return how many ran.

    Loops until ``stop()`` returns true (checked at least every ``poll`` seconds while
    idle, and between jobs). With ``once=True``, runs exactly one invocation — waiting
    for one to arrive — and returns. Queues are served in the order given.
    """
    handles = [queue] if isinstance(queue, _QueueHandle) else list(queue)
    if not handles:
        raise ValueError("run_worker needs at least one queue")
    dp = dispatch or handles[0].dispatch
    transport = dp.transport
    names = [h.name for h in handles]
    for h in handles:  # a worker may start before any producer: make the queues exist
        dp.ensure_queue(h.spec, strict=h.strict, check=())
    executor = Executor(transport)
    beat = _Heartbeat(transport, lease_seconds)
    me = worker_id or default_worker_id()
    ran = 0
    outage = 0.0

    def stopping() -> bool:
        return stop is not None and bool(stop())

    try:
        while not stopping():
            try:
                claims = transport.claim(
                    names, me, limit=1, wait=poll, lease_seconds=lease_seconds, should_stop=stop
                )
            except (Unavailable, Throttled):
                # the plane is away (the transport already retried): wait, then try again
                outage = min(max(0.5, outage * 2), 30.0)
                threading.Event().wait(outage)
                continue
            outage = 0.0
            for claim in claims:
                logs.event(
                    _log, "job.started", claim.id, queue=claim.queue, worker=me,
                    attempt=claim.attempt,
                )  # fmt: skip
                beat.hold(claim)
                with data.using(lambda: dp):
                    outcome = executor.run(claim, progress=_progress_to(transport, claim))
                beat.hold(None)
                # logged before the report: once reported, the producer may read the
                # result (and the logs) at once
                logs.event(
                    _log, "job.finished", claim.id, queue=claim.queue, worker=me, ok=outcome.ok,
                    error_type=(outcome.error or {}).get("type"),
                )  # fmt: skip
                report(dp, claim, outcome)
                ran += 1
            if once and ran:
                break
    finally:
        beat.close()
    return ran
