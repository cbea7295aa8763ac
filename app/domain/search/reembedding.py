"""One batch of a re-embedding: a tenant's next memories in id order, and their new vectors written
where each memory still holds the text they were made from. The deployment's re-embedding
(`search.reembed`) and a tenant's move to its own embedder (`search.tenant_embedder`) walk with these."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Memory
from app.domain.memories.version_writer import VersionWriter
from app.embeddings import Embedder

MEMORIES: Table = Memory.__table__  # type: ignore[assignment]


async def next_batch(
    session: AsyncSession, tenant_id: uuid.UUID | None, after: uuid.UUID | None, size: int
) -> dict[uuid.UUID, str]:
    """The tenant's next `size` memories after memory `after` (from its first if None): their texts by
    id, in id order."""
    if tenant_id is None:
        return {}
    m = MEMORIES.c
    stmt = select(m.id, m.content).where(m.tenant_id == tenant_id).order_by(m.id).limit(size)
    if after is not None:
        stmt = stmt.where(m.id > after)
    return {row.id: row.content for row in await session.execute(stmt)}


async def reembed_batch(
    sessionmaker: async_sessionmaker[AsyncSession],
    embedder: Embedder,
    tenant_id: uuid.UUID,
    texts: dict[uuid.UUID, str],
    move_cursor: Callable[[AsyncSession], Awaitable[None]],
) -> None:
    """Embed a batch of the tenant's memories and store their vectors; the last transaction also
    moves the run's cursor past them (`move_cursor`). Memories whose text changed meanwhile are read
    again and embedded again, until every memory of the batch has the vector of the text it holds (a
    purged one drops out)."""
    pending = texts
    while pending:
        vectors = await embedder.embed(list(pending.values()))
        async with sessionmaker() as session, session.begin():
            written = await VersionWriter(session).write_vectors(tenant_id, pending, vectors)
            changed = [memory_id for memory_id in pending if memory_id not in written]
            pending = {}
            if changed:
                rows = await session.execute(
                    select(MEMORIES.c.id, MEMORIES.c.content).where(
                        MEMORIES.c.tenant_id == tenant_id, MEMORIES.c.id.in_(changed)
                    )
                )
                pending = {row.id: row.content for row in rows}
            if not pending:
                await move_cursor(session)
