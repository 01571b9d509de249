"""Structured logs: one JSON object per line, the invocation id as correlation id.

The plane (``api/service.py``), the workers (``worker/loop.py``, ``worker/pool.py``) and
the SDK's submit path log through :func:`event` under the ``dreamlake.lakeshore`` logger
tree. A line reads::

    {"time": "2025-01-31T12:00:00.123Z", "level": "INFO", "logger": "dreamlake.lakeshore.api",
     "event": "invocation.completed", "correlation_id": "01m8…", "queue": "q", ...}

so ``correlation_id`` follows one invocation from the producer through the plane to the
worker and back. Nothing is printed unless asked: call :func:`configure`, or set
``LAKESHORE_LOG=json`` (read on the first event, in every process) — the Lambda handler
configures it itself. Events are INFO (DEBUG for the chatty ones); a disabled level
costs one check.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import IO, Any

__all__ = ["JsonFormatter", "configure", "event"]

#: the root of the package's loggers
ROOT = "dreamlake.lakeshore"
#: the attribute of a LogRecord that carries an event's fields
_FIELDS = "lakeshore_fields"
#: record attributes every LogRecord has; anything else passed in ``extra`` is a field
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}

_env_read = False


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: time (UTC, ms), level, logger, event or
    message, the event's fields, and the exception's traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        at = time.gmtime(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", at) + f".{int(record.msecs):03d}Z"
        out: dict[str, Any] = {"time": stamp, "level": record.levelname, "logger": record.name}
        fields = getattr(record, _FIELDS, None)
        if isinstance(fields, dict):
            out.update(fields)
        else:
            out["message"] = record.getMessage()
            out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class CurrentStream:
    """``sys.stdout`` or ``sys.stderr`` as it is when a line is written, not as it was
    when logging was configured (a test runner swaps and closes them)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text: str) -> int:
        return int(getattr(sys, self.name).write(text))

    def flush(self) -> None:
        getattr(sys, self.name).flush()


def configure(
    stream: IO[str] | CurrentStream | None = None,
    level: int = logging.INFO,
    *,
    logger: str = ROOT,
) -> logging.Handler:
    """Print the package's logs as JSON lines on ``stream`` (stderr) from ``level`` up.

    Idempotent: a second call replaces the handler the first installed.
    """
    log = logging.getLogger(logger)
    for h in list(log.handlers):
        if isinstance(h.formatter, JsonFormatter):
            log.removeHandler(h)
    handler: logging.StreamHandler[Any] = logging.StreamHandler(stream or CurrentStream("stderr"))
    handler.setFormatter(JsonFormatter())
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    return handler


def _from_env() -> None:
    global _env_read
    _env_read = True
    wanted = os.environ.get("LAKESHORE_LOG", "").strip().lower()
    if wanted in ("json", "debug"):
        configure(level=logging.DEBUG if wanted == "debug" else logging.INFO)


def event(
    logger: logging.Logger,
    name: str,
    invocation_id: str | None = None,
    *,
    level: int = logging.INFO,
    **fields: Any,
) -> None:
    """Log event ``name`` with ``invocation_id`` as the correlation id and ``fields``."""
    if not _env_read:
        _from_env()
    if not logger.isEnabledFor(level):
        return
    body: dict[str, Any] = {"event": name}
    if invocation_id is not None:
        body["correlation_id"] = invocation_id
    body.update(fields)
    logger.log(level, name, extra={_FIELDS: body}, stacklevel=2)
