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

import hashlib
from collections.abc import Sequence

from . import config
from .dispatch import Dispatch
from .errors import NotFound

__all__ = ["exists", "get", "put", "url"]


def _dp(dispatch: Dispatch | None) -> Dispatch:
    return dispatch or config.default_dispatch()


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
