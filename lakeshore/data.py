"""``dls.data``: named bytes on the plane, for data UDFs.

::

    dls.data.put("runs/7/metrics.json", payload)    # inside a job, or anywhere
    return "runs/7/metrics.json"                    # a data UDF returns its keys

A function that returns a bare ``str`` is a data UDF: the string is a manifest of keys,
one per line, that the function stored with :func:`put`. The worker checks each key
exists before it records the result; a bare string that names no stored key fails the
invocation — wrap plain text in structured data (a dict) instead.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from . import config
from .dispatch import Dispatch
from .errors import NotFound

__all__ = ["exists", "get", "put", "url", "using"]

#: inside a job: the plane the job's worker serves (a factory, so a job process opens
#: its own connection only when it touches data)
_job_plane: contextvars.ContextVar[Callable[[], Dispatch] | None] = contextvars.ContextVar(
    "lakeshore_job_plane", default=None
)


@contextmanager
def using(plane: Callable[[], Dispatch]) -> Iterator[None]:
    """Inside the block, data calls without ``dispatch=`` go to ``plane()`` (workers
    wrap each job in it, so a data UDF writes where its invocation lives)."""
    token = _job_plane.set(plane)
    try:
        yield
    finally:
        _job_plane.reset(token)


def _dp(dispatch: Dispatch | None) -> Dispatch:
    if dispatch is not None:
        return dispatch
    plane = _job_plane.get()
    return plane() if plane is not None else config.default_dispatch()


def put(key: str, data: bytes, *, dispatch: Dispatch | None = None) -> str:
    """Store ``data`` under ``key`` (replacing what was there); return its digest."""
    dp = _dp(dispatch)
    digest = hashlib.sha256(data).hexdigest()
    dp.upload({digest: bytes(data)})
    dp.transport.put_data(key, digest)
    return digest


def get(key: str, *, dispatch: Dispatch | None = None) -> bytes:
    """The bytes stored under ``key``; ``NotFound`` when there are none."""
    dp = _dp(dispatch)
    digest = dp.transport.data_digests([key]).get(key)
    if digest is None:
        raise NotFound(f"no data under key {key!r}")
    return dp.transport.get_blob(digest)


def exists(keys: Sequence[str], *, dispatch: Dispatch | None = None) -> set[str]:
    """The keys among ``keys`` that have data."""
    return set(_dp(dispatch).transport.data_digests(list(keys)))


def url(key: str, *, dispatch: Dispatch | None = None) -> str:
    """A URL that serves the bytes under ``key`` for a while (planes that serve blobs)."""
    dp = _dp(dispatch)
    digest = dp.transport.data_digests([key]).get(key)
    if digest is None:
        raise NotFound(f"no data under key {key!r}")
    return dp.transport.blob_url(digest)
