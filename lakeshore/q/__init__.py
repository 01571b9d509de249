"""Lazy queue handles by import: ``from dreamlake.lakeshore.q import tutorial``.

``tutorial`` is ``Queue("tutorial")``; ``from dreamlake.lakeshore.q.priority import
urgent`` is a ``PriorityQueue``, ``from dreamlake.lakeshore.q.boltzmann import rollouts``
a ``BoltzmannQueue``. Importing makes no plane call. The first submit to a queue the
plane does not know creates it and warns once (``QueueCreatedWarning``), so a typo
shows up; ``strict=True`` (``dls.configure(strict=True)``) makes it an error instead.
The same name gives the same handle every time. Names starting with ``_`` and the
submodule names ``priority`` and ``boltzmann`` cannot be imported this way.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from ..queue import Queue

__all__: list[str] = []

_SUBMODULES = ("priority", "boltzmann")
_lock = threading.Lock()
_handles: dict[tuple[str, str], Queue] = {}


def lazy_handle(cls: type[Queue], name: str) -> Queue:
    """The one handle of class ``cls`` for queue ``name``."""
    if name.startswith("_"):
        raise AttributeError(name)
    with _lock:
        key = (cls.__name__, name)
        handle = _handles.get(key)
        if handle is None:
            handle = _handles[key] = cls(name, warn_missing=True)
        return handle


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return lazy_handle(Queue, name)
