"""API keys: hashed at rest, roles enforced, tenants isolated; every /v1 route demands a key."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import ApiKey
from app.server.asgi import create_app
from tests.conftest import TenantKeys, bearer

Client = AsyncTestClient[Litestar]


def assert_error_body(body: dict[str, Any], code: str) -> None:
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)


async def create_key(client: Client, admin: TenantKeys, roles: list[str], name: str = "k") -> dict[str, Any]:
    response = await client.post("/v1/admin/keys", json={"name": name, "roles": roles}, headers=admin.admin)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_keys_are_stored_hashed_and_shown_once(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    created = await create_key(client, tenant, ["ingest", "read"], name="chat-app")
    secret = created["key"]
    async with sessionmaker() as session:
        stored = await session.scalar(select(ApiKey).where(ApiKey.id == created["id"]))
    assert stored is not None
    assert stored.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {stored.key_hash, stored.prefix, stored.name}
    listing = (await client.get("/v1/admin/keys", headers=tenant.admin)).json()
    assert secret not in str(listing)
    assert {k["name"] for k in listing["items"]} == {"admin", "chat-app"}
    # The new key works, with exactly its roles.
    assert (await client.get("/v1/admin/keys", headers=bearer(secret))).status_code == 403


async def test_missing_malformed_and_unknown_keys_are_401(client: Client, tenant: TenantKeys) -> None:
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}, bearer("ms_not-a-key")):
        response = await client.get("/v1/admin/keys", headers=headers)
        assert response.status_code == 401, headers
        assert_error_body(response.json(), "unauthorized")


@pytest.mark.parametrize("roles", [["ingest"], ["read"], ["write"], ["ingest", "read", "write"]])
async def test_key_without_admin_role_is_403(client: Client, tenant: TenantKeys, roles: list[str]) -> None:
    key = (await create_key(client, tenant, roles))["key"]
    response = await client.get("/v1/admin/keys", headers=bearer(key))
    assert response.status_code == 403
    assert_error_body(response.json(), "forbidden")
    response = await client.post(
        "/v1/admin/keys", json={"name": "x", "roles": ["admin"]}, headers=bearer(key)
    )
    assert response.status_code == 403


async def test_other_tenants_key_is_404_and_untouched(
    client: Client, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    theirs = await create_key(client, other_tenant, ["read"])
    response = await client.delete(f"/v1/admin/keys/{theirs['id']}", headers=tenant.admin)
    assert response.status_code == 404
    assert_error_body(response.json(), "not_found")
    # Still valid for its owner's tenant, and invisible to ours.
    assert (await client.get("/v1/admin/keys", headers=bearer(theirs["key"]))).status_code == 403
    ours = (await client.get("/v1/admin/keys", headers=tenant.admin)).json()["items"]
    assert theirs["id"] not in {k["id"] for k in ours}


async def test_revoked_key_is_401(client: Client, tenant: TenantKeys) -> None:
    created = await create_key(client, tenant, ["admin"])
    assert (await client.get("/v1/admin/keys", headers=bearer(created["key"]))).status_code == 200
    assert (await client.delete(f"/v1/admin/keys/{created['id']}", headers=tenant.admin)).status_code == 204
    response = await client.get("/v1/admin/keys", headers=bearer(created["key"]))
    assert response.status_code == 401
    # Revoking again: it exists (in this tenant) but is already revoked; still answers 204.
    assert (await client.delete(f"/v1/admin/keys/{created['id']}", headers=tenant.admin)).status_code == 204


async def test_bad_key_requests_are_rejected_and_change_nothing(client: Client, tenant: TenantKeys) -> None:
    before = (await client.get("/v1/admin/keys", headers=tenant.admin)).json()["items"]
    cases = [
        (b'{"name": "x", "roles": [', 400, "invalid_json"),
        (b'{"name": "x", "roles": ["superuser"]}', 422, "validation_error"),
        (b'{"name": "", "roles": ["read"]}', 422, "validation_error"),
        (b'{"roles": ["read"]}', 422, "validation_error"),
        (b'{"name": "x", "roles": []}', 422, "validation_error"),
    ]
    for body, status, code in cases:
        response = await client.post(
            "/v1/admin/keys", content=body, headers={**tenant.admin, "Content-Type": "application/json"}
        )
        assert response.status_code == status, (body, response.text)
        assert_error_body(response.json(), code)
    after = (await client.get("/v1/admin/keys", headers=tenant.admin)).json()["items"]
    assert after == before


def _v1_routes(app: Litestar) -> list[tuple[str, str]]:
    routes = []
    for route in app.routes:
        if not route.path.startswith("/v1"):
            continue
        for method in sorted(route.methods - {"OPTIONS", "HEAD"}):
            path = re.sub(r"\{[^}:]+:uuid\}", "00000000-0000-0000-0000-000000000000", route.path)
            path = re.sub(r"\{[^}]+\}", "x", path)
            routes.append((method, path))
    return routes


async def test_every_v1_route_requires_a_key(client: Client, app: Litestar) -> None:
    routes = _v1_routes(app)
    assert ("POST", "/v1/admin/keys") in routes
    for method, path in routes:
        response = await client.request(method, path, json={} if method in {"POST", "PATCH", "PUT"} else None)
        assert response.status_code == 401, (method, path, response.text)
        assert_error_body(response.json(), "unauthorized")


async def test_unknown_route_uses_the_error_body(client: Client) -> None:
    response = await client.get("/nope")
    assert response.status_code == 404
    assert_error_body(response.json(), "not_found")


async def test_request_id_is_echoed_or_generated(client: Client) -> None:
    response = await client.get("/health", headers={"X-Request-ID": "req-123"})
    assert response.headers["x-request-id"] == "req-123"
    response = await client.get("/v1/admin/keys")
    assert response.status_code == 401
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])


async def test_revocation_takes_effect_at_once_despite_the_key_cache(
    settings: Settings, tenant: TenantKeys
) -> None:
    cached = settings.model_copy(update={"auth_cache_ttl_s": 60.0})
    async with AsyncTestClient(create_app(cached, configure_logs=False)) as client:
        created = await create_key(client, tenant, ["admin"])
        assert (
            await client.get("/v1/admin/keys", headers=bearer(created["key"]))
        ).status_code == 200  # now cached
        assert (
            await client.delete(f"/v1/admin/keys/{created['id']}", headers=tenant.admin)
        ).status_code == 204
        assert (await client.get("/v1/admin/keys", headers=bearer(created["key"]))).status_code == 401
