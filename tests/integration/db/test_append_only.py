"""History tables are append-only at the database, whatever the application does."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Changeset, Memory, MemoryVersion
from app.domain.audit.services import record_event
from tests.conftest import TenantKeys


async def _seed(session: AsyncSession, tenant_id: uuid.UUID) -> tuple[uuid.UUID, uuid.UUID]:
    changeset = Changeset(tenant_id=tenant_id, user_id="u1", kind="manual", actor="test", ops=[])
    session.add(changeset)
    await session.flush()
    memory = Memory(
        tenant_id=tenant_id, user_id="u1", content="The user lives in Lyon.", changeset_id=changeset.id
    )
    session.add(memory)
    await session.flush()
    session.add(
        MemoryVersion(
            tenant_id=tenant_id,
            user_id="u1",
            memory_id=memory.id,
            version=1,
            op="ADD",
            content=memory.content,
            tags=[],
            owner="user",
            status="active",
            changeset_id=changeset.id,
            actor="test",
        )
    )
    await record_event(session, tenant_id=tenant_id, actor="test", action="memory.added")
    return memory.id, changeset.id


@pytest.fixture
async def seeded(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> tuple[uuid.UUID, uuid.UUID]:
    async with sessionmaker() as session, session.begin():
        return await _seed(session, tenant.tenant_id)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE memory_versions SET content = 'The user lives in Paris.'",
        "DELETE FROM memory_versions",
        "TRUNCATE memory_versions",
        "UPDATE audit_events SET action = 'nothing.happened'",
        "DELETE FROM audit_events",
        "TRUNCATE audit_events CASCADE",
    ],
)
async def test_history_rows_cannot_change(
    sessionmaker: async_sessionmaker[AsyncSession], seeded: tuple[uuid.UUID, uuid.UUID], statement: str
) -> None:
    async with sessionmaker() as session:
        with pytest.raises(DBAPIError, match="append-only"):
            await session.execute(text(statement))
        await session.rollback()
        assert await session.scalar(text("SELECT count(*) FROM memory_versions")) == 1
        content = await session.scalar(text("SELECT content FROM memory_versions"))
        assert content == "The user lives in Lyon."


async def test_changeset_only_status_may_change(
    sessionmaker: async_sessionmaker[AsyncSession], seeded: tuple[uuid.UUID, uuid.UUID]
) -> None:
    _, changeset_id = seeded
    params = {"id": changeset_id}
    async with sessionmaker() as session:
        with pytest.raises(DBAPIError, match="only status may change"):
            await session.execute(text("UPDATE changesets SET actor = 'mallory' WHERE id = :id"), params)
        await session.rollback()
        with pytest.raises(DBAPIError, match="append-only"):
            await session.execute(text("DELETE FROM changesets WHERE id = :id"), params)
        await session.rollback()
        await session.execute(text("UPDATE changesets SET status = 'reverted' WHERE id = :id"), params)
        await session.commit()
        with pytest.raises(DBAPIError, match="applied to reverted"):
            await session.execute(text("UPDATE changesets SET status = 'applied' WHERE id = :id"), params)
        await session.rollback()
        assert (
            await session.scalar(text("SELECT status FROM changesets WHERE id = :id"), params) == "reverted"
        )


async def test_purge_flag_is_the_only_way_to_delete_history(
    sessionmaker: async_sessionmaker[AsyncSession], seeded: tuple[uuid.UUID, uuid.UUID]
) -> None:
    memory_id, _ = seeded
    async with sessionmaker() as session, session.begin():
        await session.execute(text("SET LOCAL memstore.purge = 'on'"))
        await session.execute(text("DELETE FROM memory_versions WHERE memory_id = :m"), {"m": memory_id})
    async with sessionmaker() as session:
        assert await session.scalar(text("SELECT count(*) FROM memory_versions")) == 0
        # The flag was transaction-local: history is protected again.
        with pytest.raises(DBAPIError, match="append-only"):
            await session.execute(text("DELETE FROM audit_events"))


async def test_audit_rows_survive_a_failed_tamper(
    sessionmaker: async_sessionmaker[AsyncSession], seeded: tuple[uuid.UUID, uuid.UUID]
) -> None:
    async with sessionmaker() as session:
        before = (await session.execute(text("SELECT id, hash FROM audit_events ORDER BY id"))).all()
        with pytest.raises(DBAPIError):
            await session.execute(text("UPDATE audit_events SET hash = repeat('0', 64)"))
        await session.rollback()
        after = (await session.execute(text("SELECT id, hash FROM audit_events ORDER BY id"))).all()
    assert before == after
    assert len(before) >= 1


@pytest.mark.parametrize("table", ["memory_versions", "audit_events", "changesets", "reviews"])
async def test_no_history_table_can_be_truncated(
    sessionmaker: async_sessionmaker[AsyncSession], seeded: tuple[uuid.UUID, uuid.UUID], table: str
) -> None:
    async with sessionmaker() as session:
        before = await session.scalar(text(f"SELECT count(*) FROM {table}"))
        with pytest.raises(DBAPIError, match=r"append-only|decided once|purge"):
            await session.execute(text(f"TRUNCATE {table} CASCADE"))
        await session.rollback()
        assert await session.scalar(text(f"SELECT count(*) FROM {table}")) == before
