"""Request context: a request id on every log line and response, and one access-log event per request.

The id is bound by a middleware (so every log line of the request carries it) and written to the
response, together with the access-log event, by a `before_send` hook, which also sees responses that
Litestar builds from exceptions raised in other middleware (a 401 from authentication, say).
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

import msgspec
import structlog
from litestar import Litestar
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.routes import HTTPRoute
from litestar.types import (
    ASGIApp,
    HTTPRequestEvent,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    Message,
    Receive,
    ReceiveMessage,
    Scope,
    Send,
)

from app.db.tenancy import tenant_scope
from app.lib import metrics
from app.lib.ratelimit import Limit, RateLimiter
from app.lib.validation import first_unstorable, json_depth_exceeds, unstorable_reason
from app.server.lifespan import app_services

log = structlog.get_logger("app.http")

_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")


def request_context_middleware(app: ASGIApp) -> ASGIApp:
    """Bind `request_id` (the caller's `X-Request-ID` if sane, else a new one) for the whole request, and
    start it with no tenant."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        incoming = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        request_id = incoming if _SAFE_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["request_started"] = time.perf_counter()
        # No tenant until the key is resolved (`ApiKeyAuthenticationMiddleware`): a public route, or a
        # request refused, reads no tenant's rows, whatever ran before in this task.
        with structlog.contextvars.bound_contextvars(request_id=request_id), tenant_scope(()):
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
    metrics.http_request(method, route, message["status"], elapsed)
    log.info(
        "http.request",
        request_id=request_id,
        method=scope.get("method"),
        path=scope["path"],
        status=message["status"],
        duration_ms=round(elapsed * 1000, 2),
    )


def allow_every_method(allowed: dict[str, bytes]) -> Callable[[Message, Scope], Awaitable[None]]:
    """`before_send` hook: an OPTIONS answer's `Allow` lists every method of its path (`allowed`, by
    route template). Litestar's automatic OPTIONS handler keeps the methods of the first handler
    registered on a path, so `OPTIONS /v1/memories/{id}` would not name PATCH."""

    async def hook(message: Message, scope: Scope) -> None:
        if message["type"] != "http.response.start" or scope.get("method") != "OPTIONS":
            return
        methods = allowed.get(str(scope.get("path_template")))
        if methods is not None:
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
            message["headers"] = [*headers, (b"allow", methods)]

    return hook


def methods_by_route(app: Litestar) -> dict[str, bytes]:
    """Each route template's methods, as an `Allow` header says them."""
    return {
        route.path_format: ", ".join(sorted(route.methods)).encode()
        for route in app.routes
        if isinstance(route, HTTPRoute)
    }


class RequestInputGuard(ASGIMiddleware):
    """Answer a body over the limit, or input Postgres cannot store, with a 4xx before any handler runs.

    The body is read here in full (and handed on unchanged), for two reasons:

    - A client that sends more than `max_body_bytes` must *see* the 413. Answering before the body is
      read and closing the connection resets it mid-upload, and clients such as Python's `requests`
      then report a connection error instead of the status. So an oversized body is read to its end
      and discarded (up to `drain_limit`; past that the connection is dropped as before).
    - A NUL character (`\\u0000`), or a lone surrogate, is valid JSON but cannot be stored by Postgres.
      Refused here with a 422 naming the field, it can neither fail a group commit shared with other
      clients' requests nor become a chunk that can never be applied. The same holds for the path and
      the query string (`/users/a%00b`, `?writer=%00`).

    The common case pays one regular-expression search over the body; only a body that holds such an
    escape is decoded to find the field.
    """

    scopes = (ScopeType.HTTP,)

    def __init__(self, max_body_bytes: int, drain_limit: int = 64 * 1024 * 1024) -> None:
        self.max_body_bytes = max_body_bytes
        self.drain_limit = max(drain_limit, max_body_bytes)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        declared = _content_length(scope)
        if declared is not None and declared > self.drain_limit:
            await _answer(send, 413, "payload_too_large", self._too_large(), close=True)
            return
        body, size = await self._read(receive)
        if size > self.max_body_bytes:
            await _answer(send, 413, "payload_too_large", self._too_large(), close=size > self.drain_limit)
            return
        problem = _unstorable_in_url(scope) or _unstorable_in_body(body)
        if problem is not None:
            where, why = problem
            await _answer(
                send,
                422,
                "validation_error",
                f"The field {where!r} {why}.",
                {"field": where, "reason": why},
            )
            return
        delivered = False

        async def replay() -> ReceiveMessage:
            nonlocal delivered
            if not delivered:
                delivered = True
                return HTTPRequestEvent(type="http.request", body=body, more_body=False)
            return await receive()  # what follows the body: a disconnect

        await next_app(scope, replay, send)

    def _too_large(self) -> str:
        return f"The request body is larger than {self.max_body_bytes} bytes."

    async def _read(self, receive: Receive) -> tuple[bytes, int]:
        """The body and its size; past the limit nothing is kept, past `drain_limit` nothing is read."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return b"", 0
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.drain_limit:
                return b"", size
            if size <= self.max_body_bytes:
                parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts), size


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _unstorable_in_url(scope: Scope) -> tuple[str, str] | None:
    reason = unstorable_reason(scope["path"])
    if reason is not None:
        return "path", reason
    query = scope.get("query_string", b"")
    if b"%00" in query or b"\x00" in query:
        for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            reason = unstorable_reason(name) or unstorable_reason(value)
            if reason is not None:
                return name, reason
    return None


# A JSON escape of a NUL, or of any surrogate (a paired one is an emoji and fine; msgspec refuses a
# lone one, and then the standard library's decoder, which keeps it, finds where it is).
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
# No request body nests deeper than this; past it, decoders run out of stack (a 500, not a 4xx).
MAX_BODY_DEPTH = 64
_NESTING_WORTH_A_LOOK = 256  # opening brackets in a body, before its depth is measured


def _unstorable_in_body(body: bytes) -> tuple[str, str] | None:
    suspect = _SUSPECT_ESCAPE.search(body) is not None
    if not suspect and body.count(b"[") + body.count(b"{") < _NESTING_WORTH_A_LOOK:
        return None
    try:
        decoded = msgspec.json.decode(body)
    except RecursionError:
        return "body", f"nests more than {MAX_BODY_DEPTH} levels deep"
    except msgspec.DecodeError:
        if not suspect:
            return None  # not JSON: the handler answers 400 invalid_json
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            return None
    if json_depth_exceeds(decoded, MAX_BODY_DEPTH):
        return "body", f"nests more than {MAX_BODY_DEPTH} levels deep"
    return first_unstorable(decoded) if suspect else None


class RateLimitGuard(ASGIMiddleware):
    """Answer a key over its request rate with 429 and `Retry-After`, before any handler runs (after
    authentication, which put the key's `Principal` in the scope; public routes have none)."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, default: Limit) -> None:
        self.default = default

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        principal = scope.get("user")
        if principal is not None:
            limiter: RateLimiter = app_services(scope["litestar_app"].state).rate_limiter
            limit = principal.rate_limit or self.default
            wait_s = await limiter.wait_s(str(principal.key_id), limit)
            if wait_s > 0:
                metrics.RATE_LIMITED.inc()
                retry = max(1, math.ceil(wait_s))
                await _answer(
                    send,
                    429,
                    "rate_limited",
                    f"This API key is over its limit of {limit.rate_per_s:g} requests a second "
                    f"(bursts of {limit.burst}); retry after {retry} s.",
                    {"rate_per_s": limit.rate_per_s, "burst": limit.burst},
                    headers=[(b"retry-after", str(retry).encode())],
                )
                return
        await next_app(scope, receive, send)


async def _answer(
    send: Send,
    status: int,
    code: str,
    message: str,
    details: dict[str, object] | None = None,
    *,
    close: bool = False,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = msgspec.json.encode({"error": {"code": code, "message": message, "details": details or {}}})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send(HTTPResponseStartEvent(type="http.response.start", status=status, headers=headers))
    await send(HTTPResponseBodyEvent(type="http.response.body", body=body, more_body=False))
