"""The admin reads the console browses by — users, changeset counts, failed chunks — and the console's
page itself: public files, no data, headers that keep other origins' scripts and frames out."""

from __future__ import annotations

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Chunk
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.support.history import write

Client = AsyncTestClient[Litestar]


async def _post(client: Client, tenant: TenantKeys, user: str, text: str) -> str:
    body = {"user_id": user, "messages": [{"role": "user", "content": text}]}
    response = await client.post("/v1/chunks", json=body, headers=tenant.admin)
    assert response.status_code == 202, response.text
    return str(response.json()["chunk_id"])


async def test_users_are_listed_by_id_with_counts_paged_and_found_by_prefix(
    client: Client,
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    for user in ("bob", "ana", "anton", "carla"):
        await _post(client, tenant, user, "I live in Lyon.")
    await _post(client, tenant, "ana", "I'm vegetarian.")
    await _post(client, other_tenant, "anna-elsewhere", "I live in Rome.")
    await write(sessionmaker, tenant.tenant_id, "ana", [Op(OpKind.ADD, "The user lives in Lyon.")])

    first = (await client.get("/v1/admin/users", params={"limit": "2"}, headers=tenant.admin)).json()
    assert [(u["user_id"], u["chunks"], u["active_memories"]) for u in first["items"]] == [
        ("ana", 2, 1),
        ("anton", 1, 0),
    ]
    rest = await client.get(
        "/v1/admin/users", params={"limit": "2", "cursor": first["next_cursor"]}, headers=tenant.admin
    )
    assert [u["user_id"] for u in rest.json()["items"]] == ["bob", "carla"]
    assert rest.json()["next_cursor"] is None

    found = await client.get("/v1/admin/users", params={"prefix": "an"}, headers=tenant.admin)
    assert [u["user_id"] for u in found.json()["items"]] == ["ana", "anton"]
    # The cursor is the last user id shown, so any user id is a position; what no user id can be is not.
    past = await client.get("/v1/admin/users", params={"cursor": "zzz"}, headers=tenant.admin)
    assert (past.status_code, past.json()["items"]) == (200, [])
    for cursor in ("x" * 201, "a\x00b"):
        bad = await client.get("/v1/admin/users", params={"cursor": cursor}, headers=tenant.admin)
        assert bad.status_code == 422, cursor
        assert bad.json()["error"]["code"] == "validation_error"


async def test_changesets_are_counted_by_writer_and_model(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    for text in ("The user lives in Lyon.", "The user likes jazz."):
        await write(sessionmaker, tenant.tenant_id, "ana", [Op(OpKind.ADD, text)], writer="hy", model="m-2")
    await write(sessionmaker, tenant.tenant_id, "bob", [Op(OpKind.ADD, "The user is tall.")], model="m-1")

    counts = (await client.get("/v1/admin/changesets/counts", headers=tenant.admin)).json()["items"]
    assert [(c["writer"], c["model"], c["kind"], c["status"], c["count"]) for c in counts] == [
        ("hy", "m-2", "writer", "applied", 2),
        ("w", "m-1", "writer", "applied", 1),
    ]
    mine = await client.get("/v1/admin/changesets/counts", params={"user_id": "bob"}, headers=tenant.admin)
    assert [c["count"] for c in mine.json()["items"]] == [1]


async def test_failed_chunks_are_listed_newest_first_with_their_error_and_messages(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    failed = [await _post(client, tenant, "ana", f"message {i}") for i in range(3)]
    await _post(client, tenant, "ana", "still queued")
    async with sessionmaker() as session, session.begin():
        await session.execute(
            update(Chunk)
            .where(Chunk.id.in_(failed))
            .values(status="failed", last_error="output is not valid JSON", attempts=5)
        )

    page = (await client.get("/v1/admin/chunks", params={"limit": "2"}, headers=tenant.admin)).json()
    assert [c["chunk_id"] for c in page["items"]] == [failed[2], failed[1]]
    assert page["items"][0]["error"] == "output is not valid JSON"
    assert page["items"][0]["messages"][0]["content"] == "message 2"
    rest = await client.get(
        "/v1/admin/chunks", params={"limit": "2", "cursor": page["next_cursor"]}, headers=tenant.admin
    )
    assert [c["chunk_id"] for c in rest.json()["items"]] == [failed[0]]
    queued = await client.get("/v1/admin/chunks", params={"status": "queued"}, headers=tenant.admin)
    assert [c["messages"][0]["content"] for c in queued.json()["items"]] == ["still queued"]


async def test_the_console_page_is_public_static_and_closed_to_other_origins(client: Client) -> None:
    response = await client.get("/admin/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert (await client.get("/admin/console.js")).status_code == 200
    assert (await client.get("/admin/../pyproject.toml")).status_code == 404
    # The page opens no way around the API's keys.
    assert (await client.get("/v1/admin/users")).status_code == 401
