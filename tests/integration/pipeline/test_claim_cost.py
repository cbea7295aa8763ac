"""A claim and a batch's mark read a handful of blocks of `chunks`, however long the scope's history
and however deep the tenant's backlog: a drain's first claim, its later ones, and the mark, with the
generic plans a worker's prepared statements settle on after a few runs, before the table has
statistics and after."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import ClassVar

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.config import Settings
from app.db.models import Chunk
from app.domain.pipeline.locks import scope_lock_key
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.pipeline.services import process_scope
from app.writers.base import WriteRequest, WriteResult
from app.writers.offline import OfflineWriter
from tests.conftest import TenantKeys
from tests.integration.pipeline.test_core_loop import pipeline_deps

HISTORY = 2_000  # chunks the long-lived user has had applied
BACKLOG = 2_000  # chunks another user of the tenant has waiting
# A statement's reads of `chunks` and its indexes: its row found through one index entry, and the
# row's new version written into each index (some 20 to 30 blocks here). Walking a scope's history or
# the tenant's backlog reads hundreds.
MOST_BLOCKS = 40

_ADD_CHUNKS = text(
    "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, body_hash, status, writer)"
    ' SELECT gen_random_uuid(), :tenant_id, :user_id, g, \'[{"role": "user", "content": "hi"}]\','
    " md5(g::text), CASE WHEN g <= :applied THEN 'applied' ELSE 'queued' END, :writer"
    " FROM generate_series(1, :count) AS g"
)

# Blocks this transaction has asked of `chunks` and its indexes so far (the backend's own counters,
# exact and not yet flushed anywhere).
_BLOCKS = text(
    "SELECT sum(pg_stat_get_xact_blocks_fetched(oid)) FROM pg_class WHERE oid = 'chunks'::regclass"
    " OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'chunks'::regclass)"
)


async def blocks(session: AsyncSession) -> int:
    return int(await session.scalar(_BLOCKS) or 0)


async def test_a_claim_and_its_mark_read_a_few_blocks_whatever_the_history_and_the_backlog(
    tenant: TenantKeys, pipeline_settings: Settings, engine: AsyncEngine
) -> None:
    async with AsyncSession(engine) as session, session.begin():
        await session.execute(
            _ADD_CHUNKS,
            {
                "tenant_id": tenant.tenant_id,
                "user_id": "long",
                "applied": HISTORY,
                "count": HISTORY + 4,
                "writer": None,
            },
        )
        await session.execute(
            _ADD_CHUNKS,
            {
                "tenant_id": tenant.tenant_id,
                "user_id": "backlog",
                "applied": 0,
                "count": BACKLOG,
                "writer": None,
            },
        )
    async with pipeline_deps(pipeline_settings, engine) as deps:
        lease = await deps.locks.try_acquire(scope_lock_key(tenant.tenant_id, "long"))
        assert lease is not None
        claims = 0
        for statistics in ("none yet", "analyzed"):
            if statistics == "analyzed":
                async with engine.connect() as connection:
                    await connection.execute(text("ANALYZE chunks"))
                    await connection.commit()
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
                repo = PipelineRepository(session)
                read = [await blocks(session)]
                first = await repo.claim_next(tenant.tenant_id, "long", 5, lease)
                read.append(await blocks(session))
                assert first.claimed is not None
                marked = await repo.mark_applied([(first.claimed, uuid.uuid4())])
                read.append(await blocks(session))
                later = await repo.claim_next(tenant.tenant_id, "long", 5, lease, from_seq=first.claimed.seq)
                read.append(await blocks(session))
                assert later.claimed is not None
                marked |= await repo.mark_applied([(later.claimed, uuid.uuid4())])
            # The oldest unfinished chunks, after the whole history, in order.
            assert (first.claimed.seq, later.claimed.seq) == (claims + HISTORY + 1, claims + HISTORY + 2)
            assert marked == {first.claimed.id, later.claimed.id}
            costs = dict(
                zip(("first claim", "mark", "later claim"), map(int.__sub__, read[1:], read), strict=True)
            )
            assert max(costs.values()) <= MOST_BLOCKS, (statistics, costs)
            claims += 2


class RetryingWriter(OfflineWriter):
    """The offline writer that, on its first call, does what an admin's retry of a failed chunk does
    (`during_first_call`): the drain it serves has by then claimed past that chunk."""

    during_first_call: ClassVar[Callable[[], Awaitable[None]] | None] = None

    def __init__(self, name: str = "retrying") -> None:
        super().__init__(name=name)

    async def write(self, request: WriteRequest) -> WriteResult:
        cls = type(self)
        if cls.during_first_call is not None:
            action, cls.during_first_call = cls.during_first_call, None
            await action()
        return await super().write(request)


async def test_a_chunk_retried_behind_a_drain_is_taken_up_by_the_same_job(
    tenant: TenantKeys, pipeline_settings: Settings, engine: AsyncEngine
) -> None:
    """A drain's later claims read on from its place, so a failed chunk an admin retries meanwhile lies
    behind them; the drain's look at the scope after releasing its lock finds it, in the same job."""
    settings = pipeline_settings.model_copy(
        update={
            "writer_plugins": {
                **pipeline_settings.writer_plugins,
                "retrying": f"{__name__}:RetryingWriter",
            }
        }
    )
    async with AsyncSession(engine) as session, session.begin():
        await session.execute(
            _ADD_CHUNKS,
            {"tenant_id": tenant.tenant_id, "user_id": "u", "applied": 0, "count": 3, "writer": "retrying"},
        )
        await session.execute(
            text("UPDATE chunks SET status = 'failed', attempts = 3 WHERE tenant_id = :t AND seq = 1"),
            {"t": tenant.tenant_id},
        )

    async def retry_the_first() -> None:  # as `POST /v1/admin/chunks/{id}/retry` leaves it
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(
                text(
                    "UPDATE chunks SET status = 'queued', attempts = 0, available_at = now()"
                    " WHERE tenant_id = :t AND seq = 1"
                ),
                {"t": tenant.tenant_id},
            )

    RetryingWriter.during_first_call = retry_the_first
    async with pipeline_deps(settings, engine) as deps:
        run = await process_scope(deps, tenant.tenant_id, "u")
    assert RetryingWriter.during_first_call is None  # the retry happened, during chunk 2's call
    async with AsyncSession(engine) as session:
        rows = await session.execute(
            select(Chunk.seq, Chunk.status).where(Chunk.tenant_id == tenant.tenant_id)
        )
        statuses = dict(rows.all())
    assert statuses == {1: "applied", 2: "applied", 3: "applied"}
    assert run.applied == 3
