"""Hand edits are new versions with the key as actor; `as_of` reads show the bank as it stood then."""

from __future__ import annotations

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import AuditEvent, Changeset
from app.domain.memories.repositories import MemoryRepository
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys, bearer
from tests.support.history import EMBEDDER, db_now, memory, write

Client = AsyncTestClient[Litestar]


async def _key(client: Client, tenant: TenantKeys, *roles: str) -> dict[str, str]:
    response = await client.post(
        "/v1/admin/keys", json={"name": "k", "roles": list(roles)}, headers=tenant.admin
    )
    assert response.status_code == 201
    return bearer(response.json()["key"])


async def test_edit_delete_history_and_as_of(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    before_all = await db_now(sessionmaker)
    await write(
        sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.", tags=("home",))]
    )
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    t1 = await db_now(sessionmaker)
    editor = await _key(client, tenant, "read", "write")
    reader = await _key(client, tenant, "read")

    denied = await client.patch(f"/v1/memories/{lyon.id}", json={"content": "x"}, headers=reader)
    assert denied.status_code == 403

    edited = await client.patch(
        f"/v1/memories/{lyon.id}",
        json={"content": "The user lives in Paris.", "reason": "typo in the city"},
        headers=editor,
    )
    assert edited.status_code == 200, edited.text
    assert edited.json()["content"] == "The user lives in Paris."
    assert edited.json()["version"] == 2
    assert edited.json()["tags"] == ["home"]
    for same in (
        {"content": "The user lives in Paris."},
        {"content": "The user lives in Paris.", "tags": ["home"]},
    ):
        unchanged = await client.patch(f"/v1/memories/{lyon.id}", json=same, headers=editor)
        assert unchanged.status_code == 200, unchanged.text
        assert unchanged.json()["version"] == 2  # nothing changed, no version written
    t2 = await db_now(sessionmaker)

    deleted = await client.delete(f"/v1/memories/{lyon.id}", params={"reason": "wrong"}, headers=editor)
    assert deleted.status_code == 200, deleted.text
    assert (deleted.json()["status"], deleted.json()["version"]) == ("deleted", 3)
    again = await client.patch(f"/v1/memories/{lyon.id}", json={"content": "y"}, headers=editor)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "memory_not_active"

    history = (await client.get(f"/v1/memories/{lyon.id}/history", headers=reader)).json()["versions"]
    assert [(v["op"], v["content"], v["status"]) for v in history] == [
        ("ADD", "The user lives in Lyon.", "active"),
        ("UPDATE", "The user lives in Paris.", "active"),
        ("DELETE", "The user lives in Paris.", "deleted"),
    ]
    key_id = (await client.get("/v1/admin/keys", headers=tenant.admin)).json()["items"][1]["id"]
    assert history[0]["actor"] == "worker:test"
    assert history[0]["writer"] == "w"
    assert history[1]["actor"] == history[2]["actor"] == f"key:{key_id}"
    assert history[1]["reason"] == "typo in the city"
    assert history[1]["changeset_id"] != history[2]["changeset_id"]

    async def listing(**params: str) -> list[tuple[str, str, int]]:
        response = await client.get("/v1/memories", params={"user_id": "u", **params}, headers=reader)
        assert response.status_code == 200, response.text
        return [(m["content"], m["status"], m["version"]) for m in response.json()["items"]]

    assert await listing(as_of=before_all.isoformat()) == []
    assert await listing(as_of=t1.isoformat()) == [("The user lives in Lyon.", "active", 1)]
    assert await listing(as_of=t2.isoformat()) == [("The user lives in Paris.", "active", 2)]
    assert await listing() == []
    assert await listing(status="all") == [("The user lives in Paris.", "deleted", 3)]
    assert await listing(as_of=t2.isoformat(), status="deleted") == []

    async with sessionmaker() as session:
        kinds = (await session.scalars(select(Changeset.kind).order_by(Changeset.created_at))).all()
        actions = set((await session.scalars(select(AuditEvent.action))).all())
    assert kinds == ["writer", "manual", "manual"]
    assert {"memory.updated", "memory.deleted"} <= actions


async def test_as_of_pages_like_the_live_listing(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(
        sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, f"The user likes item {i}.") for i in range(5)]
    )
    moment = await db_now(sessionmaker)
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user likes item 9.")])
    seen: list[str] = []
    cursor = None
    while True:
        params = {"user_id": "u", "as_of": moment.isoformat(), "limit": "2"}
        if cursor:
            params["cursor"] = cursor
        page = (await client.get("/v1/memories", params=params, headers=tenant.admin)).json()
        seen += [m["content"] for m in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == [f"The user likes item {i}." for i in range(5)]


async def test_as_of_rows_carry_the_vector_then_in_force(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    t1 = await db_now(sessionmaker)
    await write(
        sessionmaker, tenant.tenant_id, "u", [Op(OpKind.UPDATE, "The user lives in Oslo.", (0,))], [lyon]
    )
    t2 = await db_now(sessionmaker)
    oslo = await memory(sessionmaker, "The user lives in Oslo.")
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.DELETE, targets=(0,))], [oslo])
    [lyon_vector, oslo_vector] = await EMBEDDER.embed(["The user lives in Lyon.", "The user lives in Oslo."])
    async with sessionmaker() as session:
        repo = MemoryRepository(session)
        [then] = await repo.bank_as_of(tenant.tenant_id, "u", t1, with_embedding=True)
        [later] = await repo.bank_as_of(tenant.tenant_id, "u", t2, with_embedding=True)
        [deleted] = await repo.bank_as_of(
            tenant.tenant_id, "u", await db_now(sessionmaker), statuses=None, with_embedding=True
        )
    assert (then.content, then.version) == ("The user lives in Lyon.", 1)
    assert then.embedding is not None
    assert list(then.embedding) == pytest.approx(lyon_vector, abs=1e-6)
    assert later.embedding is not None
    assert list(later.embedding) == pytest.approx(oslo_vector, abs=1e-6)
    # A DELETE version repeats no vector; the one in force is still the last one written.
    assert (deleted.status, deleted.version) == ("deleted", 3)
    assert deleted.embedding is not None
    assert list(deleted.embedding) == pytest.approx(oslo_vector, abs=1e-6)
