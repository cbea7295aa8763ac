"""A worker never waits on the embedder with a transaction open: while each embedding request is held
unanswered, none of the worker's connections holds a row lock on chunks or memories."""

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

# Row locks (FOR UPDATE, or a write) that connections of `application` hold on chunks or memories:
# held by a transaction still open. (Its cron jobs may be in a transaction of their own meanwhile,
# on the audit log, so an open transaction alone proves nothing.)
IN_TRANSACTION = text(
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE a.application_name = :application"
    " AND l.relation IN ('chunks'::regclass, 'memories'::regclass)"
    " AND l.mode IN ('RowShareLock', 'RowExclusiveLock')"
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
    seen: list[int] = []  # the worker's row locks, at each held embedding request
    async with FakeLLM() as embeddings:
        settings = pipeline_settings.model_copy(
            update={"embedder": "openai", "embedder_base_url": embeddings.base_url}
        )
        async with running_worker(settings):
            done = False
            while not done:  # one request held at a time, and none let through unheld in between
                with embeddings.held_embeddings() as arrived:
                    if await asyncio.to_thread(arrived.wait, 0.5):
                        seen.append(await in_transaction(sessionmaker, "memstore-worker"))
                    else:
                        counts = await chunk_counts(sessionmaker, tenant.tenant_id)
                        done = counts.get("applied", 0) == len(accepted)
    # Each chunk embeds its candidate search's texts, which are those it stores (taken from the
    # worker's cache then, before the apply): one request a chunk.
    assert len(seen) >= len(facts)
    assert seen == [0] * len(seen)
