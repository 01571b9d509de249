"""``from dreamlake.lakeshore.q.priority import urgent`` → ``PriorityQueue("urgent")``."""

from __future__ import annotations

from typing import Any

from ..queue import PriorityQueue
from . import lazy_handle

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    return lazy_handle(PriorityQueue, name)
