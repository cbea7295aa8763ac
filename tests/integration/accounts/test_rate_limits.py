"""The two request limits: per end user (a scope's chunks) and per API key, both held in Redis.

A chat backend posts every user's turns with one key; a user who floods is refused while the app's
other users, behind the same key, are not. A busy key's tokens are leased a few at a time, so it costs
Redis a round trip per lease, not per request, and processes sharing a bucket overshoot it by at most
a lease each."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Chunk
from app.lib.ratelimit import Limit, RateLimiter, lease_size
from app.server.asgi import create_app
from tests.conftest import TenantKeys

Client = AsyncTestClient[Litestar]


def _chunk(user: str, text: str) -> dict[str, Any]:
    return {"user_id": user, "messages": [{"role": "user", "content": text}]}


async def _chunks_of(sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys, user: str) -> int:
    async with sessionmaker() as session:
        count = await session.scalar(
            select(func.count()).where(Chunk.tenant_id == tenant.tenant_id, Chunk.user_id == user)
        )
    return int(count or 0)


async def test_a_flooding_user_is_refused_while_the_other_users_of_the_same_key_are_not(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    limited = settings.model_copy(update={"user_rate_limit_per_s": 1.0, "user_rate_limit_burst": 5})
    async with AsyncTestClient(create_app(limited, configure_logs=False)) as client:
        flood, calm = await asyncio.gather(
            asyncio.gather(
                *(
                    client.post("/v1/chunks", json=_chunk("flood", f"n {n}"), headers=tenant.admin)
                    for n in range(20)
                )
            ),
            asyncio.gather(
                *(
                    client.post("/v1/chunks", json=_chunk(f"calm-{n}", "hi"), headers=tenant.admin)
                    for n in range(20)
                )
            ),
        )
    assert [r.status_code for r in calm] == [202] * 20
    statuses = [r.status_code for r in flood]
    assert set(statuses) == {202, 429}
    assert 5 <= statuses.count(202) <= 7  # the burst, and what a second or so refills
    refused = next(r for r in flood if r.status_code == 429)
    error = refused.json()["error"]
    assert error["code"] == "rate_limited"
    assert error["details"] == {"scope": "user", "user_id": "flood", "rate_per_s": 1.0, "burst": 5}
    assert int(refused.headers["retry-after"]) >= 1
    # A refused request wrote nothing.
    assert await _chunks_of(sessionmaker, tenant, "flood") == statuses.count(202)


async def test_a_batch_is_charged_per_chunk_and_refused_whole(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    limited = settings.model_copy(update={"user_rate_limit_per_s": 0.01, "user_rate_limit_burst": 5})
    async with AsyncTestClient(create_app(limited, configure_logs=False)) as client:
        first = await client.post(
            "/v1/chunks/batch",
            json={"chunks": [_chunk("a", f"n {n}") for n in range(4)]},
            headers=tenant.admin,
        )
        assert first.status_code == 202, first.text
        # One token of a's left: a batch with two more of a's chunks fails whole, b's chunk included.
        second = await client.post(
            "/v1/chunks/batch",
            json={"chunks": [_chunk("b", "b's"), _chunk("a", "n 4"), _chunk("a", "n 5")]},
            headers=tenant.admin,
        )
        assert second.status_code == 429, second.text
        details = second.json()["error"]["details"]
        assert (details["scope"], details["user_id"]) == ("user", "a")  # a's, not the first chunk's user
        # A batch larger than the burst is let through when the user's bucket is full: b's is.
        big = await client.post(
            "/v1/chunks/batch",
            json={"chunks": [_chunk("b", f"n {n}") for n in range(8)]},
            headers=tenant.admin,
        )
        assert big.status_code == 202, big.text
    assert await _chunks_of(sessionmaker, tenant, "a") == 4
    assert await _chunks_of(sessionmaker, tenant, "b") == 8


def test_a_lease_is_about_20_ms_of_the_rate_at_most_a_tenth_of_the_burst() -> None:
    assert lease_size(Limit(5_000, 10_000)) == 100
    assert lease_size(Limit(5_000, 200)) == 20
    assert lease_size(Limit(200, 400)) == 4
    assert lease_size(Limit(50, 100)) == 1  # a small limit: every request asks Redis, exactly


async def _evalsha_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in {"cmdstat_evalsha", "cmdstat_eval"})


@pytest.mark.parametrize("processes", [1, 3])
async def test_a_busy_key_asks_redis_once_a_lease_and_processes_overshoot_by_a_lease_each(
    redis_url: str, processes: int
) -> None:
    limit = Limit(rate_per_s=500, burst=100)  # leases of 10 tokens
    counter = aioredis.Redis.from_url(redis_url)
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(processes)]
    limiters = [RateLimiter(c) for c in clients]
    key = f"lease-test-{processes}-{time.monotonic_ns()}"
    try:
        calls_before = await _evalsha_calls(counter)
        started = time.monotonic()
        admitted = 0
        for _ in range(400 // processes):
            waits = await asyncio.gather(*(limiter.wait_s(key, limit) for limiter in limiters))
            admitted += sum(1 for w in waits if w == 0)
        elapsed = time.monotonic() - started
        calls = await _evalsha_calls(counter) - calls_before
    finally:
        for c in [counter, *clients]:
            await c.aclose()
    refilled = limit.rate_per_s * elapsed
    assert admitted <= limit.burst + refilled + processes * lease_size(limit)
    assert admitted >= min(400 // processes * processes, limit.burst)
    # Every admitted request came out of a lease of up to 10: a round trip per lease, and one per refusal.
    refused = (400 // processes) * processes - admitted
    assert calls <= admitted / 2 + refused + processes
