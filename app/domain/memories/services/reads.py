"""Reading memories: a page of a scope's bank as it stands or as it stood at a time, one memory, and
one memory's versions."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Memory, MemoryVersion
from app.domain.memories.repositories import MemoryAsOf, MemoryRepository, VersionRepository
from app.lib.errors import NotFoundError
from app.lib.paging import Page, cursor_after, decode_keyset, paged


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
    include_expired: bool = False,
    valid_at: datetime | None = None,
) -> Page[Memory | MemoryAsOf]:
    """A page of the scope's memories as they stand now, or as they stood at `as_of`; those expired
    (now, or at `as_of`) only with `include_expired`. With `valid_at`, those whose fact held at that
    time: with the default status (`active`), those superseded since as well (a replaced fact held
    until it was replaced)."""
    statuses = None if status == "all" else [status]
    if valid_at is not None and status == "active":
        statuses = ["active", "superseded"]
    after = decode_keyset(cursor) if cursor else None
    repo = MemoryRepository(session)

    async def fetch(n: int) -> Sequence[Memory | MemoryAsOf]:
        if as_of is not None:
            return await repo.bank_as_of(
                tenant_id,
                user_id,
                as_of,
                agent_id=agent_id,
                statuses=statuses,
                after=after,
                limit=n,
                include_expired=include_expired,
                valid_at=valid_at,
            )
        return await repo.page(
            tenant_id,
            user_id,
            agent_id=agent_id,
            statuses=statuses,
            after=after,
            limit=n,
            include_expired=include_expired,
            valid_at=valid_at,
        )

    return await paged(fetch, limit, cursor_after)


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
