"""SQL of answering: where each memory handed to the read model comes from."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import MemoryVersion


@dataclass(frozen=True)
class VersionSource:
    """The provenance of one version of a memory (architecture invariant 6)."""

    memory_id: uuid.UUID
    version: int
    changeset_id: uuid.UUID
    chunk_id: uuid.UUID | None
    writer: str | None
    model: str | None
    created_at: datetime


class AnswerRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def sources(
        self, tenant_id: uuid.UUID, versions: Sequence[tuple[uuid.UUID, int]]
    ) -> dict[tuple[uuid.UUID, int], VersionSource]:
        """(memory id, version) -> that version's provenance, for the versions of this tenant."""
        if not versions:
            return {}
        rows = await self.session.execute(
            select(
                MemoryVersion.memory_id,
                MemoryVersion.version,
                MemoryVersion.changeset_id,
                MemoryVersion.chunk_id,
                MemoryVersion.writer,
                MemoryVersion.model,
                MemoryVersion.created_at,
            ).where(
                MemoryVersion.tenant_id == tenant_id,
                tuple_(MemoryVersion.memory_id, MemoryVersion.version).in_(list(versions)),
            )
        )
        return {(r.memory_id, r.version): VersionSource(*r) for r in rows}
