"""One job per scope drain, not one per chunk: wake-ups for a scope whose job has not started its
drain are folded into that job; a wake-up after the start makes the next job, so nothing is missed."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.pipeline.wakeups import scope_job_name
from app.lib.queue import QUEUE_NAME, next_drain
from tests.conftest import TenantKeys
from tests.support.workers import chunk_counts, running_worker, wait_for_chunks

MESSAGE = [{"role": "user", "content": "I live in Oslo."}]


async def queued(redis: aioredis.Redis) -> list[str]:
    return sorted(m.decode() for m in await redis.zrange(QUEUE_NAME, 0, -1) if m.startswith(b"scope:"))


async def queued_once_there(redis: aioredis.Redis, *names: str) -> list[str]:
    """The scope jobs queued, once `names` are among them: the API answers 202 before it enqueues."""
    deadline = time.monotonic() + 5
    while not set(names) <= set(jobs := await queued(redis)) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return jobs


async def test_chunks_posted_before_a_drain_share_its_job_and_later_ones_make_the_next(
    settings: Settings,
    client: AsyncTestClient[Litestar],
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    redis = aioredis.from_url(settings.redis_url)
    name = scope_job_name(tenant.tenant_id, "ann")
    try:
        for _ in range(5):  # five requests, one scope, no worker yet
            response = await client.post(
                "/v1/chunks", json={"user_id": "ann", "messages": MESSAGE}, headers=tenant.admin
            )
            assert response.status_code == 202, response.text
        await client.post("/v1/chunks", json={"user_id": "bob", "messages": MESSAGE}, headers=tenant.admin)
        bob = f"{scope_job_name(tenant.tenant_id, 'bob')}:0"
        assert await queued_once_there(redis, f"{name}:0", bob) == sorted([f"{name}:0", bob])

        # A drain of ann starts (as a worker's job does first): the next wake-up is a new job.
        await next_drain(redis, name)  # type: ignore[arg-type]
        await client.post("/v1/chunks", json={"user_id": "ann", "messages": MESSAGE}, headers=tenant.admin)
        assert f"{name}:1" in await queued_once_there(redis, f"{name}:1")

        async with running_worker(settings):
            assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 7, timeout_s=20) == {"applied": 7}
            for k in range(3):  # and, the queue drained, a chunk posted later is applied too
                await client.post(
                    "/v1/chunks", json={"user_id": "ann", "messages": MESSAGE}, headers=tenant.admin
                )
                assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 8 + k, timeout_s=20) == {
                    "applied": 8 + k
                }
            deadline = time.monotonic() + 5  # a job leaves the queue just after its last apply
            while await queued(redis) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert await queued(redis) == []
    finally:
        await redis.aclose()


async def test_a_burst_of_chunks_for_busy_scopes_loses_none(
    settings: Settings,
    client: AsyncTestClient[Litestar],
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """Chunks posted while the scopes' drains run — wake-ups racing the start and the end of each job —
    are all applied, with the sweeper out of the picture."""
    quiet = settings.model_copy(update={"sweep_interval_s": 600, "sweep_min_age_s": 600.0})
    users = [f"u{n}" for n in range(6)]

    async def post(user: str, n: int) -> None:
        body = {"user_id": user, "messages": [{"role": "user", "content": f"My number is {n}."}]}
        response = await client.post("/v1/chunks", json=body, headers=tenant.admin)
        assert response.status_code == 202, response.text

    async with running_worker(quiet):
        for n in range(8):
            await asyncio.gather(*(post(u, n) for u in users))
            await asyncio.sleep(0.01 * (n % 3))
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 48, timeout_s=30) == {"applied": 48}
    assert await chunk_counts(sessionmaker, tenant.tenant_id) == {"applied": 48}
