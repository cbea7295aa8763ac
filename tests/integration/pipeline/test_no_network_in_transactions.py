"""A worker never waits on the embedder with a transaction open: while each embedding request is held
unanswered, none of the worker's connections is inside a transaction or holds a row lock."""

from __future__ import annotations

import asyncio

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys
from tests.support.fake_llm import FakeLLM
from tests.support.scenario import post_users
from tests.support.workers import chunk_counts, running_worker

Client = AsyncTestClient[Litestar]

# Connections of `application` inside a transaction: idle in one, or holding a transaction id (a
# written or row-locked row).
IN_TRANSACTION = text(
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = :application"
    " AND (state LIKE 'idle in transaction%' OR backend_xid IS NOT NULL)"
)


async def in_transaction(sessionmaker: async_sessionmaker[AsyncSession], application: str) -> int:
    async with sessionmaker() as session:
        return int(await session.scalar(IN_TRANSACTION, {"application": application}) or 0)


async def test_the_worker_embeds_with_no_transaction_open(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    facts = ["I live in Oslo.", "I like tea."]
    accepted = await post_users(api, ingest_headers, ["held"], facts=facts)
    seen: list[int] = []  # worker connections in a transaction, at each held embedding request
    async with FakeLLM() as embeddings:
        settings = pipeline_settings.model_copy(
            update={"embedder": "openai", "embedder_base_url": embeddings.base_url}
        )
        async with running_worker(settings):
            while (await chunk_counts(sessionmaker, tenant.tenant_id)).get("applied", 0) < len(accepted):
                with embeddings.held_embeddings() as arrived:
                    if await asyncio.to_thread(arrived.wait, 0.5):
                        seen.append(await in_transaction(sessionmaker, "memstore-worker"))
    # Each chunk embeds its candidate search, and then the texts it stores (before the apply).
    assert len(seen) >= 2 * len(facts)
    assert seen == [0] * len(seen)
