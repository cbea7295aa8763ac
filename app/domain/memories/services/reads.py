"""Reading memories: a page of a scope's bank as it stands or as it stood at a time, one memory, and
one memory's versions."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Memory, MemoryVersion
from app.domain.memories.repositories import MemoryAsOf, MemoryRepository, VersionRepository
from app.domain.memories.services.cursors import decode_cursor, encode_cursor
from app.lib.errors import NotFoundError


async def list_memories(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    user_id: str,
    *,
    agent_id: str | None,
    status: str,
    cursor: str | None,
    limit: int,
    as_of: datetime | None = None,
) -> tuple[Sequence[Memory | MemoryAsOf], str | None]:
    """A page of the scope's memories as they stand now, or as they stood at `as_of`."""
    statuses = None if status == "all" else [status]
    after = decode_cursor(cursor) if cursor else None
    repo = MemoryRepository(session)
    if as_of is not None:
        page: Sequence[Memory | MemoryAsOf] = await repo.bank_as_of(
            tenant_id, user_id, as_of, agent_id=agent_id, statuses=statuses, after=after, limit=limit + 1
        )
    else:
        page = await repo.page(
            tenant_id, user_id, agent_id=agent_id, statuses=statuses, after=after, limit=limit + 1
        )
    if len(page) > limit:
        return page[:limit], encode_cursor(page[limit - 1])
    return page, None


async def get_memory(session: AsyncSession, tenant_id: uuid.UUID, memory_id: uuid.UUID) -> Memory:
    memory = await MemoryRepository(session).get(tenant_id, memory_id)
    if memory is None:
        raise NotFoundError("No such memory.")
    return memory


async def memory_history(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: uuid.UUID
) -> Sequence[MemoryVersion]:
    versions = await VersionRepository(session).history(tenant_id, memory_id)
    if not versions:
        raise NotFoundError("No such memory.")
    return versions
