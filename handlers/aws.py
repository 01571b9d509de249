"""The AWS plane of the Lambda functions: the DynamoDB + S3 store the stack names.

``template.yaml`` hands every function the physical names of its tables and bucket
(:data:`~dreamlake.lakeshore.stores.keys.ENV_VARS`) and the API function
``LAKESHORE_MAX_WAIT``. :func:`service_from_env` builds the API's
:class:`~dreamlake.lakeshore.api.Service` from them, :func:`plane_from_env` the
sweeper's plane.

What a failure of DynamoDB or S3 becomes::

    conditional check failed     contention, not an error: the plane tries the next
                                 candidate, or refuses (LeaseLost, a submit replay)
    throttled, 5xx, unreachable  botocore retries (standard mode: 5 attempts with
                                 backoff). Safe: every write is conditional or
                                 content-addressed, and a retried write that had in
                                 fact landed is recognised (the store's own-write check,
                                 the idempotent submit)
    still failing after that     StoreUnavailable: 503 with Retry-After and a one-line
                                 reason; the client retries the same request, which
                                 ids make idempotent

The last mapping is by error code and HTTP status, on the clients themselves
(:func:`map_errors`), so it covers every call the store makes and never reads a
message.
"""

from __future__ import annotations

import os
from typing import Any

from ..api import Limits, Service
from ..clock import Clock
from ..errors import Unavailable
from ..plane import Plane
from ..stores.keys import ENV_VARS, Resources

__all__ = [
    "ENV_MAX_WAIT",
    "RETRY_AFTER",
    "THROTTLING_CODES",
    "StoreUnavailable",
    "limits_from_env",
    "map_errors",
    "names_tables",
    "plane_from_env",
    "service_from_env",
]

#: seconds a claim or a result wait may block inside the API function (the stack sets
#: 2: Lambda bills the wait, so clients poll with backoff instead)
ENV_MAX_WAIT = "LAKESHORE_MAX_WAIT"
#: error codes of a request refused for its rate (botocore retries these first)
THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",  # DynamoDB: a partition's rate
        "ThrottlingException",  # DynamoDB: on-demand table or account limits
        "RequestLimitExceeded",  # DynamoDB: the account's throughput limit
        "SlowDown",  # S3: a prefix's request rate
        "Throttling",
        "TooManyRequestsException",
    }
)
#: seconds a client waits before it retries a request answered StoreUnavailable
RETRY_AFTER = 1
_SERVICES = {"dynamodb": "DynamoDB", "s3": "S3"}


class StoreUnavailable(Unavailable):
    """DynamoDB or S3 kept refusing a request (throttled, 5xx, unreachable) through
    botocore's retries. The API answers 503 with ``Retry-After``."""

    #: seconds, sent as the Retry-After header
    retry_after = RETRY_AFTER


def names_tables() -> bool:
    """Whether the environment names the stack's tables (any of ``ENV_VARS``)."""
    return any(var in os.environ for var in ENV_VARS)


def limits_from_env() -> Limits:
    """The API's limits, with ``max_wait`` from ``LAKESHORE_MAX_WAIT`` when it is set.

    Raises RuntimeError (at the function's cold start) for a value that is not 0 to
    the default ``max_wait`` seconds.
    """
    raw = os.environ.get(ENV_MAX_WAIT)
    if raw is None:
        return Limits()
    ceiling = Limits().max_wait
    try:
        wait = float(raw)
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= ceiling:
        raise RuntimeError(f"{ENV_MAX_WAIT} must be 0 to {ceiling:g} seconds, not {raw!r}")
    return Limits(max_wait=wait)


def map_errors(client: Any) -> Any:
    """Make a DynamoDB or S3 client raise :class:`StoreUnavailable` for a request that
    is still throttled, failing on the service's side or unreachable after botocore's
    own retries. Decided by error code and HTTP status. Returns the client."""
    service = client.meta.service_model.service_id.hyphenize()
    events = client.meta.events
    events.register(f"after-call.{service}", _after_call, unique_id="lakeshore-unavailable")
    events.register(
        f"after-call-error.{service}", _after_call_error, unique_id="lakeshore-unreachable"
    )
    return client


def _after_call(http_response: Any, parsed: dict[str, Any], model: Any, **_: Any) -> None:
    status = int(http_response.status_code)
    code = str(parsed.get("Error", {}).get("Code", ""))
    if status < 500 and code not in THROTTLING_CODES:
        return
    service = _SERVICES.get(model.service_model.endpoint_prefix, "AWS")
    what = "is throttling requests" if code in THROTTLING_CODES else "failed"
    detail = f"{code or 'HTTP ' + str(status)} on {model.name}"
    raise StoreUnavailable(f"{service} {what} ({detail}); retry shortly")


def _after_call_error(exception: Exception, **_: Any) -> None:
    from botocore.exceptions import (  # type: ignore[import-untyped]
        ConnectionError,
        HTTPClientError,
    )

    if isinstance(exception, ConnectionError | HTTPClientError):
        reason = type(exception).__name__
        raise StoreUnavailable(f"cannot reach the plane's storage ({reason}); retry shortly")


def _open_store(session: Any = None) -> Any:
    from ..stores.dynamo import DynamoStore, lambda_client_config, make_clients

    missing = [var for var in ENV_VARS if var not in os.environ]
    if missing:
        raise RuntimeError(f"the stack's plane needs {', '.join(missing)} set as well")
    # few attempts and short timeouts: a failing call ends well inside the 29 s timeout
    dynamodb, s3 = make_clients(session=session, config=lambda_client_config())
    return DynamoStore(Resources.from_env(), dynamodb=map_errors(dynamodb), s3=map_errors(s3))


def plane_from_env(*, clock: Clock | None = None, session: Any = None) -> Plane:
    """A plane over the DynamoDB + S3 store the environment names (every one of
    ``ENV_VARS``; RuntimeError names the missing ones). Clients come from ``session``
    (a ``boto3.Session``) when given, with :func:`map_errors` on them."""
    return Plane(_open_store(session), clock=clock)


def service_from_env(*, session: Any = None) -> Service:
    """The API's Service over :func:`plane_from_env`, limits from :func:`limits_from_env`."""
    return Service(
        plane_from_env(session=session), limits=limits_from_env(), server="lakeshore lambda"
    )
