"""SQL of an evaluation: what each writer's bank holds, where its memories come from, what it cost.

Everything read here is per tenant: an evaluation's banks are tenants of their own.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Changeset, Chunk, Memory, MemoryVersion

UNFINISHED = ("queued", "processing")


class EvaluationRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def unfinished(self, tenant_id: uuid.UUID, user_id: str) -> int:
        """Chunks of the scope not yet applied or failed."""
        count = await self.session.scalar(
            select(func.count()).where(
                Chunk.tenant_id == tenant_id, Chunk.user_id == user_id, Chunk.status.in_(UNFINISHED)
            )
        )
        return int(count or 0)

    async def chunk_statuses(self, tenant_id: uuid.UUID) -> dict[str, int]:
        rows = await self.session.execute(
            select(Chunk.status, func.count()).where(Chunk.tenant_id == tenant_id).group_by(Chunk.status)
        )
        return {status: int(count) for status, count in rows.tuples()}

    async def failed_chunks(self, tenant_id: uuid.UUID, limit: int = 5) -> list[str]:
        """The errors of a few failed chunks, to say why a writer wrote less."""
        rows = await self.session.scalars(
            select(Chunk.last_error)
            .where(Chunk.tenant_id == tenant_id, Chunk.status == "failed")
            .limit(limit)
        )
        return [error or "" for error in rows]

    async def chunk_turns(self, tenant_id: uuid.UUID) -> dict[uuid.UUID, tuple[str, ...]]:
        """Chunk id -> the turn ids its metadata names."""
        rows = await self.session.execute(
            select(Chunk.id, Chunk.metadata_["turn_ids"]).where(Chunk.tenant_id == tenant_id)
        )
        return {chunk_id: tuple(str(t) for t in turns or []) for chunk_id, turns in rows.tuples()}

    async def derivations(self, tenant_id: uuid.UUID) -> dict[uuid.UUID, list[tuple[int, uuid.UUID]]]:
        """Memory id -> (version, chunk id) of each of its versions written from a chunk."""
        rows = await self.session.execute(
            select(MemoryVersion.memory_id, MemoryVersion.version, MemoryVersion.chunk_id).where(
                MemoryVersion.tenant_id == tenant_id, MemoryVersion.chunk_id.is_not(None)
            )
        )
        found: dict[uuid.UUID, list[tuple[int, uuid.UUID]]] = {}
        for memory_id, version, chunk_id in rows.tuples():
            assert chunk_id is not None
            found.setdefault(memory_id, []).append((version, chunk_id))
        return found

    async def memory_counts(self, tenant_id: uuid.UUID) -> tuple[int, int]:
        """(memories written, memories active now)."""
        row = (
            await self.session.execute(
                select(func.count(), func.count().filter(Memory.status == "active")).where(
                    Memory.tenant_id == tenant_id
                )
            )
        ).one()
        return int(row[0]), int(row[1])

    async def writer_usage(self, tenant_id: uuid.UUID) -> list[dict[str, Any]]:
        """The usage (tokens, latency) each writer changeset recorded."""
        rows = await self.session.scalars(
            select(Changeset.usage).where(Changeset.tenant_id == tenant_id, Changeset.kind == "writer")
        )
        return [dict(usage or {}) for usage in rows]
