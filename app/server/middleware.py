"""Request context: a request id on every log line and response, and one access-log event per request.

The id is bound by a middleware (so every log line of the request carries it) and written to the
response, together with the access-log event, by a `before_send` hook, which also sees responses that
Litestar builds from exceptions raised in other middleware (a 401 from authentication, say).
"""

from __future__ import annotations

import re
import time
import uuid

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.lib import metrics

log = structlog.get_logger("app.http")

_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")


def request_context_middleware(app: ASGIApp) -> ASGIApp:
    """Bind `request_id` (the caller's `X-Request-ID` if sane, else a new one) for the whole request."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        incoming = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        request_id = incoming if _SAFE_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["request_started"] = time.perf_counter()
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            await app(scope, receive, send)

    return middleware


async def stamp_response(message: Message, scope: Scope) -> None:
    """`before_send` hook: add `X-Request-ID` and log the request once its status is known."""
    if message["type"] != "http.response.start" or scope["type"] != ScopeType.HTTP:
        return
    state = scope.get("state", {})
    request_id = state.get("request_id")
    if request_id is None:
        return
    message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
    started = state.get("request_started", time.perf_counter())
    elapsed = time.perf_counter() - started
    # The route template ("/v1/chunks/{chunk_id:uuid}"), not the path, keeps label values few.
    route = str(scope.get("path_template") or "unmatched")
    method = str(scope.get("method"))
    metrics.HTTP_REQUESTS.labels(method, route, str(message["status"])).inc()
    metrics.HTTP_LATENCY.labels(method, route).observe(elapsed)
    log.info(
        "http.request",
        request_id=request_id,
        method=scope.get("method"),
        path=scope["path"],
        status=message["status"],
        duration_ms=round(elapsed * 1000, 2),
    )
