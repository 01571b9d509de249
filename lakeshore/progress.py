"""``dls.progress(fraction, message)``: a running job says how far it is.

Inside a job run by a worker the call is recorded on the invocation (and shown by
``lakeshore invocations show``); anywhere else — a plain local call of the function —
it does nothing, so the same function body runs both ways.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["MAX_MESSAGE", "progress", "reporting"]

#: characters of a progress message the plane keeps (a longer one is cut here, before
#: it travels)
MAX_MESSAGE = 1000

Reporter = Callable[[float, "str | None"], None]

_reporter: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar(
    "lakeshore_progress", default=None
)


def progress(fraction: float, message: str | None = None) -> None:
    """Record that the running job is ``fraction`` (0 to 1) done, with a message (its
    first :data:`MAX_MESSAGE` characters)."""
    if not 0.0 <= float(fraction) <= 1.0:
        raise ValueError("progress takes a fraction from 0 to 1")
    report = _reporter.get()
    if report is not None:
        report(float(fraction), None if message is None else str(message)[:MAX_MESSAGE])


@contextmanager
def reporting(report: Reporter | None) -> Iterator[None]:
    """Route :func:`progress` calls made inside the block to ``report``."""
    token = _reporter.set(report)
    try:
        yield
    finally:
        _reporter.reset(token)
