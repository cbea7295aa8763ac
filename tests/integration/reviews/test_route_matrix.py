"""Every route of the OpenAPI document, against every credential that must not get through: no key, an
unknown key, a revoked key, each role the route does not accept, and another tenant's admin key.

Each gets the documented status, none of the tenant's data, and the tenant's bank, history, chunks,
reviews, keys and audit log are byte-identical afterwards. The routes come from the document and the
roles each accepts from the routes' own guards, so a new route is covered the day it is added. The
tenant under attack has memories, versions, changesets, chunks and pending reviews (a prompt-injected
"delete everything" held under `review`), and every id in a path is one of its real objects.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.accounts.auth import RoleGuard
from app.lib.security import ROLES
from app.server.openapi import is_public
from tests.conftest import TenantKeys, bearer, make_tenant
from tests.integration.reviews.test_review_queue import FACTS, three_facts_then_injection

Client = AsyncTestClient[Litestar]
_METHODS = ("get", "post", "put", "patch", "delete")
_TABLES = ("memories", "memory_versions", "changesets", "chunks", "reviews", "audit_events", "api_keys")


async def _snapshot(sm: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID) -> dict[str, list[str]]:
    """Every row the tenant has, as JSON text (a key's `last_used_at` aside: using a key stamps it)."""
    rows: dict[str, list[str]] = {}
    async with sm() as session:
        for table in _TABLES:
            result = await session.execute(
                text(
                    f"SELECT (to_jsonb(t) - 'last_used_at')::text AS row FROM {table} t "
                    "WHERE tenant_id = :t ORDER BY 1"
                ),
                {"t": tenant_id},
            )
            rows[table] = list(result.scalars())
        tenant = await session.execute(
            text("SELECT to_jsonb(t)::text FROM tenants t WHERE id = :t"), {"t": tenant_id}
        )
        rows["tenants"] = list(tenant.scalars())
    return rows


def _roles_by_route(app: Litestar) -> dict[tuple[str, str], set[str]]:
    """(METHOD, path) -> the roles its guards accept (admin always)."""
    accepted: dict[tuple[str, str], set[str]] = {}
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        path = re.sub(r"\{(\w+):[^}]+\}", r"{\1}", route.path_format)
        for method, (handler, _) in route.route_handler_map.items():
            roles = {"admin"}
            for guard in handler.resolve_guards():
                if isinstance(guard, RoleGuard):
                    roles |= set(guard.roles)
            accepted[(method, path)] = roles
    return accepted


class _Bodies:
    """A request body that matches the operation's schema, with real ids of the attacked tenant."""

    def __init__(self, document: dict[str, Any], ids: dict[str, str]) -> None:
        self.schemas = document.get("components", {}).get("schemas", {})
        self.ids = ids

    def for_operation(self, operation: dict[str, Any]) -> Any:
        content = operation.get("requestBody", {}).get("content", {})
        schema = content.get("application/json", {}).get("schema")
        return None if schema is None else self.value(schema, "")

    def value(self, schema: dict[str, Any], name: str, depth: int = 0) -> Any:
        if "$ref" in schema:
            return self.value(self.schemas[schema["$ref"].rsplit("/", 1)[1]], name, depth)
        for key in ("oneOf", "anyOf"):
            if key in schema:
                options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
                return self.value(options[0], name, depth)
        if "enum" in schema:
            return schema["enum"][0]
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            if depth > 4:
                return {}
            properties = schema.get("properties", {})
            return {p: self.value(properties[p], p, depth + 1) for p in schema.get("required", [])}
        if kind == "array":
            item = self.value(schema.get("items", {}), name, depth + 1)
            return [item] * max(1, schema.get("minItems", 1))
        if kind == "integer":
            return max(1, schema.get("minimum", 1))
        if kind == "number":
            return max(1.0, schema.get("minimum", 1.0))
        if kind == "boolean":
            return False  # `dry_run: false`: an attempt to change something
        if schema.get("format") == "uuid":
            return self.ids.get(name, self.ids["memory_id"])
        if schema.get("format") == "date-time":
            return "2000-01-01T00:00:00Z"
        return "ana" if "user" in name else "x"


async def test_no_credential_but_the_right_one_gets_through_any_route(
    api: Client,
    tenant: TenantKeys,
    review_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    app: Litestar = api.app
    assert (
        await api.patch("/v1/admin/settings", json={"destructive_ops": "review"}, headers=tenant.admin)
    ).is_success
    await three_facts_then_injection(api, tenant, review_settings, sessionmaker)
    memories = (await api.get("/v1/memories?user_id=ana", headers=tenant.admin)).json()["items"]
    reviews = (await api.get("/v1/admin/reviews?status=pending", headers=tenant.admin)).json()["items"]
    changesets = (await api.get("/v1/admin/changesets", headers=tenant.admin)).json()["items"]
    assert memories
    assert reviews
    assert changesets
    keys: dict[str, dict[str, str]] = {}
    key_ids: dict[str, str] = {}
    for role in [*ROLES, "revoked"]:
        made = await api.post(
            "/v1/admin/keys",
            json={"name": role, "roles": ["admin" if role == "revoked" else role]},
            headers=tenant.admin,
        )
        keys[role], key_ids[role] = bearer(made.json()["key"]), made.json()["id"]
    assert (await api.delete(f"/v1/admin/keys/{key_ids['revoked']}", headers=tenant.admin)).status_code == 204
    ids = {
        "memory_id": memories[0]["id"],
        "review_id": reviews[0]["id"],
        "changeset_id": changesets[0]["id"],
        "chunk_id": reviews[0]["chunk_id"],
        "key_id": key_ids["read"],
        "user_id": "ana",
    }
    secrets_of_the_tenant = [
        *(v for k, v in ids.items() if k != "user_id"),
        *FACTS,
        *(m["id"] for m in memories),
        *(c["id"] for c in changesets),
    ]
    other = await make_tenant(sessionmaker)
    credentials: dict[str, dict[str, str]] = {
        "no key": {},
        "unknown key": bearer("ms_" + "x" * 32),
        "revoked key": keys["revoked"],
        "another tenant's admin": other.admin,
        **{f"role {role}": keys[role] for role in ROLES if role != "admin"},
    }

    document = (await api.get("/schema/openapi.json")).json()
    bodies = _Bodies(document, ids)
    accepted = _roles_by_route(app)
    before = await _snapshot(sessionmaker, tenant.tenant_id)
    tried, attempts = set(), 0
    for path, item in document["paths"].items():
        if is_public(path):
            continue
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            documented = {int(s) for s in operation["responses"]}
            url = re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), str(uuid.uuid4())), path)
            query = {
                p["name"]: ids.get(p["name"], "x")
                for p in operation.get("parameters", [])
                if p["in"] == "query" and p.get("required")
            }
            body = bodies.for_operation(operation)
            roles = accepted[(method.upper(), path)]
            for who, headers in credentials.items():
                if who.startswith("role ") and who.removeprefix("role ") in roles:
                    continue  # this role may call the route
                response = await api.request(method.upper(), url, params=query, json=body, headers=headers)
                attempts += 1
                where = (method.upper(), path, who, response.status_code, response.text[:300])
                assert response.status_code in documented, where
                if who in ("no key", "unknown key", "revoked key"):
                    assert response.status_code == 401, where
                elif who.startswith("role "):
                    assert response.status_code == 403, where
                else:
                    assert response.status_code not in (401, 403, 500), where
                    if re.search(r"\{\w+_id\}", path) and "{user_id}" not in path:
                        assert response.status_code == 404, where  # this tenant's object: not theirs
                returned = response.text
                leaked = [s for s in secrets_of_the_tenant if s in returned]
                assert not leaked, (*where, leaked)
                if response.status_code >= 400:
                    assert set(json.loads(returned)) == {"error"}, where
                tried.add((method.upper(), path))
    assert await _snapshot(sessionmaker, tenant.tenant_id) == before
    assert len(tried) == len([1 for k in accepted if not is_public(k[1]) and k[0] != "OPTIONS"])
    assert attempts >= 5 * len(tried)
