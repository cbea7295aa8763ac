"""A claim and a batch's mark read a handful of blocks of `chunks`, however long the scope's history
and however deep the tenant's backlog: a drain's first claim, its later ones, and the mark, with the
generic plans a worker's prepared statements settle on after a few runs, before the table has
statistics and after."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.config import Settings
from app.domain.pipeline.locks import scope_lock_key
from app.domain.pipeline.repositories import PipelineRepository
from tests.conftest import TenantKeys
from tests.integration.pipeline.test_core_loop import pipeline_deps

HISTORY = 2_000  # chunks the long-lived user has had applied
BACKLOG = 2_000  # chunks another user of the tenant has waiting
# A statement's reads of `chunks` and its indexes: its row found through one index entry, and the
# row's new version written into each index (some 20 to 30 blocks here). Walking a scope's history or
# the tenant's backlog reads hundreds.
MOST_BLOCKS = 40

_ADD_CHUNKS = text(
    "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, body_hash, status)"
    ' SELECT gen_random_uuid(), :tenant_id, :user_id, g, \'[{"role": "user", "content": "hi"}]\','
    " md5(g::text), CASE WHEN g <= :applied THEN 'applied' ELSE 'queued' END"
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
            {"tenant_id": tenant.tenant_id, "user_id": "long", "applied": HISTORY, "count": HISTORY + 4},
        )
        await session.execute(
            _ADD_CHUNKS, {"tenant_id": tenant.tenant_id, "user_id": "backlog", "applied": 0, "count": BACKLOG}
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
