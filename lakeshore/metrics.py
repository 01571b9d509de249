"""What the plane counts: per-queue counters and histograms, per-worker gauges.

The service layer (``api/service.py``) feeds one :class:`Registry` after each submit,
claim, completion, failure and heartbeat, and when the plane fails an attempt that ran
past its timeout itself (``Plane.on_attempt_ended``). ``lakeshore serve`` shows it as Prometheus
text (``GET /metrics``, :meth:`Registry.prometheus`); the Lambda handler, which keeps no
memory between calls worth scraping, takes each request's events
(:meth:`Registry.drain`) and writes them as CloudWatch EMF through powertools.

Names (Prometheus; the EMF name is in brackets)::

    lakeshore_invocations_submitted_total{queue}   counter   [Submitted]
    lakeshore_invocations_claimed_total{queue}     counter   [Claimed]
    lakeshore_invocations_succeeded_total{queue}   counter   [Succeeded]
    lakeshore_invocations_failed_total{queue}      counter   [Failed]
    lakeshore_invocations_retried_total{queue}     counter   [Retried]
    lakeshore_invocations_dead_total{queue}        counter   [Dead]
    lakeshore_queue_time_seconds{queue}            histogram [QueueTime]
    lakeshore_run_time_seconds{queue}              histogram [RunTime]
    lakeshore_queue_invocations{queue,state}       gauge     (serve only)
    lakeshore_worker_busy_slots{worker}            gauge     [BusySlots]
    lakeshore_worker_heartbeats_total{worker,kind} counter   [Heartbeats]
    lakeshore_serve_held_requests{kind}            gauge     (serve only)

``dead`` is read from the plane's counts (the sweep that gives up on an invocation runs
inside the plane core): each time the service reads a queue's counts, the counter grows
by the rise in its dead invocations since the previous read.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["BUCKETS", "Event", "Registry"]

#: histogram bucket bounds, in seconds (queue and run times span ms to hours)
BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)

_Labels = tuple[tuple[str, str], ...]

_HELP = {
    "lakeshore_invocations_submitted_total": ("counter", "Invocations accepted by submit."),
    "lakeshore_invocations_claimed_total": ("counter", "Invocations leased to a worker."),
    "lakeshore_invocations_succeeded_total": ("counter", "Invocations that returned."),
    "lakeshore_invocations_failed_total": ("counter", "Invocations that failed for good."),
    "lakeshore_invocations_retried_total": ("counter", "Raises sent back by a retry policy."),
    "lakeshore_invocations_dead_total": ("counter", "Invocations whose workers kept dying."),
    "lakeshore_queue_time_seconds": ("histogram", "From due to claimed, per finished attempt."),
    "lakeshore_run_time_seconds": ("histogram", "From claimed to answered, per attempt."),
    "lakeshore_queue_invocations": ("gauge", "Invocations of a queue by state."),
    "lakeshore_worker_busy_slots": ("gauge", "Jobs a daemon runs, as of its heartbeat."),
    "lakeshore_worker_heartbeats_total": ("counter", "Lease and daemon heartbeats."),
    "lakeshore_serve_held_requests": (
        "gauge",
        "Claims (idle workers) and result waits lakeshore serve holds open.",
    ),
}

#: the EMF name and unit of each Prometheus series that has one
EMF_NAMES: dict[str, tuple[str, str]] = {
    "lakeshore_invocations_submitted_total": ("Submitted", "Count"),
    "lakeshore_invocations_claimed_total": ("Claimed", "Count"),
    "lakeshore_invocations_succeeded_total": ("Succeeded", "Count"),
    "lakeshore_invocations_failed_total": ("Failed", "Count"),
    "lakeshore_invocations_retried_total": ("Retried", "Count"),
    "lakeshore_invocations_dead_total": ("Dead", "Count"),
    "lakeshore_queue_time_seconds": ("QueueTime", "Seconds"),
    "lakeshore_run_time_seconds": ("RunTime", "Seconds"),
    "lakeshore_worker_busy_slots": ("BusySlots", "Count"),
    "lakeshore_worker_heartbeats_total": ("Heartbeats", "Count"),
}


@dataclass(frozen=True)
class Event:
    """One observation, as the EMF writer groups them: a metric, its single dimension
    (``queue`` or ``worker``) and a value."""

    name: str
    dimension: tuple[str, str]
    value: float
    unit: str


class _Histogram:
    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect_left(BUCKETS, value)  # (the first bound at or above the value)
        if i < len(BUCKETS):
            self.counts[i] += 1
        self.sum += value
        self.count += 1


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: _Labels, extra: Iterable[tuple[str, str]] = ()) -> str:
    pairs = [*labels, *extra]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


class Registry:
    """Counters, gauges and histograms in memory; thread-safe.

    ``keep_events=True`` also keeps every observation until :meth:`drain` takes them
    (the Lambda handler drains after each request); otherwise nothing grows with traffic
    but the label sets.
    """

    def __init__(self, *, keep_events: bool = False) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[_Labels, float]] = {}
        self._gauges: dict[str, dict[_Labels, float]] = {}
        self._histograms: dict[str, dict[_Labels, _Histogram]] = {}
        self._dead_seen: dict[str, int] = {}
        self._keep_events = keep_events
        self._events: list[Event] = []

    # --- primitives -----------------------------------------------------------------
    def _event(self, name: str, labels: _Labels, value: float) -> None:
        if self._keep_events and name in EMF_NAMES:
            emf, unit = EMF_NAMES[name]
            self._events.append(Event(emf, labels[0], value, unit))

    def inc(self, name: str, labels: _Labels, value: float = 1.0) -> None:
        with self._lock:
            series = self._counters.setdefault(name, {})
            series[labels] = series.get(labels, 0.0) + value
            self._event(name, labels, value)

    def set(self, name: str, labels: _Labels, value: float) -> None:
        with self._lock:
            self._gauges.setdefault(name, {})[labels] = value
            self._event(name, labels, value)

    def observe(self, name: str, labels: _Labels, value: float) -> None:
        value = max(0.0, value)
        with self._lock:
            series = self._histograms.get(name)
            if series is None:
                series = self._histograms[name] = {}
            histogram = series.get(labels)
            if histogram is None:
                histogram = series[labels] = _Histogram()
            histogram.observe(value)
            self._event(name, labels, value)

    def value(self, name: str, **labels: str) -> float:
        """A counter's or gauge's current value (0 when never set); for tests and tools."""
        key = tuple(labels.items())
        with self._lock:
            for table in (self._counters, self._gauges):
                if key in table.get(name, {}):
                    return table[name][key]
        return 0.0

    # --- what the service reports ----------------------------------------------------
    def submitted(self, queue: str, n: int = 1) -> None:
        self.inc("lakeshore_invocations_submitted_total", (("queue", queue),), n)

    def claimed(self, queue: str, n: int = 1) -> None:
        self.inc("lakeshore_invocations_claimed_total", (("queue", queue),), n)

    def finished(
        self, queue: str, outcome: str, queue_time: float | None, run_time: float | None
    ) -> None:
        """An attempt ended: ``outcome`` is ``succeeded``, ``failed`` or ``retried``."""
        labels = (("queue", queue),)
        self.inc(f"lakeshore_invocations_{outcome}_total", labels)
        if queue_time is not None:
            self.observe("lakeshore_queue_time_seconds", labels, queue_time)
        if run_time is not None:
            self.observe("lakeshore_run_time_seconds", labels, run_time)

    def counts(self, queue: str, counts: Mapping[str, int]) -> None:
        """A queue's counts by state, as the plane reported them just now."""
        labels = (("queue", queue),)
        with self._lock:
            gauge = self._gauges.setdefault("lakeshore_queue_invocations", {})
            for state, n in counts.items():
                gauge[(*labels, ("state", state))] = float(n)
            dead = int(counts.get("dead", 0))
            seen = self._dead_seen.get(queue)
            self._dead_seen[queue] = dead
        if seen is not None and dead > seen:
            self.inc("lakeshore_invocations_dead_total", labels, dead - seen)
        elif seen is None:
            self.inc("lakeshore_invocations_dead_total", labels, 0)

    def heartbeat(self, worker: str, kind: str, n: int = 1) -> None:
        self.inc("lakeshore_worker_heartbeats_total", (("worker", worker), ("kind", kind)), n)

    def busy(self, worker: str, slots: int) -> None:
        self.set("lakeshore_worker_busy_slots", (("worker", worker),), slots)

    def held(self, claims: int, waits: int) -> None:
        """The claims and result waits a server holds open, as of now."""
        self.set("lakeshore_serve_held_requests", (("kind", "claim"),), claims)
        self.set("lakeshore_serve_held_requests", (("kind", "wait"),), waits)

    # --- output ---------------------------------------------------------------------------
    def drain(self) -> list[Event]:
        """The observations since the last drain (with ``keep_events``), oldest first."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def prometheus(self) -> str:
        """The text exposition format (version 0.0.4): HELP and TYPE, then samples."""
        out: list[str] = []
        with self._lock:
            names = sorted({*self._counters, *self._gauges, *self._histograms})
            for name in names:
                kind, text = _HELP.get(name, ("untyped", name))
                out.append(f"# HELP {name} {text}")
                out.append(f"# TYPE {name} {kind}")
                for table in (self._counters, self._gauges):
                    for labels, value in sorted(table.get(name, {}).items()):
                        out.append(f"{name}{_labels(labels)} {_number(value)}")
                for labels, h in sorted(self._histograms.get(name, {}).items()):
                    running = 0
                    for bound, n in zip(BUCKETS, h.counts, strict=True):
                        running += n
                        le = (("le", _number(bound)),)
                        out.append(f"{name}_bucket{_labels(labels, le)} {running}")
                    out.append(f"{name}_bucket{_labels(labels, (('le', '+Inf'),))} {h.count}")
                    out.append(f"{name}_sum{_labels(labels)} {_number(h.sum)}")
                    out.append(f"{name}_count{_labels(labels)} {h.count}")
        return "\n".join(out) + "\n"
