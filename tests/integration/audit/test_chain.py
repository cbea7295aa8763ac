"""The audit log is hash-chained per tenant: verification finds a changed, deleted or inserted row."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.domain.audit.services import record_event, seal_chain, seal_pending, verify_chain
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


async def _seal(sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID) -> int:
    async with sessionmaker() as session, session.begin():
        return await seal_chain(session, tenant_id)


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
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    engine: AsyncEngine,
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 5)
    await _record(sessionmaker, other_tenant.tenant_id, 2)
    assert await _verify(sessionmaker, tenant.tenant_id) == (True, 0, None)  # nothing sealed yet
    assert await seal_pending(engine) == 11
    # tenant.created + api_key.created + 5 events
    assert await _verify(sessionmaker, tenant.tenant_id) == (True, 7, None)
    assert await _verify(sessionmaker, other_tenant.tenant_id) == (True, 4, None)


async def test_changed_row_is_found(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 5)
    await _seal(sessionmaker, tenant.tenant_id)
    await _tamper(sessionmaker, "UPDATE audit_events SET summary = '{\"i\": 99}' WHERE seq = 5")
    ok, _, broken = await _verify(sessionmaker, tenant.tenant_id)
    assert (ok, broken) == (False, 5)


async def test_deleted_row_is_found(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 5)
    await _seal(sessionmaker, tenant.tenant_id)
    await _tamper(sessionmaker, "DELETE FROM audit_events WHERE seq = 4")
    ok, _, broken = await _verify(sessionmaker, tenant.tenant_id)
    assert (ok, broken) == (False, 4)


async def test_deleted_tail_is_found(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 5)
    await _seal(sessionmaker, tenant.tenant_id)
    await _tamper(sessionmaker, "DELETE FROM audit_events WHERE seq = 7")
    ok, checked, broken = await _verify(sessionmaker, tenant.tenant_id)
    assert (ok, checked, broken) == (False, 6, 7)


async def test_inserted_row_is_found(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 3)
    await _seal(sessionmaker, tenant.tenant_id)
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


async def test_events_are_sealed_once_and_then_frozen(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _record(sessionmaker, tenant.tenant_id, 2)
    async with sessionmaker() as session:
        unsealed = (
            await session.execute(text("SELECT count(*) FROM audit_events WHERE hash IS NULL"))
        ).scalar()
    assert unsealed == 4  # tenant.created, api_key.created and the two events
    assert await _seal(sessionmaker, tenant.tenant_id) == 4
    assert await _seal(sessionmaker, tenant.tenant_id) == 0
    async with sessionmaker() as session:
        with pytest.raises(DBAPIError, match="append-only"):
            await session.execute(text("UPDATE audit_events SET hash = repeat('f', 64) WHERE seq = 1"))
        await session.rollback()
        with pytest.raises(DBAPIError, match="append-only"):
            await session.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE seq = 2"))
        await session.rollback()
    assert await _verify(sessionmaker, tenant.tenant_id) == (True, 4, None)
