"""Report an outcome to the plane: the one place results, failures and data manifests
are recorded, for the in-thread worker and the process worker alike."""

from __future__ import annotations

import contextlib
from typing import Any

from ..dispatch import Dispatch
from ..errors import LakeshoreError
from ..plane.model import Claim
from .execute import Outcome

__all__ = ["report"]


def _manifest_error(keys: list[str], missing: list[str]) -> dict[str, Any]:
    if not keys:
        what = "an empty string"
    else:
        what = f"keys that are not in the data store: {', '.join(repr(k) for k in missing[:5])}"
    return {
        "type": "dreamlake.lakeshore.DataKeyMissing",
        "message": (
            f"the function returned a bare str, which is a data-UDF key manifest, with {what}; "
            "store each key with dls.data.put, or wrap text in structured data (a dict)"
        ),
        "traceback": "",
        "pickled": None,
    }


def report(dispatch: Dispatch, claim: Claim, outcome: Outcome) -> None:
    """Complete or fail the claim. A refusal (cancelled, timed out, handed on) is the
    plane's decision and is not an error here."""
    transport = dispatch.transport
    ok, error, retryable = outcome.ok, outcome.error, outcome.retryable
    if ok and outcome.manifest is not None:
        keys = outcome.manifest
        try:
            found = transport.data_digests(keys) if keys else {}
        except LakeshoreError as exc:  # a malformed key
            found, keys = {}, [*keys, str(exc)]
        missing = [k for k in keys if k not in found]
        if missing or not keys:
            ok, error, retryable = False, _manifest_error(keys, missing), False
    with contextlib.suppress(LakeshoreError):
        if ok:
            assert outcome.result is not None
            dispatch.upload(outcome.blobs)
            transport.complete(claim.id, claim.lease_token, outcome.result)
        else:
            assert error is not None
            transport.fail(claim.id, claim.lease_token, error, retryable=retryable)
