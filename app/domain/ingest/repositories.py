"""SQL of chunks and scopes."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Chunk, Scope


class ScopeRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def next_seq(self, tenant_id: uuid.UUID, user_id: str) -> int:
        """Allocate the scope's next sequence number.

        The scope row stays locked until commit, so concurrent chunks of one user commit in `seq`
        order: a worker never sees seq n+1 committed while n is still in flight.
        """
        stmt = (
            insert(Scope)
            .values(tenant_id=tenant_id, user_id=user_id, last_seq=1)
            .on_conflict_do_update(
                index_elements=[Scope.tenant_id, Scope.user_id], set_={"last_seq": Scope.last_seq + 1}
            )
            .returning(Scope.last_seq)
        )
        return int((await self.session.execute(stmt)).scalar_one())


class ChunkRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, tenant_id: uuid.UUID, chunk_id: uuid.UUID) -> Chunk | None:
        return await self.session.scalar(
            select(Chunk).where(Chunk.tenant_id == tenant_id, Chunk.id == chunk_id)
        )

    async def get_by_idempotency_key(self, tenant_id: uuid.UUID, key: str) -> Chunk | None:
        return await self.session.scalar(
            select(Chunk).where(Chunk.tenant_id == tenant_id, Chunk.idempotency_key == key)
        )

    async def insert(self, values: dict[str, Any]) -> uuid.UUID | None:
        """Insert a chunk; None if its idempotency key was taken meanwhile by a concurrent request."""
        stmt = (
            insert(Chunk)
            .values(**values)
            .on_conflict_do_nothing(
                index_elements=[Chunk.tenant_id, Chunk.idempotency_key],
                index_where=text("idempotency_key IS NOT NULL"),
            )
            .returning(Chunk.id)
        )
        return (await self.session.execute(stmt)).scalar_one_or_none()
