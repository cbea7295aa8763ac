"""Read-your-writes: `GET /v1/chunks/{id}?wait=S` answers when the chunk is applied (or failed), not at
the end of its wait and not by polling, and holds no database connection while it waits. The API is
served on a real socket (`live_api`), so the waiting requests are truly concurrent."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys
from tests.support.live import live_api
from tests.support.workers import running_worker


@pytest.fixture
async def api(settings: Settings, tenant: TenantKeys) -> AsyncIterator[httpx.AsyncClient]:
    async with live_api(settings) as base_url, httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        response = await client.post(
            "/v1/admin/keys", json={"name": "app", "roles": ["ingest", "read"]}, headers=tenant.admin
        )
        assert response.status_code == 201, response.text
        client.headers["Authorization"] = f"Bearer {response.json()['key']}"
        await asyncio.sleep(0.2)  # the process's subscription to finished chunks (one round trip)
        yield client


async def post(api: httpx.AsyncClient, user: str, text_: str) -> str:
    response = await api.post(
        "/v1/chunks", json={"user_id": user, "messages": [{"role": "user", "content": text_}]}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["chunk_id"])


async def test_a_waiting_read_answers_as_soon_as_the_chunk_is_applied(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    chunk_id = await post(api, "ana", "I moved to Lisbon last spring.")
    # Asked before any worker runs: it waits, then the worker applies the chunk.
    waiting = asyncio.create_task(api.get(f"/v1/chunks/{chunk_id}?wait=20"))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "it waits for the chunk"
    async with running_worker(settings):
        response = await asyncio.wait_for(waiting, 20)
        answered = datetime.now(UTC)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "applied"
    late_s = (answered - datetime.fromisoformat(body["applied_at"])).total_seconds()
    # Far from the end of its wait: the announcement, not the clock, answered it.
    assert late_s < 1.0, f"answered {late_s:.3f} s after the apply"
    print(f"answered {late_s * 1000:.1f} ms after the apply's commit")

    # A finished chunk answers at once, whatever the wait.
    started = time.monotonic()
    again = await api.get(f"/v1/chunks/{chunk_id}?wait=20")
    assert again.json()["status"] == "applied"
    assert time.monotonic() - started < 5


async def test_a_wait_ends_with_the_status_then_and_bad_waits_are_refused(api: httpx.AsyncClient) -> None:
    chunk_id = await post(api, "bo", "I play the cello.")
    started = time.monotonic()
    response = await api.get(f"/v1/chunks/{chunk_id}?wait=0.5")
    assert response.status_code == 200
    assert response.json()["status"] == "queued"  # no worker: the wait ran out
    assert time.monotonic() - started >= 0.5
    for bad in ("-1", "31", "nan", "soon"):
        refused = await api.get(f"/v1/chunks/{chunk_id}?wait={bad}")
        assert refused.status_code in (400, 422), (bad, refused.text)
    missing = await api.get(f"/v1/chunks/{uuid.uuid4()}?wait=1")
    assert missing.status_code == 404


async def test_many_waiting_reads_hold_no_database_connection(
    api: httpx.AsyncClient, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    chunk_ids = [await post(api, f"user-{i}", f"fact number {i}") for i in range(50)]
    # 500 reads wait, ten on each chunk, on as many connections of the client.
    limits = httpx.Limits(max_connections=600, max_keepalive_connections=600)
    async with httpx.AsyncClient(
        base_url=str(api.base_url), headers=api.headers, timeout=60, limits=limits
    ) as many:
        reads = [asyncio.create_task(many.get(f"/v1/chunks/{chunk_ids[i % 50]}?wait=30")) for i in range(500)]
        await asyncio.sleep(3)
        assert not any(read.done() for read in reads), "they wait"

        async def api_connections(state: str) -> int:
            async with sessionmaker() as session:
                query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'memstore-api'"
                return int(await session.scalar(text(query + state)) or 0)

        # While 500 requests wait, the API's pool holds what it held before: a few idle connections,
        # none in use or in a transaction.
        assert await api_connections(" AND state <> 'idle'") == 0
        assert await api_connections("") <= settings.db_pool_size + settings.db_max_overflow
        async with running_worker(settings):
            answers = await asyncio.wait_for(asyncio.gather(*reads), 60)
    assert {a.json()["status"] for a in answers} == {"applied"}


async def test_several_chunks_at_once(api: httpx.AsyncClient, settings: Settings) -> None:
    ids = [await post(api, "cy", f"fact {i}") for i in range(3)]
    query = "&".join(f"chunk_id={i}" for i in ids)
    waiting = asyncio.create_task(api.get(f"/v1/chunks?{query}&wait=20"))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    async with running_worker(settings):
        response = await asyncio.wait_for(waiting, 20)
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item["chunk_id"] for item in items] == ids
    assert {item["status"] for item in items} == {"applied"}
    other = await api.get(f"/v1/chunks?chunk_id={ids[0]}&chunk_id={uuid.uuid4()}")
    assert other.status_code == 404
