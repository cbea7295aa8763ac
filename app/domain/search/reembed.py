"""Re-embedding every memory with another embedder, in batches that each commit, so a run resumes.

`embedding_config` names the embedder of the stored vectors. A run records its target embedder and,
after each batch, the last memory id it finished (memories are walked in id order); a run started
again with the same embedder continues from there; one with another embedder starts over. When the
walk ends the target becomes the recorded embedder. While a run is under way, searches with the
target embedder are allowed (the bank is partly re-embedded); others are refused.

Version rows keep the vectors they were written with (history is append-only); `as_of` searches use
the re-embedded vector of a memory whose content is unchanged since, which covers most of the past,
and an undo that brings an older text back embeds it again (`HistoryRepository.stale_vectors`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Table, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import EmbeddingConfig, Memory
from app.embeddings import Embedder

MEMORIES: Table = Memory.__table__  # type: ignore[assignment]


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
            config.target_name, config.cursor = embedder.name, None
        cursor = config.cursor
        done = 0
        if cursor is not None:
            done = int(
                await session.scalar(
                    select(func.count()).select_from(MEMORIES).where(MEMORIES.c.id <= cursor)
                )
                or 0
            )
    resumed_from = done
    if progress:
        progress(done, total)
    batches = 0
    m = MEMORIES.c
    write = update(MEMORIES).where(m.id == bindparam("b_id")).values(embedding=bindparam("b_embedding"))
    while max_batches is None or batches < max_batches:
        async with sessionmaker() as session, session.begin():
            stmt = select(m.id, m.content).order_by(m.id).limit(batch_size)
            if cursor is not None:
                stmt = stmt.where(m.id > cursor)
            rows = (await session.execute(stmt)).all()
            if not rows:
                await session.execute(
                    update(EmbeddingConfig)
                    .where(EmbeddingConfig.id == 1)
                    .values(
                        name=embedder.name,
                        target_name=None,
                        cursor=None,
                        updated_at=func.now(),
                        changed_at=func.now(),
                    )
                )
                return ReembedOutcome(embedder.name, previous, total, done, resumed_from, finished=True)
            vectors = await embedder.embed([r.content for r in rows])
            connection = await session.connection()
            await connection.execute(
                write, [{"b_id": r.id, "b_embedding": v} for r, v in zip(rows, vectors, strict=True)]
            )
            cursor = rows[-1].id
            await session.execute(
                update(EmbeddingConfig)
                .where(EmbeddingConfig.id == 1)
                .values(cursor=cursor, updated_at=func.now())
            )
        done += len(rows)
        batches += 1
        if progress:
            progress(min(done, total), total)
    return ReembedOutcome(embedder.name, previous, total, done, resumed_from, finished=False)
