"""Report an outcome to the plane: the one place results, failures and data manifests
are recorded, for the in-thread worker and the process worker alike."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..dispatch import Dispatch
from ..errors import InvalidRequest, LakeshoreError, PayloadTooLarge
from ..plane.model import Claim
from .execute import Outcome

__all__ = ["report", "report_many"]

log = logging.getLogger("dreamlake.lakeshore.worker")


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


def _checked(dispatch: Dispatch, outcome: Outcome) -> Outcome:
    """A data UDF's outcome fails when its manifest names a key that is not stored."""
    if not outcome.ok or outcome.manifest is None:
        return outcome
    keys = outcome.manifest
    try:
        found = dispatch.transport.data_digests(keys) if keys else {}
    except LakeshoreError as exc:  # a malformed key
        found, keys = {}, [*keys, str(exc)]
    missing = [k for k in keys if k not in found]
    if missing or not keys:
        return Outcome(ok=False, error=_manifest_error(keys, missing), retryable=False)
    return outcome


def report(dispatch: Dispatch, claim: Claim, outcome: Outcome) -> None:
    """Complete or fail one claim (see :func:`report_many`)."""
    report_many(dispatch, [(claim, outcome)])


def report_many(dispatch: Dispatch, done: Sequence[tuple[Claim, Outcome]]) -> None:
    """Complete or fail claims, results in one batch and failures in another. A refusal
    (cancelled, timed out, handed on) is the plane's decision, not an error here; a
    result the plane refuses (unreadable, or a blob over its limit) fails its invocation
    instead (not retried)."""
    checked = [(claim, _checked(dispatch, outcome)) for claim, outcome in done]
    ok = [(c, o) for c, o in checked if o.ok]
    failed = [(c, o) for c, o in checked if not o.ok]
    transport = dispatch.transport
    if ok:
        try:
            ok, refused = _upload_results(dispatch, ok)
            failed += refused
            refusals = (
                transport.complete_many([(c.id, c.lease_token, o.result or b"") for c, o in ok])
                if ok
                else []
            )
            _complete_again(dispatch, ok, refusals)
            failed += [
                (c, _unreadable_result(refusal))
                for (c, _), refusal in zip(ok, refusals, strict=True)
                if isinstance(refusal, InvalidRequest)
            ]
        except LakeshoreError as exc:
            _lost("result", ok, exc)
    if failed:
        try:
            transport.fail_many(
                [(c.id, c.lease_token, o.error or {}, o.retryable) for c, o in failed]
            )
        except LakeshoreError as exc:
            _lost("failure", failed, exc)


def _complete_again(
    dispatch: Dispatch, ok: list[tuple[Claim, Outcome]], refusals: list[Exception | None]
) -> None:
    """Results with blobs the plane refused (``refusals``, changed in place): a blob this
    process sent before, and so did not send again, may have expired from the plane
    since (its retention counts from its last use). Each is sent again, and its result
    once more; what the plane then says stands."""
    again = [
        i
        for i, refusal in enumerate(refusals)
        if isinstance(refusal, InvalidRequest) and ok[i][1].blobs
    ]
    if not again:
        return
    blobs = {d: b for i in again for d, b in ok[i][1].blobs.items()}
    try:
        dispatch.forget_blobs(blobs)
        dispatch.upload(blobs)
        answers = dispatch.transport.complete_many(
            [(ok[i][0].id, ok[i][0].lease_token, ok[i][1].result or b"") for i in again]
        )
    except LakeshoreError as exc:
        log.warning("lakeshore worker: sending result blobs again failed: %s", exc)
        return
    for i, answer in zip(again, answers, strict=True):
        refusals[i] = answer


def _lost(what: str, items: Sequence[tuple[Claim, Outcome]], exc: LakeshoreError) -> None:
    """Say which outcomes the plane did not take (away, or refusing the worker's token):
    nothing else records them; the plane hands each call on when its lease runs out."""
    ids = ", ".join(c.id for c, _ in items[:3]) + (", ..." if len(items) > 3 else "")
    log.warning(
        "lakeshore worker: the %s of %d call(s) (%s) did not reach the plane: %s: %s;"
        " the plane hands each on when its lease runs out (another attempt, if it has one)",
        what,
        len(items),
        ids,
        type(exc).__name__,
        exc,
    )


def _upload_results(
    dispatch: Dispatch, ok: list[tuple[Claim, Outcome]]
) -> tuple[list[tuple[Claim, Outcome]], list[tuple[Claim, Outcome]]]:
    """Upload the result blobs of ``ok``: those the plane took, and as failures those
    over its blob limit — a result that big will not fit however often the job runs, so
    the invocation fails now with the reason. Other errors raise (the plane away, or an
    S3 answer that says no more than its status): nothing is reported, and the lease
    runs out into a retry."""
    try:
        dispatch.upload({d: b for _, o in ok for d, b in o.blobs.items()})
        return ok, []
    except PayloadTooLarge as exc:
        if len(ok) == 1:
            return [], [(ok[0][0], _unreadable_result(exc))]
    taken: list[tuple[Claim, Outcome]] = []
    refused: list[tuple[Claim, Outcome]] = []
    for claim, outcome in ok:  # one at a time: which of them was refused
        try:
            dispatch.upload(outcome.blobs)
            taken.append((claim, outcome))
        except PayloadTooLarge as exc:
            refused.append((claim, _unreadable_result(exc)))
    return taken, refused


def _unreadable_result(refusal: Exception) -> Outcome:
    """The failure that stands for a result the plane refused to record."""
    error = {
        "type": "dreamlake.lakeshore.InvalidResult",
        "message": f"the plane refused the job's result: {refusal}",
        "traceback": "",
        "pickled": None,
    }
    return Outcome(ok=False, error=error, retryable=False)
