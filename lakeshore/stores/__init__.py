"""Store implementations of :class:`dreamlake.lakeshore.plane.store.Store`."""

from __future__ import annotations

from .sqlite import SqliteStore

__all__ = ["SqliteStore"]
