"""The audit log over HTTP: listing what happened, and a verification that finds tampering."""

from __future__ import annotations

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.support.history import memory, write

Client = AsyncTestClient[Litestar]


async def _events(client: Client, tenant: TenantKeys, **params: str) -> list[dict[str, object]]:
    response = await client.get("/v1/admin/audit", params=params, headers=tenant.admin)
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


async def _verify(client: Client, tenant: TenantKeys) -> dict[str, object]:
    response = await client.get("/v1/admin/audit/verify", headers=tenant.admin)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize(
    ("tamper", "broken_at"),
    [
        (["UPDATE audit_events SET summary = '{\"memories\": 0}' WHERE seq = 4"], 4),
        (["DELETE FROM audit_events WHERE seq = 3"], 3),
        (
            [
                "UPDATE audit_events SET seq = seq + 100 WHERE seq >= 2",
                "INSERT INTO audit_events "
                "(tenant_id, seq, actor, action, summary, created_at, prev_hash, hash) "
                "SELECT tenant_id, 2, 'mallory', 'forged', '{}', now(), prev_hash, hash "
                "FROM audit_events WHERE seq = 102",
            ],
            2,
        ),
    ],
    ids=["changed", "deleted", "inserted"],
)
async def test_audit_lists_what_happened_and_verify_finds_tampering(
    client: Client,
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
    tamper: list[str],
    broken_at: int,
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    headers = tenant.admin | {"X-Request-ID": "req-edit-1"}
    edited = await client.patch(
        f"/v1/memories/{lyon.id}", json={"content": "The user lives in Oslo."}, headers=headers
    )
    assert edited.status_code == 200
    rolled = await client.post(
        f"/v1/admin/memories/{lyon.id}/rollback", json={"to_version": 1}, headers=tenant.admin
    )
    assert rolled.status_code == 200

    events = await _events(client, tenant)
    actions = [e["action"] for e in events]
    assert actions == ["tenant.created", "api_key.created", "memory.updated", "memory.rolled_back"]
    updated = events[2]
    assert (updated["target_type"], updated["target_id"], updated["request_id"]) == (
        "memory",
        str(lyon.id),
        "req-edit-1",
    )
    assert str(updated["actor"]).startswith("key:")
    assert "Oslo" not in str(events)  # events say what happened, not what the memory says
    assert [e["action"] for e in await _events(client, tenant, action="memory.updated")] == ["memory.updated"]
    first = (await client.get("/v1/admin/audit", params={"limit": "3"}, headers=tenant.admin)).json()
    rest = await _events(client, tenant, cursor=first["next_cursor"])
    assert [e["action"] for e in first["items"] + rest] == actions

    assert await _verify(client, tenant) == {
        "ok": True,
        "checked": 4,
        "unsealed": 0,
        "broken_at_seq": None,
        "reason": None,
    }
    async with sessionmaker() as session, session.begin():
        # As the database owner would: with the append-only trigger switched off.
        await session.execute(text("SET LOCAL session_replication_role = replica"))
        for statement in tamper:
            await session.execute(text(statement))
    verdict = await _verify(client, tenant)
    assert (verdict["ok"], verdict["broken_at_seq"]) == (False, broken_at)
    assert verdict["checked"] == broken_at - 1
