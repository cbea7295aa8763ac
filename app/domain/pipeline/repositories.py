"""SQL the pipeline needs: the next chunk of a scope, its context, and scopes with stranded work."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Chunk

PENDING = ("queued", "processing")


class PipelineRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def next_pending(self, tenant_id: uuid.UUID, user_id: str) -> Chunk | None:
        """The scope's oldest unfinished chunk, row-locked.

        `processing` counts as unfinished: the caller holds the scope lock, so a chunk still marked
        `processing` was left by a worker that died mid-way, and is taken again.
        """
        return await self.session.scalar(
            select(Chunk)
            .where(Chunk.tenant_id == tenant_id, Chunk.user_id == user_id, Chunk.status.in_(PENDING))
            .order_by(Chunk.seq)
            .limit(1)
            .with_for_update()
        )

    async def has_ready(self, tenant_id: uuid.UUID, user_id: str) -> bool:
        found = await self.session.scalar(
            select(Chunk.id)
            .where(
                Chunk.tenant_id == tenant_id,
                Chunk.user_id == user_id,
                Chunk.status.in_(PENDING),
                Chunk.available_at <= func.now(),
            )
            .limit(1)
        )
        return found is not None

    async def lock_chunk(self, chunk_id: uuid.UUID) -> Chunk:
        chunk = await self.session.get(Chunk, chunk_id, with_for_update=True, populate_existing=True)
        assert chunk is not None
        return chunk

    async def earlier_messages(
        self, tenant_id: uuid.UUID, user_id: str, before_seq: int, limit: int
    ) -> list[dict[str, Any]]:
        """The scope's last `limit` messages before chunk `before_seq`, oldest first."""
        if limit <= 0:
            return []
        rows = await self.session.scalars(
            select(Chunk.messages)
            .where(Chunk.tenant_id == tenant_id, Chunk.user_id == user_id, Chunk.seq < before_seq)
            .order_by(Chunk.seq.desc())
            .limit(limit)
        )
        messages = [m for chunk_messages in reversed(rows.all()) for m in chunk_messages]
        return messages[-limit:]

    async def stranded_scopes(self, min_age_s: float, limit: int = 1000) -> Sequence[tuple[uuid.UUID, str]]:
        """Scopes with unfinished chunks untouched for `min_age_s` whose backoff (if any) has passed."""
        rows = await self.session.execute(
            select(Chunk.tenant_id, Chunk.user_id)
            .where(
                Chunk.status.in_(PENDING),
                Chunk.updated_at < func.now() - text("make_interval(secs => :age)").bindparams(age=min_age_s),
                Chunk.available_at <= func.now(),
            )
            .group_by(Chunk.tenant_id, Chunk.user_id)
            .limit(limit)
        )
        return [(r[0], r[1]) for r in rows]
