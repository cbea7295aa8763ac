"""The audit log is hash-chained per tenant: verification finds a changed, deleted or inserted row."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.audit.services import record_event, verify_chain
from tests.conftest import TenantKeys


async def _record(sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, n: int) -> None:
    for i in range(n):
        async with sessionmaker() as session, session.begin():
            await record_event(
                session,
                tenant_id=tenant_id,
                actor="test",
                action="thing.done",
                target_type="thing",
                target_id=str(i),
                summary={"i": i, "note": "é"},
            )


async def _tamper(sessionmaker: async_sessionmaker[AsyncSession], sql: str) -> None:
    """Change audit rows as the database owner would, bypassing the append-only trigger."""
    async with sessionmaker() as session, session.begin():
        await session.execute(text("SET LOCAL session_replication_role = replica"))
        await session.execute(text(sql))


async def _verify(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID
) -> tuple[bool, int, int | None]:
    async with sessionmaker() as session:
        verdict = await verify_chain(session, tenant_id)
    return verdict.ok, verdict.checked, verdict.broken_at_seq


async def test_intact_chain_verifies(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 5)
    await _record(sessionmaker, other_tenant.tenant_id, 2)
    # tenant.created + api_key.created + 5 events
    assert await _verify(sessionmaker, tenant.tenant_id) == (True, 7, None)
    assert await _verify(sessionmaker, other_tenant.tenant_id) == (True, 4, None)


async def test_changed_row_is_found(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 5)
    await _tamper(sessionmaker, "UPDATE audit_events SET summary = '{\"i\": 99}' WHERE seq = 5")
    ok, _, broken = await _verify(sessionmaker, tenant.tenant_id)
    assert (ok, broken) == (False, 5)


async def test_deleted_row_is_found(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 5)
    await _tamper(sessionmaker, "DELETE FROM audit_events WHERE seq = 4")
    ok, _, broken = await _verify(sessionmaker, tenant.tenant_id)
    assert (ok, broken) == (False, 4)


async def test_deleted_tail_is_found(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 5)
    await _tamper(sessionmaker, "DELETE FROM audit_events WHERE seq = 7")
    ok, checked, broken = await _verify(sessionmaker, tenant.tenant_id)
    assert (ok, checked, broken) == (False, 6, 7)


async def test_inserted_row_is_found(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 3)
    # Shift the tail up and slip a forged event in at seq 3, with a hash that does not chain.
    await _tamper(sessionmaker, "UPDATE audit_events SET seq = seq + 100 WHERE seq >= 3")
    await _tamper(
        sessionmaker,
        "INSERT INTO audit_events (tenant_id, seq, actor, action, summary, created_at, prev_hash, hash) "
        f"VALUES ('{tenant.tenant_id}', 3, 'mallory', 'forged', '{{}}', now(), "
        "repeat('a', 64), repeat('b', 64))",
    )
    ok, _, broken = await _verify(sessionmaker, tenant.tenant_id)
    assert (ok, broken) == (False, 3)
