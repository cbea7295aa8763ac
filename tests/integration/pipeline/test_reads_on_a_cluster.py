"""On a Citus cluster a connection's session setting stays on the coordinator: only the `SET LOCAL` a
BEGIN carries reaches the shards, where the row-level security policies read the tenants. A worker on
a distributed database (`PipelineDeps.distributed`) claims and reads in transactions, so a scope drains
there. Here the session copy of the tenants is withheld, as a shard never has it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db import tenancy
from app.db.engine import create_engine
from app.db.models import Chunk
from app.domain.pipeline.services import PipelineDeps, process_scope
from app.embeddings import embedder_from_settings
from app.writers.registry import WriterRegistry
from tests.conftest import TenantKeys
from tests.support.scenario import post_users

Client = AsyncTestClient[Litestar]


@pytest.fixture
async def shard_like_engine(
    pipeline_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[AsyncEngine]:
    """The service's engine, its connections given no session setting of the tenants (a no-op round
    trip in its place): only transactions see a tenant's rows."""
    monkeypatch.setattr(tenancy, "_SET", "SELECT $1::text")
    engine = create_engine(pipeline_settings, application_name="memstore-test-shard-like")
    yield engine
    await engine.dispose()


async def _drain(settings: Settings, engine: AsyncEngine, tenant: TenantKeys, *, distributed: bool) -> int:
    deps = PipelineDeps(
        engine=engine,
        settings=settings,
        writers=WriterRegistry(settings),
        embedder=embedder_from_settings(settings),
        worker_name="test",
        distributed=distributed,
    )
    try:
        return (await process_scope(deps, tenant.tenant_id, "sharded")).applied
    finally:
        await deps.aclose()


async def test_a_worker_on_a_distributed_database_claims_and_reads_in_transactions(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    shard_like_engine: AsyncEngine,
) -> None:
    accepted = await post_users(api, ingest_headers, ["sharded"])
    # Autocommit statements carry no tenants here: nothing is claimed.
    assert await _drain(pipeline_settings, shard_like_engine, tenant, distributed=False) == 0
    applied = await _drain(pipeline_settings, shard_like_engine, tenant, distributed=True)
    assert applied == len(accepted)
    async with sessionmaker() as session:
        statuses = (
            await session.scalars(select(Chunk.status).where(Chunk.tenant_id == tenant.tenant_id))
        ).all()
    assert set(statuses) == {"applied"}
