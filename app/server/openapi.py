"""The OpenAPI document (`/schema/openapi.json`): every status a route can answer, not only its success.

Litestar documents a route's success and what its handler declares (`responses=`: the errors of the
catalogue in `app.lib.errors` it raises of its own accord, each with what it means, and a second
success where there is one). Around every handler, though, stand answers no handler gives: the
authentication middleware, the role guards, the schema check and the outage handler. Those are added
here, when the document is serialised, from what each route is:

- outside `PUBLIC_PATHS` (the authentication middleware's exclusions): the bearer scheme, 401, 403
  (each such route has a role guard; tests/integration/system/test_openapi.py holds it to that), 429
  (the key's request rate) and 503 (the key is resolved in Postgres, which may be down);
- a path parameter: 404 (no such object, or a decoded path that matches no route);
- any parameter or a request body: 422; a request body: 400 (`invalid_json`) and 413.

Every error answer gets the shared `Error` body, and a 429 or 503 its `Retry-After` header. Litestar
has no hook for the error responses of every route (litestar-org/litestar#4470), and it replaces
`components.schemas` with the models it found, so the `Error` schema is added in the same step.
`app.openapi_schema` stays Litestar's object; its `to_schema()`, which every document endpoint serves,
is the completed document.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgspec
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
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
    Parameter,
    PathItem,
    Reference,
    RequestBody,
    Schema,
    SecurityScheme,
)
from litestar.typing import FieldDefinition

import app
from app.config import Settings
from app.domain.accounts.auth import PUBLIC_PATHS
from app.domain.search.tenant_embedder import allowed_embedders
from app.lib.errors import (
    ApiError,
    Forbidden,
    InvalidField,
    InvalidJson,
    NotFoundError,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from app.writers.registry import DEFAULT as DEFAULT_WRITER
from app.writers.registry import WriterRegistry

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
_RETRYABLE = frozenset({429, 503})

# What every route of a kind may answer, whatever its handler does (see the module's docstring); the
# operations refer to them as #/components/responses/<name>.
GENERIC_ERRORS: dict[int, type[ApiError]] = {
    400: InvalidJson,
    401: Unauthorized,
    403: Forbidden,
    404: NotFoundError,
    413: PayloadTooLarge,
    422: InvalidField,
    429: RateLimited,
    503: Unavailable,
}


def _generic(status: int) -> OpenAPIResponse:
    error = GENERIC_ERRORS[status]
    return error_response(error.description, {"Retry-After": _RETRY_AFTER} if status in _RETRYABLE else None)


_NAMES = {
    400: "InvalidJson",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    413: "PayloadTooLarge",
    422: "ValidationError",
    429: "RateLimited",
    503: "Unavailable",
}
ERROR_RESPONSES: dict[int, tuple[str, OpenAPIResponse]] = {
    status: (_NAMES[status], _generic(status)) for status in GENERIC_ERRORS
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


# A struct field's `Meta(extra={"deployment": <fact>})`: the schema says what this deployment accepts
# there (its writers, its bounds), read from its settings when the app is built (`deployment_facts`).
DEPLOYMENT = "deployment"


def deployment_facts(settings: Settings) -> dict[str, dict[str, Any]]:
    """What the document says of the fields whose accepted values are the deployment's."""
    names = WriterRegistry(settings).names()
    facts: dict[str, dict[str, Any]] = {
        "writers": {"enum": names},
        "named_writers": {"enum": [n for n in names if n != DEFAULT_WRITER]},  # not the `default` alias
        "max_top_k": {"maximum": settings.search_max_top_k},
        "max_write_weight": {"maximum": settings.tenant_write_weight_max},
        "tenant_embedders": {"enum": list(allowed_embedders(settings.embedder, settings.tenant_embedders))},
    }
    if settings.rate_limit_per_s > 0:
        facts["max_rate_limit_per_s"] = {"maximum": settings.rate_limit_per_s}
    if settings.rate_limit_burst > 0:
        facts["max_rate_limit_burst"] = {"maximum": settings.rate_limit_burst}
    return facts


_KIND = {
    msgspec.inspect.StrType: OpenAPIType.STRING,
    msgspec.inspect.IntType: OpenAPIType.INTEGER,
    msgspec.inspect.FloatType: OpenAPIType.NUMBER,
    msgspec.inspect.ListType: OpenAPIType.ARRAY,
}


def _kind(info: msgspec.inspect.Type) -> OpenAPIType | None:
    while isinstance(info, msgspec.inspect.Metadata):
        info = info.type
    return _KIND.get(type(info))


class ExactStructSchemaPlugin(StructSchemaPlugin):
    """A msgspec struct's schema as strict as its decoding: no unknown fields where it forbids them,
    and every bound it holds, including those Litestar leaves out (a bound of 0, the items of a list)
    and those the deployment sets (`DEPLOYMENT`)."""

    def __init__(self, facts: dict[str, dict[str, Any]]) -> None:
        self.facts = facts

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: Any) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        struct = field_definition.type_
        if struct.__struct_config__.forbid_unknown_fields:
            schema.additional_properties = False
        for key, value in getattr(struct, "__openapi__", {}).items():
            setattr(schema, key, value)
        info = msgspec.inspect.type_info(struct)
        assert isinstance(info, msgspec.inspect.StructType)
        for field in info.fields:
            prop = (schema.properties or {}).get(field.encode_name)
            if isinstance(prop, Schema):
                self._constrain(prop, field.type)
        return schema

    def _constrain(self, schema: Schema, info: msgspec.inspect.Type) -> None:  # noqa: PLR0912 (a branch a type)
        if isinstance(info, msgspec.inspect.Metadata):
            fact = (info.extra or {}).get(DEPLOYMENT)
            self._constrain(schema, info.type)
            for key, value in self.facts.get(fact, {}).items() if fact else ():
                setattr(schema, key, value)
            return
        if isinstance(info, msgspec.inspect.UnionType):
            for member in info.types:
                for alternative in schema.one_of or []:
                    if isinstance(alternative, Schema) and alternative.type == _kind(member):
                        self._constrain(alternative, member)
            return
        if isinstance(info, msgspec.inspect.IntType | msgspec.inspect.FloatType):
            for bound, key in (("gt", "exclusive_minimum"), ("ge", "minimum"), ("lt", "exclusive_maximum")):
                if (value := getattr(info, bound)) is not None:
                    setattr(schema, key, value)
            if info.le is not None:
                schema.maximum = info.le
        elif isinstance(info, msgspec.inspect.StrType):
            if info.min_length is not None:
                schema.min_length = info.min_length
            if info.max_length is not None:
                schema.max_length = info.max_length
        elif isinstance(info, msgspec.inspect.ListType) and isinstance(schema.items, Schema):
            self._constrain(schema.items, info.item_type)


def _ref(status: int) -> Reference:
    return Reference(f"#/components/responses/{ERROR_RESPONSES[status][0]}")


def is_public(path: str) -> bool:
    """Whether the authentication middleware lets `path` through without a key."""
    return _PUBLIC.search(path) is not None


def _declared(status: int, response: OpenAPIResponse | Reference) -> OpenAPIResponse | Reference:
    """A handler's own error status (`app.lib.errors.error_responses`) with the shared body, and, for a
    status every route of its kind also answers, what that means too."""
    if status < 400 or not isinstance(response, OpenAPIResponse) or response.content is not None:
        return response
    description = response.description
    generic = GENERIC_ERRORS.get(status)
    if generic is not None and generic.description not in description:
        description = f"{generic.description} {description}"
    return error_response(description, {"Retry-After": _RETRY_AFTER} if status in _RETRYABLE else None)


def complete_operation(path: str, operation: Operation) -> Operation:
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
    responses: dict[str, OpenAPIResponse | Reference] = {
        code: _declared(int(code), r)
        for code, r in (operation.responses or {}).items()
        # Litestar's own 400 (its `{status_code, detail}` body) is no answer of ours.
        if code != "400" or (isinstance(r, OpenAPIResponse) and r.content is None)
    }
    for status in statuses:
        responses.setdefault(str(status), _ref(status))
    if isinstance(no_content := responses.get("204"), OpenAPIResponse):
        responses["204"] = dataclasses.replace(no_content, content=None)  # a 204 has no body
    return dataclasses.replace(
        operation,
        parameters=[_parameter(p) for p in parameters] or None,
        request_body=_request_body(operation.request_body),
        responses=dict(sorted(responses.items())),
        security=[{BEARER: []}] if protected else operation.security,
    )


def _parameter(parameter: Parameter | Reference) -> Parameter | Reference:
    """A parameter whose schema lists the values it takes has no default outside them (`?purge=true`
    must be sent; the handler's own default only answers its absence)."""
    schema = getattr(parameter, "schema", None)
    if isinstance(schema, Schema) and schema.enum and schema.default not in schema.enum:
        return dataclasses.replace(parameter, schema=dataclasses.replace(schema, default=None))  # type: ignore[arg-type]
    return parameter


def _request_body(body: RequestBody | Reference | None) -> RequestBody | Reference | None:
    """A body the handler takes as `X | None` is an optional X, not a required `X or null`."""
    if not isinstance(body, RequestBody):
        return body
    content = {}
    optional = False
    for media_type, entry in body.content.items():
        alternatives = list(getattr(entry.schema, "one_of", None) or [])
        kept = [s for s in alternatives if getattr(s, "type", None) != OpenAPIType.NULL]
        if len(kept) == 1 and len(alternatives) == 2:
            optional = True
            content[media_type] = dataclasses.replace(entry, schema=kept[0])
        else:
            content[media_type] = entry
    return dataclasses.replace(body, content=content, required=False) if optional else body


def complete_paths(paths: dict[str, PathItem]) -> dict[str, PathItem]:
    completed = {}
    for path, item in paths.items():
        completed[path] = dataclasses.replace(item)
        for method in _METHODS:
            if (operation := getattr(item, method)) is not None:
                setattr(completed[path], method, complete_operation(path, operation))
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
