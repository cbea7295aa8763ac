"""SQL of memories, memory versions and changesets."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Changeset, Memory, MemoryVersion


class MemoryRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, tenant_id: uuid.UUID, memory_id: uuid.UUID) -> Memory | None:
        return await self.session.scalar(
            select(Memory).where(Memory.tenant_id == tenant_id, Memory.id == memory_id)
        )

    async def page(
        self,
        tenant_id: uuid.UUID,
        user_id: str,
        *,
        agent_id: str | None,
        statuses: Sequence[str] | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> Sequence[Memory]:
        """A page of a scope's memories, oldest first, keyset-paginated on (created_at, id)."""
        stmt = select(Memory).where(Memory.tenant_id == tenant_id, Memory.user_id == user_id)
        if agent_id is not None:
            stmt = stmt.where(Memory.agent_id == agent_id)
        if statuses is not None:
            stmt = stmt.where(Memory.status.in_(statuses))
        if after is not None:
            stmt = stmt.where(tuple_(Memory.created_at, Memory.id) > tuple_(*after))
        stmt = stmt.order_by(Memory.created_at, Memory.id).limit(limit)
        return (await self.session.scalars(stmt)).all()

    async def nearest_active(
        self, tenant_id: uuid.UUID, user_id: str, embedding: list[float], limit: int
    ) -> Sequence[Memory]:
        """Exact nearest neighbours (cosine) among the scope's active memories."""
        stmt = (
            select(Memory)
            .where(Memory.tenant_id == tenant_id, Memory.user_id == user_id, Memory.status == "active")
            .order_by(Memory.embedding.cosine_distance(embedding), Memory.created_at)
            .limit(limit)
        )
        return (await self.session.scalars(stmt)).all()

    async def lock(
        self, tenant_id: uuid.UUID, user_id: str, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, Memory]:
        """Row-lock memories of one scope (in id order, so concurrent lockers cannot deadlock)."""
        if not ids:
            return {}
        rows = await self.session.scalars(
            select(Memory)
            .where(Memory.tenant_id == tenant_id, Memory.user_id == user_id, Memory.id.in_(ids))
            .order_by(Memory.id)
            .with_for_update()
        )
        return {m.id: m for m in rows}

    def add(self, memory: Memory) -> None:
        self.session.add(memory)


class VersionRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    def add(self, version: MemoryVersion) -> None:
        self.session.add(version)

    async def history(self, tenant_id: uuid.UUID, memory_id: uuid.UUID) -> Sequence[MemoryVersion]:
        stmt = (
            select(MemoryVersion)
            .where(MemoryVersion.tenant_id == tenant_id, MemoryVersion.memory_id == memory_id)
            .order_by(MemoryVersion.version)
        )
        return (await self.session.scalars(stmt)).all()


class ChangesetRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    def add(self, changeset: Changeset) -> None:
        self.session.add(changeset)

    async def for_user(self, tenant_id: uuid.UUID, user_id: str) -> Sequence[Changeset]:
        stmt = (
            select(Changeset)
            .where(Changeset.tenant_id == tenant_id, Changeset.user_id == user_id)
            .order_by(Changeset.created_at, Changeset.id)
        )
        return (await self.session.scalars(stmt)).all()
