"""Seeding a bank the way the pipeline writes it (apply_ops under a writer changeset), reading the
database clock between steps, so as-of reads have exact instants to aim at, and seeing what other
connections hold while a step waits on the network."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Memory
from app.domain.memories.services import Provenance, Shown, apply_ops
from app.embeddings import HashingEmbedder
from app.writers.base import Op

EMBEDDER = HashingEmbedder(384)


async def write(
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant_id: uuid.UUID,
    user_id: str,
    ops: list[Op],
    shown: list[Memory] | None = None,
    *,
    writer: str = "w",
    model: str | None = "m-1",
) -> uuid.UUID:
    """One writer changeset; `shown` are the memories behind local ids 0, 1, 2 ..."""
    async with sessionmaker() as session, session.begin():
        outcome = await apply_ops(
            session,
            tenant_id=tenant_id,
            user_id=user_id,
            ops=ops,
            shown={i: Shown(m.id, m.version) for i, m in enumerate(shown or [])},
            provenance=Provenance(actor="worker:test", writer=writer, model=model),
            embedder=EMBEDDER,
            raw_output=f'{{"ops": {len(ops)}}}',
        )
        assert outcome.applied == len(ops), outcome.guards
    return outcome.changeset_id


async def memory(sessionmaker: async_sessionmaker[AsyncSession], content: str) -> Memory:
    async with sessionmaker() as session:
        found = await session.scalar(select(Memory).where(Memory.content == content))
    assert found is not None, content
    return found


async def db_now(sessionmaker: async_sessionmaker[AsyncSession]) -> datetime:
    """The database clock now: every committed version is before it, every later one after."""
    async with sessionmaker() as session:
        value = await session.scalar(text("SELECT clock_timestamp()"))
    assert isinstance(value, datetime)
    return value


async def held_by_others(sessionmaker: async_sessionmaker[AsyncSession]) -> list[str]:
    """What the other connections to this test's database hold now: an open transaction (with its
    state and last statement) or a lock. Empty when none holds either."""
    async with sessionmaker() as session:
        rows = await session.execute(
            text(
                """
                SELECT a.state, a.query, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid) AS locks
                FROM pg_stat_activity a
                WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                  AND (a.xact_start IS NOT NULL OR EXISTS (SELECT FROM pg_locks l WHERE l.pid = a.pid))
                """
            )
        )
        return [f"{row.state} with {row.locks} locks: {row.query}" for row in rows]
