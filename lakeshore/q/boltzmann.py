"""``from dreamlake.lakeshore.q.boltzmann import rollouts`` → ``BoltzmannQueue("rollouts")``."""

from __future__ import annotations

from typing import Any

from ..queue import BoltzmannQueue
from . import lazy_handle

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    return lazy_handle(BoltzmannQueue, name)
