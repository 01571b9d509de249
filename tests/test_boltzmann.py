"""Boltzmann queues: claims follow softmax(priority / T), and annealing sharpens them.

The plane samples with a seeded RNG and a fake clock, so the statistics are exact
repeats from run to run. The pool is kept constant: each claimed invocation is
completed and replaced by a fresh one of the same priority.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator

import pytest

from dreamlake.lakeshore.clock import FakeClock
from dreamlake.lakeshore.plane import Plane, QueueSpec, Submission
from dreamlake.lakeshore.plane.kinds import temperature
from dreamlake.lakeshore.stores import SqliteStore

PRIORITIES = (0.0, 1.0, 2.0, 3.0)
PER_CLASS = 20
#: chi-square critical value, 3 degrees of freedom, alpha = 0.001
CHI2_CRIT_DF3 = 16.27


@pytest.fixture
def plane() -> Iterator[Plane]:
    p = Plane(SqliteStore(":memory:"), clock=FakeClock(), rng=random.Random(1234))
    yield p
    p.close()


def _fill(plane: Plane, queue: str) -> None:
    subs = [
        Submission(id=f"{queue}-{p}-{i}", queue=queue, payload=b"x", priority=p)
        for p in PRIORITIES
        for i in range(PER_CLASS)
    ]
    plane.submit(subs)


def _draw(plane: Plane, queue: str, n: int, start: int = 0) -> list[float]:
    """Claim n times; after each claim, put back one invocation of the same priority."""
    seen = []
    for k in range(n):
        (claim,) = plane.claim([queue], "w")
        rec = plane.get(claim.id)
        seen.append(rec.priority)
        plane.complete(claim.id, claim.lease_token, b"")
        plane.submit(
            [Submission(id=f"r{start + k}", queue=queue, payload=b"x", priority=rec.priority)]
        )
    return seen


def _softmax(temp: float) -> list[float]:
    weights = [PER_CLASS * math.exp(p / temp) for p in PRIORITIES]
    total = sum(weights)
    return [w / total for w in weights]


def _chi2(seen: list[float], expected: list[float]) -> float:
    counts = Counter(seen)
    n = len(seen)
    return sum(
        (counts[p] - n * e) ** 2 / (n * e) for p, e in zip(PRIORITIES, expected, strict=True)
    )


@pytest.mark.parametrize("temp", [0.7, 1.5])
def test_claims_follow_softmax_at_the_queue_temperature(plane: Plane, temp: float) -> None:
    # Given a boltzmann queue with four priority classes of equal size
    plane.ensure_queue(QueueSpec("b", kind="boltzmann", temperature=temp))
    _fill(plane, "b")
    # When 3,000 claims are made
    seen = _draw(plane, "b", 3000)
    # Then the class frequencies match softmax(priority / T) (chi-square, alpha 0.001)
    assert _chi2(seen, _softmax(temp)) < CHI2_CRIT_DF3
    # And they clearly do not match the uniform or the greedy choice
    assert _chi2(seen, [0.25] * 4) > CHI2_CRIT_DF3
    assert Counter(seen)[3.0] < len(seen)


def test_annealing_over_claims_sharpens_the_distribution(plane: Plane) -> None:
    # Given a hot queue that cools by claims
    anneal = {"schedule": "exponential", "rate": 0.002, "min_temperature": 0.25, "per": "claim"}
    plane.ensure_queue(QueueSpec("a", kind="boltzmann", temperature=4.0, anneal=anneal))
    _fill(plane, "a")
    # When 2,000 claims are made
    seen = _draw(plane, "a", 2000)
    # Then the top class is taken far more often at the end than at the start
    early = Counter(seen[:400])[3.0] / 400
    late = Counter(seen[-400:])[3.0] / 400
    assert late > early + 0.3
    # And the late claims follow softmax at the floor temperature
    assert _chi2(seen[-400:], _softmax(0.25)) < CHI2_CRIT_DF3


def test_annealing_over_time_follows_the_schedule(plane: Plane) -> None:
    # Given a queue that cools by time, linearly, to a floor
    anneal = {"schedule": "linear", "rate": 0.1, "min_temperature": 0.5, "per": "second"}
    spec = plane.ensure_queue(QueueSpec("t", kind="boltzmann", temperature=2.0, anneal=anneal))
    start = plane.now()
    # Then the temperature falls 0.1 per second and stops at the floor
    assert temperature(spec, start, 0) == pytest.approx(2.0)
    assert temperature(spec, start + 10, 0) == pytest.approx(1.0)
    assert temperature(spec, start + 100, 0) == pytest.approx(0.5)


def test_a_live_temperature_change_applies_to_the_next_claims(plane: Plane) -> None:
    # Given a hot queue
    plane.ensure_queue(QueueSpec("live", kind="boltzmann", temperature=50.0))
    _fill(plane, "live")
    hot = _draw(plane, "live", 1000)
    # When its temperature is lowered on the plane
    plane.update_queue("live", temperature=0.3)
    cold = _draw(plane, "live", 1000, start=1000)
    # Then claims follow the new temperature
    assert _chi2(hot, _softmax(50.0)) < CHI2_CRIT_DF3
    assert _chi2(cold, _softmax(0.3)) < CHI2_CRIT_DF3
