"""One error body for every 4xx/5xx: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

from typing import Any

import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import (
    HTTPException,
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
    SerializationException,
    ValidationException,
)
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR, HTTP_503_SERVICE_UNAVAILABLE
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

log = structlog.get_logger(__name__)

RETRY_AFTER_S = "2"


class ApiError(HTTPException):
    """An error with a stable machine-readable `code`, raised by domain code."""

    status_code = 400
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status_code: int | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail=message, status_code=status_code or self.status_code, headers=headers)
        self.code = code or self.code
        self.details = details or {}


class NotFoundError(ApiError):
    status_code = 404
    code = "not_found"


class ConflictError(ApiError):
    status_code = 409
    code = "conflict"


_CODE_BY_STATUS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    503: "unavailable",
}


def is_db_outage(exc: BaseException) -> bool:
    """A fault of the database connection (unreachable, dropped, pool exhausted), not of the statement:
    retrying the same work later can succeed, and splitting it up cannot help."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | InterfaceError | PoolTimeoutError | OSError)


def data_error(exc: BaseException) -> ApiError | None:
    """A statement refused for a value the client sent (Postgres's data exceptions, SQLSTATE class 22,
    or text the driver cannot encode) is the client's fault: a 422, not a 500. The edge refuses such
    input first (`app.server.middleware.RequestInputGuard`); this is the wall behind it."""
    sqlstate = str(getattr(getattr(exc, "orig", None), "sqlstate", None) or "")
    if isinstance(exc, UnicodeError) or (isinstance(exc, DBAPIError) and sqlstate.startswith("22")):
        return ApiError(
            "The request holds a value that cannot be stored.",
            code="validation_error",
            status_code=422,
            details={"reason": type(getattr(exc, "orig", None) or exc).__name__},
        )
    return None


def error_response(
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Response[dict[str, Any]]:
    """The api.md error body."""
    return Response(
        {"error": {"code": code, "message": message, "details": details or {}}},
        status_code=status,
        media_type=MediaType.JSON,
        headers=headers,
    )


def _validation_details(exc: ValidationException) -> dict[str, Any]:
    extra = exc.extra
    if isinstance(extra, list):
        return {"fields": extra}
    if isinstance(extra, dict):
        return extra
    return {}


def http_exception_handler(_: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
    """Litestar's own exceptions and ours, mapped to the shared body."""
    headers = dict(exc.headers or {})
    if isinstance(exc, ApiError):
        return error_response(exc.status_code, exc.code, exc.detail, exc.details, headers)
    if isinstance(exc.__cause__, SerializationException):
        # Litestar turns an undecodable body into a 400 ClientException caused by this.
        return error_response(
            400, "invalid_json", f"The request body is not valid JSON: {exc.detail}.", {}, headers
        )
    if isinstance(exc, ValidationException):
        return error_response(
            422,
            "validation_error",
            "The request does not match the schema.",
            _validation_details(exc),
            headers,
        )
    status = exc.status_code
    message = exc.detail
    if isinstance(exc, NotAuthorizedException):
        message = exc.detail or "A valid API key is required."
    elif isinstance(exc, PermissionDeniedException):
        message = exc.detail or "This API key lacks the role this route needs."
    elif isinstance(exc, NotFoundException):
        message = "Not found."
    return error_response(status, _CODE_BY_STATUS.get(status, "error"), message, {}, headers)


def database_unavailable_handler(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """Postgres unreachable: tell the client to retry instead of failing with a bare 500."""
    if not is_db_outage(exc):  # a statement's own error (a constraint, a data error): not an outage
        return internal_error_handler(_, exc)
    log.warning("db.unavailable", error=type(exc).__name__)
    return error_response(
        HTTP_503_SERVICE_UNAVAILABLE,
        "unavailable",
        "The database is unavailable; retry shortly.",
        headers={"Retry-After": RETRY_AFTER_S},
    )


def internal_error_handler(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """Anything unexpected: logged with its traceback, answered without internals."""
    if isinstance(exc, OSError | PoolTimeoutError):
        return database_unavailable_handler(_, exc)
    client_error = data_error(exc)
    if client_error is not None:
        log.warning("http.data_error", error=type(exc).__name__)
        return http_exception_handler(_, client_error)
    log.exception("http.unhandled_error", error=type(exc).__name__)
    return error_response(HTTP_500_INTERNAL_SERVER_ERROR, "internal_error", "An internal error occurred.")


EXCEPTION_HANDLERS: dict[type[Exception] | int, Any] = {
    HTTPException: http_exception_handler,
    DBAPIError: database_unavailable_handler,
    PoolTimeoutError: database_unavailable_handler,
    OSError: database_unavailable_handler,
    Exception: internal_error_handler,
}
