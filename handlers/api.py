"""The API's Lambda entry point: aws-lambda-powertools routes, thin over the Service.

Each route authenticates the caller, decodes the body (msgpack or JSON), calls one
:class:`~dreamlake.lakeshore.api.Service` method and encodes its answer in the type the
client asked for. Errors map to HTTP by class (``LakeshoreError.status``), never by
message. ``make_app(service)`` builds the router; ``lakeshore serve`` calls it with a
SQLite plane, and :func:`handler` (the Lambda entry) with the plane its environment
names.

Besides API v1 the router serves the web dashboard (``GET /`` → ``/ui/``, its static
files without a token: every figure they show comes from v1 with the bearer token) and
the service's metrics as Prometheus text (``GET /metrics``, admin).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware

from .. import logs
from ..api import Identity, Service, authenticate
from ..api.codec import JSON, MSGPACK, decode_body, encode_body, is_msgpack, pick_type, reason
from ..dashboard import asset as dashboard_file
from ..errors import (
    InvalidRequest,
    LakeshoreError,
    MethodNotAllowed,
    NotFound,
    Unauthorized,
    Unavailable,
)
from ..metrics import Event, Registry
from ..plane.blobs import BlobUpload
from ..wire import is_digest
from . import apigw

__all__ = [
    "ROUTES",
    "Upload",
    "carry_path",
    "download_path",
    "fast_path",
    "handler",
    "make_app",
    "upload_path",
]


#: every route: (method, path template); the OpenAPI document must list exactly these
ROUTES: list[tuple[str, str]] = []
_FAST = "_lakeshore_resolve_fast"
_UPLOAD = "_lakeshore_upload"
_DOWNLOAD = "_lakeshore_download"
_CARRY = "_lakeshore_carry"


def fast_path(app: Any) -> Callable[[dict[str, Any]], dict[str, Any] | None] | None:
    """The fast answer of the routes without path parameters of an app made by
    :func:`make_app` (``lakeshore serve`` tries it first; see ``resolve_fast`` there)."""
    found = getattr(app, "__dict__", {}).get(_FAST)
    return found if callable(found) else None


def download_path(app: Any) -> Callable[[dict[str, Any]], str | dict[str, Any] | None] | None:
    """The streamed blob download of an app made by :func:`make_app` (``lakeshore serve``
    sends a blob's file in pieces; see ``download_start``)."""
    found = getattr(app, "__dict__", {}).get(_DOWNLOAD)
    return found if callable(found) else None


def carry_path(app: Any) -> Callable[[dict[str, Any]], dict[str, Any] | None] | None:
    """The first half of a submit carrying blobs, of an app made by :func:`make_app`
    (``lakeshore serve`` stores them on a request thread, then submits the rest on its
    event loop; see ``carry`` there)."""
    found = getattr(app, "__dict__", {}).get(_CARRY)
    return found if callable(found) else None


def upload_path(app: Any) -> Callable[[dict[str, Any]], Upload | dict[str, Any]] | None:
    """The streamed blob upload of an app made by :func:`make_app` (``lakeshore serve``
    hands it ``PUT /v1/blobs/{digest}`` before reading the body; see ``upload_start``)."""
    found = getattr(app, "__dict__", {}).get(_UPLOAD)
    return found if callable(found) else None


def _unstored(exc: OSError) -> Unavailable:
    """A blob the plane's disk refused (a 503: retry, perhaps elsewhere)."""
    return Unavailable(f"the plane could not store the blob: {exc.strerror or exc}")


class Upload:
    """A blob upload under way: :meth:`write` each piece of the body, then :meth:`end`.
    Each answers None to go on, or the request's answer (a refusal; the upload is then
    dropped), as the ``PUT`` route would have answered it."""

    def __init__(self, upload: BlobUpload, media: str) -> None:
        self._upload = upload
        self._media = media

    def write(self, data: bytes) -> dict[str, Any] | None:
        return self._step(lambda: self._upload.write(data))

    def end(self) -> dict[str, Any]:
        return self._step(self._upload.finish) or _fast_result(_answer(204, None, self._media))

    def _step(self, step: Callable[[], None]) -> dict[str, Any] | None:
        """None once ``step`` has run; else the answer that refuses the upload (a full
        disk, say, drops what was written)."""
        try:
            step()
        except LakeshoreError as exc:
            return _fast_result(_error_response(exc, self._media))
        except OSError as exc:
            self._upload.abort()
            return _fast_result(_error_response(_unstored(exc), self._media))
        return None

    def abort(self) -> None:
        """The client went away: nothing is kept."""
        self._upload.abort()


def _answer(status: int, value: dict[str, Any] | None, media: str) -> Response[Any]:
    if value is None:
        return Response(status_code=status, content_type=media, body="")
    data = encode_body(value, media)
    # Powertools re-serialises a JSON body that is not text; msgpack goes out as bytes.
    return Response(
        status_code=status, content_type=media, body=data.decode() if media == JSON else data
    )


def _fast_result(response: Response[Any]) -> dict[str, Any]:
    """A response as the resolver's result, its bytes body kept as it is (a view, which
    :func:`apigw.http_response` sends without a copy)."""
    body = response.body
    if isinstance(body, bytes):
        body = memoryview(body)
    return {
        "statusCode": response.status_code,
        "body": body if body is not None else "",
        "isBase64Encoded": False,
        "headers": dict(response.headers),
        "cookies": [],
    }


def _error_response(exc: LakeshoreError, media: str) -> Response[Any]:
    body = {"error": {"code": exc.code, "message": reason(exc)}}
    resp = _answer(exc.status if exc.status >= 400 else 500, body, media)
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        resp.headers["Retry-After"] = str(int(retry_after))
    return resp


def make_app(service: Service, *, logger: logging.Logger | None = None) -> APIGatewayHttpResolver:
    """The router of API v1 over ``service``; unexpected errors go to ``logger``."""
    app = APIGatewayHttpResolver()
    log = logger or logging.getLogger("dreamlake.lakeshore.api")
    limits = service.limits

    def media() -> str:
        event = app.current_event.raw_event
        return pick_type(apigw.header(event, "content-type"), apigw.header(event, "accept"))

    def body() -> dict[str, Any]:
        event = app.current_event.raw_event
        return decode_body(
            apigw.request_body(event), apigw.header(event, "content-type"), limits.max_body
        )

    def bodiless(
        fn: Callable[[Identity, str], dict[str, Any]],
    ) -> Callable[[Identity, str], dict[str, Any]]:
        """``fn`` for a POST that takes no body: one with fields is refused (an empty
        map is what clients send by habit: taken), as an unknown field anywhere is."""

        def checked(ident: Identity, id: str) -> dict[str, Any]:
            if apigw.request_body(app.current_event.raw_event):
                given = body()
                if given:
                    names = ", ".join(sorted(str(k) for k in given)[:5])
                    raise InvalidRequest(f"this route takes no body (given: {names})")
            return fn(ident, id)

        return checked

    def caller() -> Identity:
        return authenticate(
            service.plane, apigw.header(app.current_event.raw_event, "authorization")
        )

    def query() -> dict[str, str]:
        return apigw.query(app.current_event.raw_event)

    def raw_bytes(app: APIGatewayHttpResolver, next_middleware: NextMiddleware) -> Response[Any]:
        """On ``lakeshore serve`` a bytes answer goes out as it is: no base64 both ways,
        and no copy (a view of the bytes, which :func:`apigw.http_response` unwraps)."""
        response: Response[Any] = next_middleware(app)
        if isinstance(response.body, bytes) and apigw.raw_bodies(app.current_event.raw_event):
            response.body = memoryview(response.body)
        return response

    app.use(middlewares=[raw_bytes])
    #: the routes without path parameters, by method and path (see resolve_fast)
    fixed: dict[tuple[str, str], Callable[[], Response[Any]]] = {}

    def route(method: str, path: str) -> Callable[[Callable[..., dict[str, Any]]], Any]:
        """Register ``fn(ident, **path_params) -> answer`` at ``method path``."""
        ROUTES.append((method, path)) if (method, path) not in ROUTES else None
        powertools_path = re.sub(r"\{(\w+)\}", r"<\1>", path)

        def register(fn: Callable[..., dict[str, Any]]) -> Any:
            def endpoint(**params: str) -> Response[Any]:
                return _answer(200, fn(caller(), **params), media())

            endpoint.__name__ = fn.__name__
            if "{" not in path:
                fixed[(method, path)] = endpoint
            return app.route(powertools_path, method=[method])(endpoint)

        return register

    changes = service.plane.changes

    def as_http(
        value_of: Callable[[list[Any]], dict[str, Any]],
    ) -> Callable[[list[Any]], dict[str, Any]]:
        """A parked wait's answer from its records, made as this request's would be (its
        media type read now, while the request is the current event)."""
        kind = media()
        return lambda recs: _fast_result(_answer(200, value_of(recs), kind))

    def resolve_fast(event: dict[str, Any]) -> dict[str, Any] | None:
        """Answer a request for a route without path parameters (submits, claims,
        completions, waits...) with the same endpoint, error answers and response as
        through the router, without the router's matching, middleware frames and
        response builder (~40 us a request); None for any other request. For
        ``lakeshore serve``, whose events keep bodies as bytes."""
        endpoint = fixed.get((event["requestContext"]["http"]["method"], event["rawPath"]))
        if endpoint is None:
            return None
        app.current_event = app._to_proxy_event(event)  # type: ignore[assignment]
        try:
            try:
                response = endpoint()
                if changes.parks:  # a parked wait's later answer goes out as this one would
                    changes.then(as_http)
            except LakeshoreError as exc:
                response = lakeshore_error(exc)
            except Exception as exc:
                response = unexpected(exc)
        finally:
            app.current_event = None  # type: ignore[assignment]
        return _fast_result(response)

    app.__dict__[_FAST] = resolve_fast

    def carry(event: dict[str, Any]) -> dict[str, Any] | None:
        """For ``lakeshore serve``: a msgpack submit (``POST /v1/invocations``) that
        carries blobs, checked and its blobs stored (``Service.carry``); the event of
        the rest, to resolve as a submit without them. None, having done nothing, for
        any other request and for one refused (resolved whole, it is answered why)."""
        http = event["requestContext"]["http"]
        if (http["method"], event["rawPath"]) != ("POST", "/v1/invocations"):
            return None
        if not is_msgpack(apigw.header(event, "content-type")):
            return None
        app.current_event = app._to_proxy_event(event)  # type: ignore[assignment]
        try:
            rest = service.carry(caller(), body())
        except LakeshoreError:
            return None
        except Exception:  # (resolved whole, it is answered; but this is a bug)
            log.exception("unhandled error storing a submit's blobs")
            return None
        finally:
            app.current_event = None  # type: ignore[assignment]
        if rest is None:
            return None
        data = encode_body(rest, MSGPACK)
        headers = {**event["headers"], "content-length": str(len(data))}
        return {**event, "headers": headers, "body": data}

    app.__dict__[_CARRY] = carry

    # --- hello and queues ----------------------------------------------------------
    route("GET", "/v1/hello")(lambda ident: service.hello(ident))
    route("POST", "/v1/queues")(lambda ident: service.create_queue(ident, body()))
    route("GET", "/v1/queues")(lambda ident: service.list_queues(ident))
    route("POST", "/v1/queues/prune")(lambda ident: service.prune_queues(ident, body()))
    route("GET", "/v1/queues/{name}")(lambda ident, name: service.get_queue(ident, name))
    route("PATCH", "/v1/queues/{name}")(
        lambda ident, name: service.update_queue(ident, name, body())
    )

    @route("DELETE", "/v1/queues/{name}")
    def delete_queue(ident: Identity, name: str) -> dict[str, Any]:
        force = query().get("force", "false").lower()
        if force not in ("true", "false", "1", "0"):
            raise InvalidRequest("force must be true or false")
        return service.delete_queue(ident, name, force in ("true", "1"))

    # --- invocations -------------------------------------------------------------------
    route("POST", "/v1/invocations")(lambda ident: service.submit(ident, body()))
    route("GET", "/v1/invocations")(lambda ident: service.list_invocations(ident, query()))
    route("POST", "/v1/invocations/wait")(lambda ident: service.wait(ident, body()))
    route("GET", "/v1/invocations/{id}")(lambda ident, id: service.get_invocation(ident, id))
    route("PATCH", "/v1/invocations/{id}")(
        lambda ident, id: service.update_invocation(ident, id, body())
    )
    route("POST", "/v1/invocations/{id}/cancel")(bodiless(service.cancel))
    route("POST", "/v1/invocations/{id}/retry")(bodiless(service.retry))
    route("GET", "/v1/invocations/{id}/logs")(
        lambda ident, id: service.read_logs(ident, id, query())
    )

    # --- workers -------------------------------------------------------------------------
    route("POST", "/v1/claims")(lambda ident: service.claim(ident, body()))
    route("POST", "/v1/heartbeats")(lambda ident: service.heartbeat(ident, body()))
    route("POST", "/v1/completions")(lambda ident: service.complete(ident, body()))
    route("POST", "/v1/failures")(lambda ident: service.fail(ident, body()))
    route("POST", "/v1/releases")(lambda ident: service.release(ident, body()))
    route("POST", "/v1/logs")(lambda ident: service.append_logs(ident, body()))
    route("POST", "/v1/progress")(lambda ident: service.report_progress(ident, body()))

    # --- blobs: a bearer token, or a signed URL ------------------------------------------
    route("POST", "/v1/blobs/missing")(lambda ident: service.missing_blobs(ident, body()))

    def blob_access(method: str, digest: str) -> None:
        if not is_digest(digest):
            raise InvalidRequest("a blob is named by its sha256 (64 lower-case hex digits)")
        if service.check_signature(method, digest, query()):
            return
        if "sig" in query():
            raise Unauthorized("the signed URL is wrong or has expired")
        caller().require("producer", "worker")

    def put_blob(digest: str) -> Response[Any]:
        blob_access("PUT", digest)
        data = apigw.request_body(app.current_event.raw_event)
        service.put_blob(digest, data)
        return _answer(204, None, media())

    def get_blob(digest: str) -> Response[Any]:
        blob_access("GET", digest)
        return Response(200, "application/octet-stream", service.get_blob(digest))

    def blob_transfer(
        method: str, then: Callable[[str, str], Any]
    ) -> Callable[[dict[str, Any]], Any]:
        """For ``lakeshore serve``: a blob ``PUT`` or ``GET`` checked as its route
        checks it (digest, token or signed URL) before any body moves, then
        ``then(digest, media type)``; or the answer that refuses it."""

        def start(event: dict[str, Any]) -> Any:
            app.current_event = app._to_proxy_event(event)  # type: ignore[assignment]
            kind = JSON
            try:
                kind = media()
                digest = event["rawPath"].rsplit("/", 1)[-1]
                blob_access(method, digest)
                return then(digest, kind)
            except LakeshoreError as exc:
                return _fast_result(_error_response(exc, kind))
            except OSError as exc:  # (the blob's file could not be made: a full disk)
                return _fast_result(_error_response(_unstored(exc), kind))
            except Exception as exc:
                return _fast_result(unexpected(exc))
            finally:
                app.current_event = None  # type: ignore[assignment]

        return start

    def upload(digest: str, kind: str) -> Upload:
        """A ``PUT``'s body streamed into the plane piece by piece (a declared length
        over the limit refused before any of it is read)."""
        declared = apigw.header(app.current_event.raw_event, "content-length")
        size = int(declared) if declared is not None and declared.isdigit() else None
        return Upload(service.upload_blob(digest, size), kind)

    # a GET: the path of the blob's file for the server to send in pieces, or None to
    # let the route answer it (a blob kept in the database, or none)
    app.__dict__[_UPLOAD] = blob_transfer("PUT", upload)
    app.__dict__[_DOWNLOAD] = blob_transfer("GET", lambda digest, _: service.blob_file(digest))

    for method, fn in (("PUT", put_blob), ("GET", get_blob)):
        ROUTES.append((method, "/v1/blobs/{digest}")) if (
            method,
            "/v1/blobs/{digest}",
        ) not in ROUTES else None
        app.route("/v1/blobs/<digest>", method=[method])(fn)

    @route("GET", "/v1/blobs/{digest}/url")
    def blob_url(ident: Identity, digest: str) -> dict[str, Any]:
        if not is_digest(digest):
            raise InvalidRequest("a blob is named by its sha256 (64 lower-case hex digits)")
        return service.blob_url(ident, digest)

    # --- data keys -------------------------------------------------------------------------
    route("POST", "/v1/data")(lambda ident: service.put_data(ident, body()))
    route("POST", "/v1/data/lookup")(lambda ident: service.data_lookup(ident, body()))

    # --- daemons ---------------------------------------------------------------------------
    route("POST", "/v1/daemons")(lambda ident: service.register_daemon(ident, body()))
    route("GET", "/v1/daemons")(lambda ident: service.list_daemons(ident))
    route("POST", "/v1/daemons/{id}/heartbeat")(
        lambda ident, id: service.daemon_heartbeat(ident, id, body())
    )
    route("PATCH", "/v1/daemons/{id}")(lambda ident, id: service.update_daemon(ident, id, body()))
    route("POST", "/v1/daemons/{id}/drain")(bodiless(service.drain_daemon))
    route("DELETE", "/v1/daemons/{id}")(lambda ident, id: service.remove_daemon(ident, id))

    # --- tokens -------------------------------------------------------------------------------
    route("POST", "/v1/tokens")(lambda ident: service.create_token(ident, body()))
    route("GET", "/v1/tokens")(lambda ident: service.list_tokens(ident))
    route("DELETE", "/v1/tokens/{id}")(lambda ident, id: service.revoke_token(ident, id))

    # --- statistics, metrics and the dashboard ------------------------------------------------
    route("GET", "/v1/stats")(lambda ident: service.stats(ident, query()))

    def plain(method: str, path: str, fn: Callable[..., Response[Any]]) -> None:
        """Register a route that answers for itself (no v1 body codec)."""
        ROUTES.append((method, path)) if (method, path) not in ROUTES else None
        app.route(re.sub(r"\{(\w+)\}", r"<\1>", path), method=[method])(fn)

    def prometheus() -> Response[Any]:
        text = service.metrics_text(caller())
        return Response(200, "text/plain; version=0.0.4; charset=utf-8", text)

    def static(asset: str) -> Response[Any]:
        found = dashboard_file(asset)
        if found is None:
            raise NotFound(f"no dashboard file {asset!r}")
        headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
        return Response(200, found[0], found[1], headers=headers)

    plain("GET", "/metrics", prometheus)
    plain("GET", "/", lambda: Response(302, "text/plain", "", headers={"Location": "/ui/"}))
    plain("GET", "/ui/", lambda: static(asset="index.html"))
    plain("GET", "/ui/{asset}", static)

    # --- errors ----------------------------------------------------------------------------------
    templates = [
        (m, re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(p)) + "$"))
        for m, p in ROUTES
    ]

    @app.not_found
    def not_found(_: Exception) -> Response[Any]:
        path = app.current_event.raw_event.get("rawPath", "")
        method = app.current_event.http_method
        # a path the method has a route for, with a parameter the router would not take
        # (a dashboard file name with odd characters): no such resource, not a bad method
        known = [m for m, rx in templates if rx.match(path)]
        if known and method not in known:
            return _error_response(
                MethodNotAllowed(f"{app.current_event.http_method} is not allowed on {path}"),
                media(),
            )
        return _error_response(NotFound(f"no route {path}"), media())

    @app.exception_handler(LakeshoreError)  # type: ignore[untyped-decorator]
    def lakeshore_error(exc: LakeshoreError) -> Response[Any]:
        return _error_response(exc, media())

    @app.exception_handler(Exception)  # type: ignore[untyped-decorator]
    def unexpected(exc: Exception) -> Response[Any]:
        log.exception("unexpected error answering %s", app.current_event.raw_event.get("rawPath"))
        body = {"error": {"code": "error", "message": "internal error"}}
        return _answer(500, body, JSON)

    return app


_lambda_app: APIGatewayHttpResolver | None = None


def _service_from_env() -> Service:
    """The Service the environment names: the AWS stack's tables and bucket (the
    ``keys.ENV_VARS`` template.yaml sets; see handlers/aws.py), else ``LAKESHORE_PLANE``,
    a plane file (a SQLite store on a mounted volume). ``LAKESHORE_MAX_WAIT`` caps
    claim and result waits on either."""
    import os

    from . import aws

    target = os.environ.get("LAKESHORE_PLANE")
    if aws.names_tables():
        if target:
            raise RuntimeError("set the stack's table names or LAKESHORE_PLANE, not both")
        return aws.service_from_env()

    from ..plane import Plane
    from ..stores import SqliteStore

    if not target:
        raise RuntimeError(
            "set LAKESHORE_PLANE to the plane this function serves "
            "(a deployed template.yaml names its tables instead)"
        )
    return Service(
        Plane(SqliteStore(target)), limits=aws.limits_from_env(), server="lakeshore lambda"
    )


_metrics: Any = None
_registry: Registry | None = None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point: resolve the event, emit request metrics (CloudWatch EMF)."""
    global _lambda_app, _metrics, _registry
    if _lambda_app is None:
        from aws_lambda_powertools import Logger, Metrics

        _metrics = Metrics(namespace="Lakeshore", service="api")
        logger = Logger(service="lakeshore-api")  # structured JSON logs in CloudWatch
        logs.configure(
            logs.CurrentStream("stdout")
        )  # the service's events, JSON lines like powertools'
        service = _service_from_env()
        service.metrics = _registry = Registry(keep_events=True)
        _lambda_app = make_app(service, logger=logger)  # type: ignore[arg-type]
    result: dict[str, Any] = _lambda_app.resolve(event, context)
    status = int(result.get("statusCode", 500))
    _metrics.add_metric(name="Requests", unit="Count", value=1)
    if status >= 400:
        _metrics.add_metric(
            name="ClientErrors" if status < 500 else "ServerErrors", unit="Count", value=1
        )
    _metrics.flush_metrics()
    assert _registry is not None
    write_emf(_registry.drain())
    return result


def write_emf(events: list[Event], namespace: str = "Lakeshore") -> None:
    """Print ``events`` as CloudWatch EMF: one document per dimension (a queue or a
    worker), each metric with every value observed (histograms keep their values)."""
    from aws_lambda_powertools.metrics import EphemeralMetrics

    by_dimension: dict[tuple[str, str], list[Event]] = {}
    for e in events:
        by_dimension.setdefault(e.dimension, []).append(e)
    for (key, value), group in by_dimension.items():
        emf = EphemeralMetrics(namespace=namespace, service="api")
        emf.add_dimension(name=key, value=value)
        for e in group:
            emf.add_metric(name=e.name, unit=e.unit, value=e.value)
        emf.flush_metrics()
