"""The fair scheduler's ready sets: a scope is queued once however many wake-ups it gets, a wake-up
racing a turn is never lost, and what a turn leaves is ready again behind the others."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.pipeline.scheduler import BAND, PREFIX, queues
from tests.conftest import TenantKeys
from tests.support.waiting import wait_for
from tests.support.workers import chunk_counts, running_worker, wait_for_chunks

MESSAGE = [{"role": "user", "content": "I live in Oslo."}]


async def ready(redis: aioredis.Redis, tenant: TenantKeys) -> dict[str, float]:
    found = await redis.zrange(f"{PREFIX}ready:{tenant.tenant_id}", 0, -1, withscores=True)
    return {user.decode(): score for user, score in found}


async def test_wake_ups_of_a_scope_fold_into_one_entry_and_a_backfill_waits_behind_live_ones(
    settings: Settings,
    client: AsyncTestClient[Litestar],
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    redis = aioredis.from_url(settings.redis_url)
    try:
        for _ in range(5):  # five requests, one scope, no worker yet
            response = await client.post(
                "/v1/chunks", json={"user_id": "ann", "messages": MESSAGE}, headers=tenant.admin
            )
            assert response.status_code == 202, response.text
        backfill = {"chunks": [{"user_id": "bob", "messages": MESSAGE}], "priority": "backfill"}
        response = await client.post("/v1/chunks/batch", json=backfill, headers=tenant.admin)
        assert response.status_code == 202, response.text
        # The API answers 202 before it makes the scopes ready.
        scores = await wait_for(
            lambda: ready(redis, tenant), lambda r: {"ann", "bob"} <= set(r), timeout_s=5, what="both ready"
        )
        assert set(scores) == {"ann", "bob"}
        assert scores["ann"] < BAND <= scores["bob"], scores
        [queue] = [q for q in await queues(redis) if q.tenant_id == str(tenant.tenant_id)]
        assert (queue.ready, queue.running, queue.paused) == (2, 0, False)

        async with running_worker(settings):
            assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 6, timeout_s=20) == {"applied": 6}
            for k in range(3):  # and, the scopes drained, a chunk posted later is applied too
                await client.post(
                    "/v1/chunks", json={"user_id": "ann", "messages": MESSAGE}, headers=tenant.admin
                )
                assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 7 + k, timeout_s=20) == {
                    "applied": 7 + k
                }
            # nothing is left ready once the last turn is given back
            await wait_for(lambda: ready(redis, tenant), lambda r: not r, timeout_s=5, what="none ready")
    finally:
        await redis.aclose()


async def test_a_burst_of_chunks_for_busy_scopes_loses_none(
    settings: Settings,
    client: AsyncTestClient[Litestar],
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """Chunks posted while the scopes' drains run — wake-ups racing the start and the end of each job —
    are all applied, with the sweeper out of the picture; turns of one chunk each make every scope
    ready again behind the others many times."""
    quiet = settings.model_copy(
        update={"sweep_interval_s": 600, "sweep_min_age_s": 600.0, "scheduler_turn_s": 0.001}
    )
    users = [f"u{n}" for n in range(6)]

    async def post(user: str, n: int) -> None:
        body = {"user_id": user, "messages": [{"role": "user", "content": f"My number is {n}."}]}
        response = await client.post("/v1/chunks", json=body, headers=tenant.admin)
        assert response.status_code == 202, response.text

    async with running_worker(quiet):
        for n in range(8):
            await asyncio.gather(*(post(u, n) for u in users))
            await asyncio.sleep(0.01 * (n % 3))  # time itself: bursts apart, as clients post
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 48, timeout_s=30) == {"applied": 48}
    assert await chunk_counts(sessionmaker, tenant.tenant_id) == {"applied": 48}
