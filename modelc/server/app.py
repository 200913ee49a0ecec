"""The Quart-trio application factory.

:func:`create_app` wires the per-app context (state, metrics, rate limiter), the
request hooks (request id, API key, rate limit, access log, per-endpoint metrics),
the single error handler that turns every exception into an OpenAI error object
(:func:`modelc.server.errors.to_error`), and the route blueprints.  Quart's response
timeout is off, so long streams are never cut.
"""

from __future__ import annotations

import time
import uuid
from importlib import resources
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from quart_trio.wrappers import TrioRequest

from modelc.engine.api import EngineStats
from modelc.server import auth, cors
from modelc.server.context import ACCESS, AppContext, ctx
from modelc.server.errors import error_shape, to_error
from modelc.server.logging import AccessRecord, logger
from modelc.server.metrics import CONTENT_TYPE, Metrics
from modelc.server.state import ServerState

MAX_BODY = 8 * 1024 * 1024
STATIC_TYPES = {
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "txt": "text/plain; charset=utf-8",
    "svg": "image/svg+xml",
    "png": "image/png",
}

UNBOUNDED = "/api/blobs/"  # pushed model files: streamed to disk and hashed, any size


class _Request(TrioRequest):
    """Quart's request, without the body limit on the routes that stream a body to disk."""

    def __init__(
        self,
        method: str,
        scheme: str,
        path: str,
        *args: Any,
        max_content_length: int | None = None,
        **kwargs: Any,
    ) -> None:
        if path.startswith(UNBOUNDED):
            max_content_length = None
        super().__init__(
            method, scheme, path, *args, max_content_length=max_content_length, **kwargs
        )


def create_app(state: ServerState) -> QuartTrio:
    from modelc.server.anthropic import routes as anthropic_routes
    from modelc.server.llamacpp import routes as llamacpp_routes
    from modelc.server.native import routes as native_routes
    from modelc.server.ollama import routes as ollama_routes
    from modelc.server.ollama import routes_create as ollama_create_routes
    from modelc.server.ollama import routes_models as ollama_models_routes
    from modelc.server.openai import routes as openai_routes
    from modelc.server.openapi import openapi_document
    from modelc.server.responses import routes as responses_routes

    app = QuartTrio("modelc.server", static_folder=None)  # "/static/..." is _static below
    app.request_class = _Request
    app.config.update(
        RESPONSE_TIMEOUT=None,  # streams may run as long as generation does
        BODY_TIMEOUT=60,
        MAX_CONTENT_LENGTH=MAX_BODY,
        PROVIDE_AUTOMATIC_OPTIONS=True,
    )

    def stats() -> list[tuple[str, EngineStats]]:  # every loaded model's engine
        return [(s.name, s.engine.stats()) for s in state.models.loaded() if s.engine]

    metrics = Metrics(stats)
    app.extensions["modelc"] = AppContext(state, metrics, auth.RateLimiter(state.rate_limit))

    @app.before_request
    async def _before() -> None:
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        client = request.remote_addr or "?"
        ACCESS.set(
            AccessRecord(rid[:64], request.method, request.path, client, time.perf_counter())
        )
        if (
            request.path in auth.EXEMPT
            or request.path.startswith("/static/")  # the chat page's files, as "/"
            or request.method == "OPTIONS"
        ):
            return
        c = ctx()
        auth.check_api_key(
            c.state.api_key, request.headers.get("Authorization"), request.headers.get("X-Api-Key")
        )
        c.limiter.check(client)

    @app.after_request
    async def _after(resp: Response) -> Response:
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        ctx().metrics.requests.labels(endpoint=rule, status=str(resp.status_code)).inc()
        resp.headers.update(
            cors.headers(
                ctx().state.cors_origins,
                request.headers.get("Origin"),
                request.method,
                request.headers.get("Access-Control-Request-Method"),
                request.headers.get("Access-Control-Request-Headers"),
            )
        )
        rec = ACCESS.get(None)
        if rec is not None:
            resp.headers["X-Request-Id"] = rec.request_id
            if not rec.streaming:
                rec.write(resp.status_code, time.perf_counter())
        return resp

    @app.errorhandler(Exception)
    async def _error(exc: Exception) -> Response:
        status, payload, headers = to_error(exc, shape=error_shape(request.path))
        if status >= 500:
            logger().error(
                "handler_error", path=request.path, error=repr(exc), exc_info=status == 500
            )
        return Response(payload, status=status, headers=headers, content_type="application/json")

    @app.get("/metrics")
    async def _metrics() -> Response:
        return Response(ctx().metrics.render(), content_type=CONTENT_TYPE)

    @app.get("/")
    async def _index() -> Response:
        page = resources.files("modelc.server").joinpath("static/chat.html").read_bytes()
        return Response(
            page, content_type="text/html; charset=utf-8", headers={"Cache-Control": "no-cache"}
        )

    @app.get("/static/<path:name>")
    async def _static(name: str) -> Response:
        # the chat page's modules, styles and vendored libraries (files only, no "..")
        kind = STATIC_TYPES.get(name.rsplit(".", 1)[-1])
        path = resources.files("modelc.server").joinpath("static")
        for part in name.split("/"):
            if part in ("", ".", "..") or part.startswith("."):
                kind = None
                break
            path = path.joinpath(part)
        if kind is None or not path.is_file():
            return Response(b"not found", status=404, content_type="text/plain")
        # vendored files are pinned by version (immutable for a day); the page's own: revalidate
        cache = "public, max-age=86400" if name.startswith("vendor/") else "no-cache"
        return Response(path.read_bytes(), content_type=kind, headers={"Cache-Control": cache})

    doc = openapi_document()

    @app.get("/openapi.json")
    async def _openapi() -> Response:
        return Response(doc, content_type="application/json")

    for routes in (
        openai_routes,
        native_routes,
        llamacpp_routes,
        ollama_routes,
        ollama_models_routes,
        ollama_create_routes,
        anthropic_routes,
        responses_routes,
    ):
        app.register_blueprint(routes.bp)
    return app
