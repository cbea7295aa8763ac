"""Faults lose nothing and apply nothing twice: each run under a fault ends with exactly the bank of a
fault-free run of the same input. Workers here are real `memstore worker` processes."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.lib.embedded import EmbeddedRedis
from app.server.asgi import create_app
from tests.conftest import Servers, TenantKeys, bearer, make_tenant
from tests.support.scenario import bank, changesets_per_chunk, order_violations, post_users
from tests.support.workers import (
    chunk_counts,
    running_worker,
    start_worker_process,
    stop_worker_process,
    wait_for_chunks,
    wait_until,
)

Client = AsyncTestClient[Litestar]
USERS = [f"u{i}" for i in range(6)]
TOTAL = len(USERS) * 8


async def reference_bank(
    api: Client, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> dict[str, object]:
    """The bank a fault-free run of the scenario produces (in its own tenant)."""
    tenant = await make_tenant(sessionmaker)
    headers = await _ingest_headers(api, tenant)
    await post_users(api, headers, USERS, writer="slow")
    async with running_worker(settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, TOTAL)
    return await bank(sessionmaker, tenant.tenant_id)


async def _ingest_headers(api: Client, tenant: TenantKeys) -> dict[str, str]:
    response = await api.post(
        "/v1/admin/keys", json={"name": "app", "roles": ["ingest", "read"]}, headers=tenant.admin
    )
    return bearer(response.json()["key"])


async def assert_same_as_reference(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys, reference: dict[str, object]
) -> None:
    assert await bank(sessionmaker, tenant.tenant_id) == reference
    assert await changesets_per_chunk(sessionmaker, tenant.tenant_id) == {1: TOTAL}
    assert await order_violations(sessionmaker, tenant.tenant_id) == []


async def test_worker_killed_mid_run(
    api: Client,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    tmp_path: Path,
) -> None:
    reference = await reference_bank(api, pipeline_settings, sessionmaker)
    slow = {"MEMSTORE_TEST_WRITER_DELAY_S": "0.2"}
    victim = start_worker_process(pipeline_settings, tmp_path / "victim.log", slow)
    survivor = None
    try:
        headers = await _ingest_headers(api, tenant)
        await post_users(api, headers, USERS, writer="slow")

        async def some_applied() -> bool:
            return (await chunk_counts(sessionmaker, tenant.tenant_id)).get("applied", 0) >= 5

        await wait_until(some_applied, 60, "the first worker to apply some chunks")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        assert (await chunk_counts(sessionmaker, tenant.tenant_id)).get("applied", 0) < TOTAL
        survivor = start_worker_process(pipeline_settings, tmp_path / "survivor.log", slow)
        await wait_for_chunks(sessionmaker, tenant.tenant_id, TOTAL, timeout_s=120)
    finally:
        stop_worker_process(victim)
        if survivor is not None:
            stop_worker_process(survivor)
    await assert_same_as_reference(sessionmaker, tenant, reference)


async def test_redis_flushed_and_restarted_mid_run(
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    tmp_path: Path,
) -> None:
    redis = EmbeddedRedis(tmp_path / "redis")
    redis.start()
    settings = pipeline_settings.model_copy(update={"redis_url": redis.url})
    worker = start_worker_process(settings, tmp_path / "worker.log", {"MEMSTORE_TEST_WRITER_DELAY_S": "0.1"})
    try:
        async with AsyncTestClient(create_app(settings, configure_logs=False)) as api:
            reference = await reference_bank(api, settings, sessionmaker)
            headers = await _ingest_headers(api, tenant)
            await post_users(api, headers, USERS[:3], writer="slow")
            client = aioredis.from_url(redis.url)
            await client.flushdb()  # every queued job is gone
            await client.aclose()
            redis.stop()
            # Ingestion goes on while Redis is down; the chunks wait in Postgres.
            await post_users(api, headers, USERS[3:], writer="slow")
            await asyncio.sleep(1.0)  # time itself must pass: an outage that lasts, not a blink
            redis.start()
            await wait_for_chunks(sessionmaker, tenant.tenant_id, TOTAL, timeout_s=120)
    finally:
        stop_worker_process(worker)
        redis.stop()
    await assert_same_as_reference(sessionmaker, tenant, reference)


async def test_postgres_restarted_mid_run(
    api: Client,
    servers: Servers,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    tmp_path: Path,
) -> None:
    if servers.stack is None or servers.stack.postgres is None:
        pytest.skip("needs the embedded Postgres, which the test can restart")
    postgres = servers.stack.postgres
    reference = await reference_bank(api, pipeline_settings, sessionmaker)
    headers = await _ingest_headers(api, tenant)
    worker = start_worker_process(
        pipeline_settings, tmp_path / "worker.log", {"MEMSTORE_TEST_WRITER_DELAY_S": "0.1"}
    )
    try:
        await post_users(api, headers, USERS[:3], writer="slow")

        async def some_applied() -> bool:
            return (await chunk_counts(sessionmaker, tenant.tenant_id)).get("applied", 0) >= 3

        await wait_until(some_applied, 60, "some chunks applied")
        await asyncio.to_thread(postgres.stop)
        # While Postgres is down, ingestion says so (503, retry later) instead of failing obscurely.
        down = await api.post(
            "/v1/chunks",
            json={"user_id": "u0", "messages": [{"role": "user", "content": "hi"}]},
            headers=headers,
        )
        assert down.status_code == 503, down.text
        assert down.json()["error"]["code"] == "unavailable"
        assert down.headers["retry-after"]
        await asyncio.sleep(1.0)  # time itself must pass: an outage that lasts, not a blink
        await asyncio.to_thread(postgres.start)
        await post_users(api, headers, USERS[3:], writer="slow")
        await wait_for_chunks(sessionmaker, tenant.tenant_id, TOTAL, timeout_s=120)
    finally:
        stop_worker_process(worker)
    # Nothing half-written: exactly the acknowledged chunks exist, each applied once.
    assert await chunk_counts(sessionmaker, tenant.tenant_id) == {"applied": TOTAL}
    await assert_same_as_reference(sessionmaker, tenant, reference)
