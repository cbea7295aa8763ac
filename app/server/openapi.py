"""The OpenAPI document (`/schema/openapi.json`): every status a route can answer, not only its success.

Litestar documents a route's success and, for a route with parameters, a 400 with its own
`{status_code, detail}` body. Clients see something else: every error is
`{"error": {"code", "message", "details"}}` (app/lib/errors.py), a request that does not match the
schema is a 422, and keys, guards, lookups, conflicts and a database outage answer 401, 403, 404, 409
and 503. So the document Litestar builds is completed here, when it is serialised, from what each
route is:

- outside `PUBLIC_PATHS` (the authentication middleware's exclusions): the bearer scheme, 401, 403
  (each such route has a role guard; tests/integration/system/test_openapi.py holds it to that) and
  503 (the key is resolved in Postgres, which may be down);
- a path parameter: 404 (no such object, or a decoded path that matches no route);
- any parameter or a request body: 422; a request body: 400 (`invalid_json`) and 413;
- what handlers answer of their own accord (the 409s, the purge's confirmation, the replay of an
  idempotent post, `/ready`'s 503): `ROUTE_RESPONSES`, read from the controllers and their services.

Litestar has no hook for the error responses of every route (litestar-org/litestar#4470), and it
replaces `components.schemas` with the models it found, so the `Error` schema is added in the same
step. `app.openapi_schema` stays Litestar's object; its `to_schema()`, which every document endpoint
serves, is the completed document.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import ScalarRenderPlugin, SwaggerRenderPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPI,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    PathItem,
    Reference,
    Schema,
    SecurityScheme,
)

import app
from app.domain.accounts.auth import PUBLIC_PATHS

ERROR_SCHEMA = "Error"
BEARER = "bearer"
_METHODS = ("get", "put", "post", "delete", "patch")
_PUBLIC = re.compile("|".join(PUBLIC_PATHS))


def _error_ref() -> dict[str, OpenAPIMediaType]:
    return {"application/json": OpenAPIMediaType(schema=Reference(f"#/components/schemas/{ERROR_SCHEMA}"))}


def error_response(
    description: str, headers: dict[str, OpenAPIHeader | Reference] | None = None
) -> OpenAPIResponse:
    """A response whose body is the shared error body."""
    return OpenAPIResponse(description=description, content=_error_ref(), headers=headers)


_RETRY_AFTER = OpenAPIHeader(
    schema=Schema(type=OpenAPIType.INTEGER, minimum=0),
    description="Seconds to wait before retrying.",
    required=True,
)

# The reusable error responses, by status; operations refer to them as #/components/responses/<name>.
ERROR_RESPONSES: dict[int, tuple[str, OpenAPIResponse]] = {
    400: ("InvalidJson", error_response("The body is not valid JSON (`invalid_json`).")),
    401: (
        "Unauthorized",
        error_response("No API key, or an unknown or revoked one (`unauthorized`)."),
    ),
    403: ("Forbidden", error_response("The API key lacks the role this route needs (`forbidden`).")),
    404: ("NotFound", error_response("No such object in this tenant, or no such route (`not_found`).")),
    413: ("PayloadTooLarge", error_response("The body is over the size limit (`payload_too_large`).")),
    422: (
        "ValidationError",
        error_response(
            "A parameter or the body does not match the schema or a limit (`validation_error`); "
            "`details` names the field."
        ),
    ),
    429: (
        "RateLimited",
        error_response(
            "The API key is over its request rate (`rate_limited`), or, ingesting, too many chunks of "
            "the user or the tenant wait to be applied (`queue_full`). Retry after `Retry-After` seconds.",
            headers={"Retry-After": _RETRY_AFTER},
        ),
    ),
    503: (
        "Unavailable",
        error_response(
            "Postgres is unreachable, or the embedding model (search), or the server is shutting down "
            "(`unavailable`); or too many chunks wait to be stored (`overloaded`, ingestion). Retry "
            "after `Retry-After` seconds.",
            headers={"Retry-After": _RETRY_AFTER},
        ),
    ),
}

_ERROR_BODY = Schema(
    type=OpenAPIType.OBJECT,
    required=["error"],
    properties={
        "error": Schema(
            type=OpenAPIType.OBJECT,
            required=["code", "message", "details"],
            properties={
                "code": Schema(
                    type=OpenAPIType.STRING,
                    description="Stable and machine-readable, e.g. `validation_error`, `not_found`.",
                ),
                "message": Schema(type=OpenAPIType.STRING, description="For people; wording may change."),
                "details": Schema(
                    type=OpenAPIType.OBJECT, description="What the code needs: the field, a limit, ..."
                ),
            },
        )
    },
    description="Every 4xx and 5xx answer has this body.",
)


_KEPT_CHANGING = "The memories kept changing while their restored texts were embedded (`memory_changed`)."

# Statuses a handler answers of its own accord, by (method, path as documented). Read from the
# controllers and the services they call: every ConflictError they can reach, and the rest.
ROUTE_RESPONSES: dict[tuple[str, str], dict[int, OpenAPIResponse]] = {
    ("GET", "/ready"): {
        503: error_response(
            "A dependency is unreachable or the schema is not migrated "
            "(`unavailable`); `details` has each check.",
            headers={"Retry-After": _RETRY_AFTER},
        )
    },
    ("POST", "/v1/chunks"): {
        409: error_response("This Idempotency-Key was used with a different body (`idempotency_conflict`)."),
    },
    ("POST", "/v1/chunks/batch"): {
        409: error_response(
            "An item's Idempotency-Key was used with a different body (`idempotency_conflict`)."
        ),
    },
    ("PATCH", "/v1/memories/{memory_id}"): {
        409: error_response(
            "The memory is superseded or deleted (`memory_not_active`), or changed meanwhile "
            "(`memory_changed`)."
        ),
    },
    ("DELETE", "/v1/memories/{memory_id}"): {
        409: error_response(
            "The memory is superseded or deleted (`memory_not_active`), or changed meanwhile "
            "(`memory_changed`)."
        ),
    },
    ("POST", "/v1/admin/memories/{memory_id}/rollback"): {409: error_response(_KEPT_CHANGING)},
    ("POST", "/v1/admin/changesets/{changeset_id}/revert"): {
        409: error_response(
            "The changeset is already reverted (`already_reverted`). Later changes touched its memories "
            "and `force` is not set (`revert_conflict`, listed in `details.conflicts`). " + _KEPT_CHANGING
        ),
    },
    ("POST", "/v1/admin/revert"): {
        409: error_response(
            "Later changes touched memories this would revert and `force` is not set "
            "(`revert_conflict`, listed in `details.conflicts`). " + _KEPT_CHANGING
        ),
    },
    ("POST", "/v1/admin/users/{user_id}/restore"): {409: error_response(_KEPT_CHANGING)},
    ("POST", "/v1/admin/chunks/{chunk_id}/retry"): {
        409: error_response("Only a failed chunk can be retried (`chunk_not_failed`)."),
    },
    ("GET", "/v1/admin/writers/compare"): {
        404: error_response("No shadow bank of the tenant has that name (`bank_not_found`)."),
    },
    ("POST", "/v1/admin/replays"): {
        409: error_response("A bank of that name exists with another writer (`bank_conflict`)."),
    },
    ("DELETE", "/v1/admin/users/{user_id}"): {
        400: error_response("Erasing a user is not confirmed with `?purge=true` (`purge_not_confirmed`)."),
    },
    ("POST", "/v1/answer"): {
        409: error_response(
            "The stored vectors come from another embedder than the configured one (`embedder_mismatch`)."
        ),
        501: error_response(
            "No read model is configured: MEMSTORE_READER_BASE_URL and MEMSTORE_READER_MODEL "
            "(`reader_not_configured`)."
        ),
        503: error_response(
            "The read model, the embedding model or Postgres is unavailable, or the server is shutting "
            "down (`unavailable`). Retry after `Retry-After` seconds.",
            headers={"Retry-After": _RETRY_AFTER},
        ),
    },
}

# A second success status with the body of the route's own: (method, path) -> (status, its own, why).
ALSO_SUCCESS: dict[tuple[str, str], tuple[int, int, str]] = {
    ("POST", "/v1/chunks"): (
        200,
        202,
        "A replay: an earlier chunk had this Idempotency-Key and the same body; its acknowledgement.",
    ),
}


def _ref(status: int) -> Reference:
    return Reference(f"#/components/responses/{ERROR_RESPONSES[status][0]}")


def is_public(path: str) -> bool:
    """Whether the authentication middleware lets `path` through without a key."""
    return _PUBLIC.search(path) is not None


def complete_operation(method: str, path: str, operation: Operation) -> Operation:
    """`operation` with every status it can answer, and its security requirement."""
    parameters = operation.parameters or []
    protected = not is_public(path)
    statuses: set[int] = set()
    if protected:
        statuses |= {401, 403, 429, 503}
    if any(getattr(p, "param_in", None) == "path" for p in parameters):
        statuses.add(404)
    if parameters or operation.request_body is not None:
        statuses.add(422)
    if operation.request_body is not None:
        statuses |= {400, 413}
    # Litestar's own 400 (its `{status_code, detail}` body) is no answer of ours.
    responses: dict[str, OpenAPIResponse | Reference] = {
        code: r for code, r in (operation.responses or {}).items() if code != "400"
    }
    responses.update({str(status): _ref(status) for status in statuses})
    route = (method.upper(), path)
    responses.update({str(status): r for status, r in ROUTE_RESPONSES.get(route, {}).items()})
    if route in ALSO_SUCCESS:
        status, own, why = ALSO_SUCCESS[route]
        success = responses[str(own)]
        assert isinstance(success, OpenAPIResponse)
        responses[str(status)] = OpenAPIResponse(description=why, content=success.content)
    return dataclasses.replace(
        operation,
        responses=dict(sorted(responses.items())),
        security=[{BEARER: []}] if protected else operation.security,
    )


def complete_paths(paths: dict[str, PathItem]) -> dict[str, PathItem]:
    completed = {}
    for path, item in paths.items():
        completed[path] = dataclasses.replace(item)
        for method in _METHODS:
            if (operation := getattr(item, method)) is not None:
                setattr(completed[path], method, complete_operation(method, path, operation))
    return completed


@dataclasses.dataclass
class ApiDocument(OpenAPI):
    """Litestar's document, completed with every route's error responses when serialised."""

    def to_schema(self) -> dict[str, Any]:
        components = dataclasses.replace(
            self.components, schemas={**self.components.schemas, ERROR_SCHEMA: _ERROR_BODY}
        )
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(OpenAPI)}
        completed = OpenAPI(**{**fields, "components": components, "paths": complete_paths(self.paths or {})})
        return completed.to_schema()


class ApiDocumentConfig(OpenAPIConfig):
    """Litestar's OpenAPI settings; the document it builds is an `ApiDocument`."""

    def to_openapi_schema(self) -> OpenAPI:
        built = super().to_openapi_schema()
        return ApiDocument(**{f.name: getattr(built, f.name) for f in dataclasses.fields(OpenAPI)})


def openapi_config() -> OpenAPIConfig:
    """The document at /schema (Scalar), /schema/swagger and /schema/openapi.json."""
    return ApiDocumentConfig(
        title="Memstore",
        version=app.__version__,
        description="Asynchronous, versioned memory store for AI agents.",
        path="/schema",
        render_plugins=[ScalarRenderPlugin(), SwaggerRenderPlugin(path="/swagger")],
        components=Components(
            responses=dict(ERROR_RESPONSES.values()),
            security_schemes={
                BEARER: SecurityScheme(
                    type="http",
                    scheme="bearer",
                    description="An API key (`Authorization: Bearer ms_...`); its roles (ingest, read, "
                    "write, admin) decide which routes it may call.",
                )
            },
        ),
    )
