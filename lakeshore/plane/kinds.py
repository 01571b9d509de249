"""Queue kinds beyond ordering: settings validation, running caps, Boltzmann sampling.

Boltzmann queues choose among pending invocations with probability ∝ exp(priority / T).
``anneal`` lowers T over time or over claims::

    {"schedule": "exponential", "rate": 0.01, "min_temperature": 0.05, "per": "second"}

    exponential   T = max(min_temperature, temperature * exp(-rate * n))
    linear        T = max(min_temperature, temperature - rate * n)

where n counts seconds (``per: "second"``, the default) or claims (``per: "claim"``)
since the schedule was set — when the queue was created or its ``anneal`` last changed.
``min_temperature`` defaults to 0.01. The plane records that origin under the
``origin`` key itself; it is not a setting a handle compares.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..errors import InvalidRequest, QueueMismatch
from .model import Invocation, QueueSpec, RetryPolicy
from .ordering import KINDS

__all__ = [
    "BOLTZMANN_CANDIDATES",
    "KIND_OPTIONS",
    "anneal_origin",
    "boltzmann_order",
    "check_kind_settings",
    "check_queue_name",
    "check_retry",
    "check_spec_retry",
    "check_settings",
    "comparable",
    "running_cap",
    "temperature",
    "validate_spec",
]

#: a Boltzmann claim samples among this many highest-priority pending invocations
BOLTZMANN_CANDIDATES = 256

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,255}")
_ANNEAL_KEYS = {"schedule", "rate", "min_temperature", "per", "origin"}
_DEFAULT_FLOOR = 0.01


def check_queue_name(name: object) -> None:
    """Raise :class:`InvalidRequest` unless ``name`` can name a queue."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidRequest(
            f"queue name {name!r} must be 1-256 letters, digits and . _ : - "
            "(starting with a letter or digit)"
        )


#: kind → the settings only it follows (of the rest, every kind follows each)
KIND_OPTIONS: dict[str, frozenset[str]] = {
    "fifo": frozenset(),
    "filo": frozenset(),
    "priority": frozenset({"priority_field"}),
    "boltzmann": frozenset({"priority_field", "temperature", "anneal"}),
}


def check_kind_settings(kind: str, settings: Iterable[str]) -> None:
    """Raise :class:`InvalidRequest` for a setting given that a queue of ``kind`` does
    not follow (a temperature for a fifo queue would be stored and do nothing)."""
    for name in settings:
        kinds = sorted(k for k, options in KIND_OPTIONS.items() if name in options)
        if kinds and kind not in kinds:
            raise InvalidRequest(f"{name} applies to {' and '.join(kinds)} queues, not {kind} ones")


def check_retry(retry: RetryPolicy | None) -> None:
    """Raise :class:`InvalidRequest` for a retry policy no retry can follow."""
    if retry is None:
        return
    if isinstance(retry.max, bool) or not isinstance(retry.max, int) or retry.max < 0:
        raise InvalidRequest("retry.max must be a whole number >= 0")
    for name in ("backoff", "max_backoff"):
        value = getattr(retry, name)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0:
            raise InvalidRequest(f"retry.{name} must be a finite number of seconds >= 0")


def check_spec_retry(spec: QueueSpec) -> None:
    """Raise :class:`InvalidRequest` for a queue's retry setting no retry can follow
    (checked where it is given: a spec stored before the check stays usable)."""
    if spec.retry is not None:
        try:
            policy = RetryPolicy(**spec.retry)
        except TypeError as exc:
            raise InvalidRequest(f"retry: {exc}") from None
        check_retry(policy)


def validate_spec(spec: QueueSpec) -> None:
    """Raise :class:`InvalidRequest` for settings the plane cannot honour."""
    check_queue_name(spec.name)
    if spec.kind not in KINDS:
        raise InvalidRequest(
            f"unknown queue kind {spec.kind!r}; expected one of {', '.join(KINDS)}"
        )
    if not spec.priority_field or not isinstance(spec.priority_field, str):
        raise InvalidRequest("priority_field must be a keyword argument name")
    if spec.temperature is not None and not (
        isinstance(spec.temperature, int | float) and spec.temperature > 0
    ):
        raise InvalidRequest("temperature must be a number > 0")
    if spec.anneal is not None:
        _validate_anneal(spec.anneal)
    if spec.elasticity is not None:
        el = spec.elasticity
        if el.get("kind") != "fixed" or not isinstance(el.get("max"), int) or el["max"] < 1:
            raise InvalidRequest('elasticity must be {"kind": "fixed", "max": N} with N >= 1')


def _validate_anneal(anneal: dict[str, Any]) -> None:
    unknown = set(anneal) - _ANNEAL_KEYS
    if unknown:
        raise InvalidRequest(f"unknown anneal keys: {', '.join(sorted(unknown))}")
    if anneal.get("schedule", "exponential") not in ("exponential", "linear"):
        raise InvalidRequest("anneal schedule must be 'exponential' or 'linear'")
    if anneal.get("per", "second") not in ("second", "claim"):
        raise InvalidRequest("anneal per must be 'second' or 'claim'")
    rate = anneal.get("rate")
    if not isinstance(rate, int | float) or rate < 0:
        raise InvalidRequest("anneal needs a rate >= 0")
    floor = anneal.get("min_temperature", _DEFAULT_FLOOR)
    if not isinstance(floor, int | float) or floor <= 0:
        raise InvalidRequest("anneal min_temperature must be > 0")


def comparable(spec: QueueSpec) -> dict[str, Any]:
    """A spec's settings as a handle compares them (the plane's own keys left out)."""
    settings = spec.settings()
    if settings.get("anneal"):
        settings["anneal"] = {k: v for k, v in settings["anneal"].items() if k != "origin"}
    return settings


def check_settings(wanted: QueueSpec, stored: QueueSpec, check: Iterable[str]) -> None:
    """Raise :class:`QueueMismatch` if a setting named in ``check`` differs."""
    check = tuple(check)
    if not check:  # (every submit of a handle that checks nothing comes here)
        return
    want, have = comparable(wanted), comparable(stored)
    diff = [k for k in check if want[k] != have[k]]
    if diff:
        detail = ", ".join(f"{k}={have[k]!r} (asked: {want[k]!r})" for k in diff)
        raise QueueMismatch(f"queue {stored.name!r} exists with {detail}")


def anneal_origin(spec: QueueSpec, now: float, claims: int) -> QueueSpec:
    """The spec with its anneal schedule starting now (at ``claims`` claims)."""
    if not spec.anneal:
        return spec
    per = spec.anneal.get("per", "second")
    anneal = {**spec.anneal, "origin": claims if per == "claim" else now}
    return QueueSpec(**{**spec.settings(), "name": spec.name, "anneal": anneal})


def temperature(spec: QueueSpec, now: float, claims: int) -> float:
    """The queue's temperature now, after annealing."""
    t0 = float(spec.temperature or 1.0)
    anneal = spec.anneal
    if not anneal:
        return t0
    per = anneal.get("per", "second")
    origin = float(anneal.get("origin", 0.0))
    n = max(0.0, (claims if per == "claim" else now) - origin)
    rate = float(anneal["rate"])
    if anneal.get("schedule", "exponential") == "linear":
        t = t0 - rate * n
    else:
        t = t0 * math.exp(-rate * n)
    return max(float(anneal.get("min_temperature", _DEFAULT_FLOOR)), t)


def running_cap(spec: QueueSpec) -> int | None:
    el = spec.elasticity
    if el and el.get("kind") == "fixed":
        return int(el["max"])
    return None


def boltzmann_order(
    candidates: Sequence[Invocation], temp: float, rng: random.Random
) -> Iterator[Invocation]:
    """Draw candidates without replacement, each draw ∝ exp(priority / temp).

    Lazy: a claim usually takes the first draw, so later draws are rarely computed.
    """
    pool = list(candidates)
    while pool:
        top = max(r.priority for r in pool)
        weights = [math.exp((r.priority - top) / temp) for r in pool]
        pick = rng.choices(range(len(pool)), weights=weights)[0]
        yield pool.pop(pick)
