"""One error body for every 4xx/5xx: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

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
from litestar.openapi.datastructures import ResponseSpec
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR, HTTP_503_SERVICE_UNAVAILABLE
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

log = structlog.get_logger(__name__)

RETRY_AFTER_S = "2"


class ApiError(HTTPException):
    """An answer of the API's own: its status, a stable machine-readable `code`, and what it means
    (`description`, which the OpenAPI document shows). Every error the API answers is a subclass named
    once, below; a handler lists those it can raise (`error_responses`) and the document is built from
    that list."""

    status_code: int = 400
    code: ClassVar[str] = "bad_request"
    description: ClassVar[str] = "The request cannot be served as it is (`bad_request`)."
    retry_after_s: ClassVar[int | None] = None  # sent as Retry-After

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        wait = retry_after_s if retry_after_s is not None else self.retry_after_s
        headers = {"Retry-After": str(wait)} if wait is not None else None
        super().__init__(detail=message, status_code=type(self).status_code, headers=headers)
        self.details = details or {}


# --- 400 ------------------------------------------------------------------------------------------


class InvalidJson(ApiError):
    code = "invalid_json"
    description = "The body is not valid JSON (`invalid_json`)."


class InvalidFilters(ApiError):
    code = "invalid_filters"
    description = "A Mem0 filter Memstore cannot run (`invalid_filters`); `details.field` says which part."

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}", details={"field": where, "reason": reason})


class PurgeNotConfirmed(ApiError):
    code = "purge_not_confirmed"
    description = "Erasing a user is not confirmed with `?purge=true` (`purge_not_confirmed`)."


# --- 401, 403 -------------------------------------------------------------------------------------


class Unauthorized(ApiError):
    status_code = 401
    code = "unauthorized"
    description = "No API key, or an unknown or revoked one (`unauthorized`)."


class Forbidden(ApiError):
    status_code = 403
    code = "forbidden"
    description = "The API key lacks the role this route needs (`forbidden`)."


class DestructiveOpRefused(Forbidden):
    code = "destructive_op_refused"
    description = (
        "The tenant's destructive-ops policy does not let an agent's op of this kind through "
        "(`destructive_op_refused`); an admin may make the change."
    )


# --- 404 ------------------------------------------------------------------------------------------


class NotFoundError(ApiError):
    status_code = 404
    code = "not_found"
    description = "No such object in this tenant, or no such route (`not_found`)."


class BankNotFound(NotFoundError):
    code = "bank_not_found"
    description = "No shadow bank of the tenant has that name (`bank_not_found`)."


# --- 409 ------------------------------------------------------------------------------------------


class ConflictError(ApiError):
    """The request is valid but the state of what it names refuses it."""

    status_code = 409
    code = "conflict"
    description = "The request conflicts with the state of what it names (`conflict`)."


class IdempotencyConflict(ConflictError):
    code = "idempotency_conflict"
    description = "This Idempotency-Key was used with a different body (`idempotency_conflict`)."


class MemoryNotActive(ConflictError):
    code = "memory_not_active"
    description = "The memory is superseded or deleted (`memory_not_active`); an admin can roll it back."


class MemoryChanged(ConflictError):
    code = "memory_changed"
    description = (
        "A memory this names changed meanwhile, or kept changing while restored texts were embedded "
        "(`memory_changed`); read it again and retry."
    )


class AlreadyReverted(ConflictError):
    code = "already_reverted"
    description = "The changeset is already reverted (`already_reverted`)."


class RevertConflict(ConflictError):
    code = "revert_conflict"
    description = (
        "Later changes touched memories this would revert and `force` is not set (`revert_conflict`, "
        "listed in `details.conflicts`)."
    )


class ChunkNotFailed(ConflictError):
    code = "chunk_not_failed"
    description = "Only a failed chunk can be retried (`chunk_not_failed`)."


class ReviewDecided(ConflictError):
    code = "review_decided"
    description = "The review is already approved or rejected (`review_decided`)."


class KeyExists(ConflictError):
    code = "key_exists"
    description = "That key is already registered (`key_exists`)."


class KeyRevoked(ConflictError):
    code = "key_revoked"
    description = "A revoked key cannot be rotated (`key_revoked`); create a new key."


class TenantExists(ConflictError):
    code = "tenant_exists"
    description = "A tenant of that name exists (`tenant_exists`)."


class ImportConflict(ConflictError):
    code = "import_conflict"
    description = "The user already has other chunks with the numbers being imported (`import_conflict`)."


class BankConflict(ConflictError):
    code = "bank_conflict"
    description = "A bank of that name exists with another writer (`bank_conflict`)."


class EmbedderMismatch(ConflictError):
    code = "embedder_mismatch"
    description = (
        "The stored vectors come from another embedder than the configured one (`embedder_mismatch`); "
        "`memstore reembed` re-embeds them."
    )


# --- 413, 422, 429 --------------------------------------------------------------------------------


class PayloadTooLarge(ApiError):
    status_code = 413
    code = "payload_too_large"
    description = "The body is over the size limit (`payload_too_large`)."


class InvalidField(ApiError):
    status_code = 422
    code = "validation_error"
    description = (
        "A parameter or the body does not match the schema or a limit (`validation_error`); "
        "`details` names the field."
    )


class TooManyChangesets(ApiError):
    status_code = 422
    code = "too_many_changesets"
    description = "More changesets match than one revert takes (`too_many_changesets`); narrow it."


class AsOfTooBroad(ApiError):
    status_code = 422
    code = "as_of_too_broad"
    description = (
        "A search over all users as of a time would read more versions than it may "
        "(`as_of_too_broad`); search one user."
    )


class RateLimited(ApiError):
    status_code = 429
    code = "rate_limited"
    description = (
        "The API key is over its request rate, or the end user over its chunk rate (`rate_limited`; "
        "`details.scope` is `user` for the latter). Retry after `Retry-After` seconds."
    )
    retry_after_s = 1


class QueueFull(ApiError):
    status_code = 429
    code = "queue_full"
    description = (
        "Too many chunks of the user or the tenant wait to be applied (`queue_full`). "
        "Retry after `Retry-After` seconds."
    )
    retry_after_s = 5


# --- 501, 503 -------------------------------------------------------------------------------------


class ReaderNotConfigured(ApiError):
    status_code = 501
    code = "reader_not_configured"
    description = (
        "No read model is configured: MEMSTORE_READER_BASE_URL and MEMSTORE_READER_MODEL "
        "(`reader_not_configured`)."
    )


class Unavailable(ApiError):
    status_code = 503
    code = "unavailable"
    description = (
        "Postgres, Redis, the embedding model or the read model is unreachable, or the server is "
        "shutting down (`unavailable`). Retry after `Retry-After` seconds."
    )
    retry_after_s = 2


class Overloaded(ApiError):
    status_code = 503
    code = "overloaded"
    description = "Too many chunks wait to be stored (`overloaded`). Retry after `Retry-After` seconds."
    retry_after_s = 1


class ErrorSpec(ResponseSpec):
    """A route's documented error status: the errors of the catalogue it can answer with it."""

    def __init__(self, errors: Sequence[type[ApiError]]) -> None:
        super().__init__(
            data_container=None,
            generate_examples=False,
            description=" ".join(e.description for e in errors),
        )
        self.errors = tuple(errors)


def error_responses(*errors: type[ApiError]) -> dict[int, ResponseSpec]:
    """A handler's `responses=`: the errors it raises of its own accord, by status, each with what it
    means. (What every route answers — no key, a wrong role, a schema mismatch, an outage — the OpenAPI
    document adds from the route itself: `app.server.openapi`.)"""
    by_status: dict[int, list[type[ApiError]]] = {}
    for error in errors:
        by_status.setdefault(error.status_code, []).append(error)
    if 422 in by_status and InvalidField not in by_status[422]:
        by_status[422].insert(0, InvalidField)
    return {status: ErrorSpec(group) for status, group in sorted(by_status.items())}


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


# What a server that answered says when it cannot reach the rows for want of a server: a connection
# exception (class 08; a Citus coordinator that cannot reach the worker holding a shard: "connection to
# the remote node … failed"), or a server shutting down or starting up (57P01-57P03, a worker's passed on
# by the coordinator while the coordinator's connection stays open).
_NODE_OUTAGE_SQLSTATES = ("08", "57P01", "57P02", "57P03")
# Citus's word, as an internal error (XX000), for a worker lost in the middle of a transaction.
_NODE_LOST = "failure on connection marked as essential"


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(getattr(exc, "orig", None), "sqlstate", None) or "")


def is_db_outage(exc: BaseException) -> bool:
    """A fault of the database connection (unreachable, dropped, pool exhausted), or of a node of the
    database (`is_node_outage`), not of the statement: retrying the same work later can succeed."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return is_node_outage(exc) or isinstance(
        exc, OperationalError | InterfaceError | PoolTimeoutError | OSError
    )


def is_node_outage(exc: BaseException) -> bool:
    """An outage of part of the database: the server answered, but the statement needed a server it
    could not reach (on a Citus cluster, the worker holding a tenant's shards). Other work, of tenants
    whose shards are elsewhere, can succeed meanwhile: a batch of several tenants that meets it is
    split, where a lost connection fails the whole batch."""
    if not isinstance(exc, DBAPIError) or exc.connection_invalidated:
        return False
    sqlstate = _sqlstate(exc)
    return sqlstate.startswith(_NODE_OUTAGE_SQLSTATES) or (
        sqlstate == "XX000" and _NODE_LOST in str(exc.orig)
    )


def data_error(exc: BaseException) -> ApiError | None:
    """A statement refused for a value the client sent (Postgres's data exceptions, SQLSTATE class 22,
    or text the driver cannot encode) is the client's fault: a 422, not a 500. The edge refuses such
    input first (`app.server.middleware.RequestInputGuard`); this is the wall behind it."""
    sqlstate = str(getattr(getattr(exc, "orig", None), "sqlstate", None) or "")
    if isinstance(exc, UnicodeError) or (isinstance(exc, DBAPIError) and sqlstate.startswith("22")):
        return InvalidField(
            "The request holds a value that cannot be stored.",
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
    log.warning("db.unavailable", error=type(exc).__name__, sqlstate=_sqlstate(exc) or None)
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
