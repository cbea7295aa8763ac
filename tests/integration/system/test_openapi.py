"""`/schema/openapi.json` describes the API clients meet: every status a route answers, the one error
body, the bearer scheme where a key is needed, and `/metrics` as Prometheus text.

Whether real answers match the document is the fuzz test's job (tests/fuzz); these pin its shape.
"""

from __future__ import annotations

from typing import Any

import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import AsyncTestClient

from app.lib.errors import ErrorSpec
from app.server.openapi import is_public

ERROR_REF = "#/components/schemas/Error"


@pytest.fixture
async def document(client: AsyncTestClient[Litestar]) -> dict[str, Any]:
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    return response.json()


def _responses(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    responses: dict[str, Any] = document["paths"][path][method.lower()]["responses"]
    return {
        status: document["components"]["responses"][r["$ref"].rsplit("/", 1)[1]] if "$ref" in r else r
        for status, r in responses.items()
    }


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in {"get", "put", "post", "delete", "patch"}
    ]


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("POST", "/v1/chunks", {"200", "202", "400", "401", "403", "409", "413", "422", "429", "503"}),
        ("GET", "/v1/chunks/{chunk_id}", {"200", "401", "403", "404", "422", "429", "503"}),
        (
            "PATCH",
            "/v1/memories/{memory_id}",
            {"200", "400", "401", "403", "404", "409", "413", "422", "429", "503"},
        ),
        ("GET", "/v1/admin/keys", {"200", "401", "403", "429", "503"}),
        ("DELETE", "/v1/admin/users/{user_id}", {"200", "400", "401", "403", "404", "422", "429", "503"}),
        (
            "POST",
            "/v1/admin/chunks/{chunk_id}/retry",
            {"200", "400", "401", "403", "404", "409", "413", "422", "429", "503"},
        ),
        ("POST", "/v1/memories/search", {"200", "400", "401", "403", "409", "413", "422", "429", "503"}),
        ("GET", "/ready", {"200", "503"}),
        ("GET", "/health", {"200"}),
    ],
)
async def test_each_route_lists_every_status_it_answers_with_the_shared_error_body(
    document: dict[str, Any], method: str, path: str, statuses: set[str]
) -> None:
    responses = _responses(document, method, path)
    assert set(responses) == statuses
    for status, response in responses.items():
        if int(status) >= 400:
            assert response["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}
    if "503" in statuses:
        assert responses["503"]["headers"]["Retry-After"]["required"] is True


async def test_the_error_schema_is_the_body_errors_have(
    client: AsyncTestClient[Litestar], document: dict[str, Any]
) -> None:
    error = document["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    assert error["properties"]["error"]["required"] == ["code", "message", "details"]
    body = (await client.get("/v1/admin/keys")).json()  # no key: a real 401
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    # Litestar's own error body is documented nowhere.
    for method, path, _ in _operations(document):
        for status, response in _responses(document, method, path).items():
            schema = response.get("content", {}).get("application/json", {}).get("schema", {})
            assert "status_code" not in schema.get("properties", {}), (method, path, status)


async def test_protected_routes_carry_the_bearer_scheme_and_public_ones_none(
    document: dict[str, Any],
) -> None:
    scheme = document["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert "security" not in document  # no default: each operation says
    public = {(m, p) for m, p, op in _operations(document) if "security" not in op}
    assert public == {("GET", "/health"), ("GET", "/ready"), ("GET", "/metrics")}
    for method, path, operation in _operations(document):
        if (method, path) not in public:
            assert operation["security"] == [{"bearer": []}], (method, path)
            assert {"401", "403"} <= set(operation["responses"]), (method, path)


async def test_metrics_is_documented_and_served_as_prometheus_text(
    client: AsyncTestClient[Litestar], document: dict[str, Any]
) -> None:
    [media_type] = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert media_type.startswith("text/plain")
    served = (await client.get("/metrics")).headers["content-type"]
    assert served.split(";")[0] == "text/plain"


def test_the_rules_hold_for_the_routes_as_registered(app: Litestar) -> None:
    """403 is documented on every protected route because each has a role guard; what a handler says it
    raises is errors of the catalogue, each under its own status."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler, _ in route.route_handler_map.values():
            for status, spec in (handler.responses or {}).items():
                if isinstance(spec, ErrorSpec):
                    assert {e.status_code for e in spec.errors} == {status}, (route.path_format, status)
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or is_public(route.path_format):
            continue
        for method, (handler, _) in route.route_handler_map.items():
            if method != "OPTIONS":
                assert handler.resolve_guards(), (method, route.path_format)
