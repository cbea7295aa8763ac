"""Re-embedding every memory with another embedder, in batches that each commit, so a run resumes.

`embedding_config` names the embedder of the stored vectors. A run records its target embedder and,
after each batch, the last memory it finished, its tenant and id: memories are walked tenant by tenant
(in the order of their ids), each in id order, and every statement reads or writes one tenant's rows
(the schema distributes by tenant, docs/operations.md). A run started again with the same embedder
continues from there; one with another embedder starts over. Tenants with an embedder of their own
(`search.tenant_embedder`) keep it and are passed over. When the
walk ends the target becomes the recorded embedder. While a run is under way, searches with the
target embedder are allowed (the bank is partly re-embedded); others are refused.

No network call is made with a transaction open: a batch is read, the read ends, the texts are
embedded, and a second transaction writes the vectors (`VersionWriter.write_vectors`) and moves the
cursor. A memory edited while its batch was embedded must not get the vector of the text it no longer
holds, so each vector is written only where the memory still holds the text it was made from (an edit
committing meanwhile holds the row until it commits, and the UPDATE then checks the edited row); the
memories whose text changed are read again and embedded again before the cursor passes them. (Edits
made behind the cursor come from processes with the new embedder: those with the old one are stopped
before a run, as the CLI says.)

Version rows keep the vectors they were written with (history is append-only); `as_of` searches use
the re-embedded vector of a memory whose content is unchanged since, which covers most of the past,
and an undo that brings an older text back embeds it again (`HistoryRepository.stale_vectors`).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy import Table, func, select, true, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import EmbeddingConfig, Memory, Tenant
from app.domain.search.reembedding import next_batch, reembed_batch
from app.domain.search.tenant_embedder import OWN, SWITCH
from app.embeddings import Embedder

MEMORIES: Table = Memory.__table__  # type: ignore[assignment]
TENANTS: Table = Tenant.__table__  # type: ignore[assignment]


class ReembedError(RuntimeError):
    """The re-embedding cannot be done (e.g. the new model's dimension differs from the column's)."""


@dataclass
class ReembedOutcome:
    embedder: str
    previous: str | None
    total: int
    done: int
    resumed_from: int  # memories already re-embedded by an earlier, interrupted run
    finished: bool


async def reembed(
    sessionmaker: async_sessionmaker[AsyncSession],
    embedder: Embedder,
    *,
    batch_size: int = 256,
    force: bool = False,
    max_batches: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReembedOutcome:
    """Re-embed memories with `embedder` until done (or `max_batches` batches, for a partial run)."""
    async with sessionmaker() as session, session.begin():
        await session.execute(
            insert(EmbeddingConfig)
            .values(id=1, name=embedder.name, dim=embedder.dim, target_name=embedder.name)
            .on_conflict_do_nothing(index_elements=["id"])
        )
        config = await session.scalar(
            select(EmbeddingConfig).where(EmbeddingConfig.id == 1).with_for_update()
        )
        assert config is not None
        previous = config.name
        if config.dim != embedder.dim:
            msg = (
                f"embedder {embedder.name!r} makes {embedder.dim}-dimensional vectors; the store holds "
                f"{config.dim} (a new dimension needs a schema migration of the vector columns)"
            )
            raise ReembedError(msg)
        total = int(await session.scalar(select(func.count()).select_from(MEMORIES)) or 0)
        if config.name == embedder.name and config.target_name is None and not force:
            return ReembedOutcome(embedder.name, previous, total, total, total, finished=True)
        if config.target_name != embedder.name:
            config.target_name, config.cursor_tenant_id, config.cursor = embedder.name, None, None
        # The last memory done: its tenant (None before the first) and id (None: none of it yet).
        tenant_id, cursor = config.cursor_tenant_id, config.cursor
        done = 0
        if tenant_id is not None and cursor is not None:
            walked = tuple_(MEMORIES.c.tenant_id, MEMORIES.c.id) <= tuple_(tenant_id, cursor)
            done = int(await session.scalar(select(func.count()).select_from(MEMORIES).where(walked)) or 0)
    resumed_from = done
    if progress:
        progress(done, total)
    batches = 0
    while max_batches is None or batches < max_batches:
        async with sessionmaker() as session:  # closed (its read transaction ended) before embedding
            rows = await next_batch(session, tenant_id, cursor, batch_size)
            while not rows:  # the tenant is done: on to the next one that has memories
                tenant_id = await session.scalar(
                    select(TENANTS.c.id)
                    .where(TENANTS.c.id > tenant_id if tenant_id is not None else true())
                    .where(~TENANTS.c.settings.has_key(OWN), ~TENANTS.c.settings.has_key(SWITCH))
                    .order_by(TENANTS.c.id)
                    .limit(1)
                )
                cursor = None
                if tenant_id is None:
                    break
                rows = await next_batch(session, tenant_id, cursor, batch_size)
        if tenant_id is None:
            async with sessionmaker() as session, session.begin():
                await session.execute(
                    update(EmbeddingConfig)
                    .where(EmbeddingConfig.id == 1)
                    .values(
                        name=embedder.name,
                        target_name=None,
                        cursor_tenant_id=None,
                        cursor=None,
                        updated_at=func.now(),
                        changed_at=func.now(),
                    )
                )
            return ReembedOutcome(embedder.name, previous, total, done, resumed_from, finished=True)
        cursor = next(reversed(rows))
        await reembed_batch(sessionmaker, embedder, tenant_id, rows, _global_cursor(tenant_id, cursor))
        done += len(rows)
        batches += 1
        if progress:
            progress(min(done, total), total)
    return ReembedOutcome(embedder.name, previous, total, done, resumed_from, finished=False)


def _global_cursor(tenant_id: uuid.UUID, cursor: uuid.UUID) -> Callable[[AsyncSession], Awaitable[None]]:
    async def move(session: AsyncSession) -> None:
        await session.execute(
            update(EmbeddingConfig)
            .where(EmbeddingConfig.id == 1)
            .values(cursor_tenant_id=tenant_id, cursor=cursor, updated_at=func.now())
        )

    return move
