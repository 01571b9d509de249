"""Named data: keys that point at content-addressed blobs (``dls.data``).

A data UDF returns a bare ``str``: a manifest of the keys it wrote, one per line. The
worker checks that every key exists before it records the result, so a producer never
gets a manifest that names nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import InvalidRequest, NotFound
from .base import PlaneBase

__all__ = ["DataOps", "validate_key"]

_KEY = re.compile(r"[^\x00-\x1f\x7f]{1,1024}")


def validate_key(key: str) -> None:
    if not isinstance(key, str) or not _KEY.fullmatch(key) or key != key.strip():
        raise InvalidRequest(
            f"data key {key!r} must be 1-1024 printable characters without surrounding spaces"
        )


class DataOps(PlaneBase):
    def put_data(self, key: str, digest: str) -> None:
        """Point ``key`` at the blob ``digest`` (uploaded first)."""
        validate_key(key)
        if not self.store.has_blobs([digest]):
            raise NotFound(f"no blob {digest!r} on this plane: upload it before naming it")
        self.store.put_data_key(key, digest, self.clock.now())

    def data_digests(self, keys: Sequence[str]) -> dict[str, str]:
        """The digests of the keys that exist among ``keys``."""
        for key in keys:
            validate_key(key)
        return self.store.get_data_keys(keys)
