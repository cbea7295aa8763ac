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
from tests.support.live import LiveApp, live_app
from tests.support.waiting import wait_for
from tests.support.workers import running_worker


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[LiveApp]:
    async with live_app(settings) as live:
        # The process's subscription to finished chunks, without which a wait runs to its end.
        await wait_for(
            live.services.finished_chunks.listening.is_set,
            timeout_s=10,
            what="the API's subscription to finished chunks",
        )
        yield live


@pytest.fixture
async def api(served: LiveApp, tenant: TenantKeys) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
        response = await client.post(
            "/v1/admin/keys", json={"name": "app", "roles": ["ingest", "read"]}, headers=tenant.admin
        )
        assert response.status_code == 201, response.text
        client.headers["Authorization"] = f"Bearer {response.json()['key']}"
        yield client


async def waiting_reads(served: LiveApp, count: int) -> None:
    """Until `count` futures wait in the API for chunks to finish (a read waits on one per chunk)."""
    await wait_for(
        lambda: served.services.finished_chunks.waiting,
        lambda waiting: waiting >= count,
        timeout_s=30,
        what=f"{count} waits registered in the API",
    )


async def post(api: httpx.AsyncClient, user: str, text_: str) -> str:
    response = await api.post(
        "/v1/chunks", json={"user_id": user, "messages": [{"role": "user", "content": text_}]}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["chunk_id"])


async def test_a_waiting_read_answers_as_soon_as_the_chunk_is_applied(
    api: httpx.AsyncClient, served: LiveApp, settings: Settings
) -> None:
    chunk_id = await post(api, "ana", "I moved to Lisbon last spring.")
    # Asked before any worker runs: it waits, then the worker applies the chunk.
    waiting = asyncio.create_task(api.get(f"/v1/chunks/{chunk_id}?wait=20"))
    await waiting_reads(served, 1)
    assert not waiting.done(), "it waits for the chunk"
    async with running_worker(settings):
        response = await asyncio.wait_for(waiting, 20)
        answered = datetime.now(UTC)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "applied"
    late_s = (answered - datetime.fromisoformat(body["applied_at"])).total_seconds()
    print(f"answered {late_s * 1000:.1f} ms after the apply's commit")
    # Far from the end of its 20 s wait: the announcement, not the clock, answered it.
    assert late_s < 5.0, f"answered {late_s:.3f} s after the apply"

    # A finished chunk answers at once, whatever the wait.
    started = time.monotonic()
    again = await api.get(f"/v1/chunks/{chunk_id}?wait=20")
    took_s = time.monotonic() - started
    print(f"a finished chunk answered in {took_s * 1000:.1f} ms")
    assert again.json()["status"] == "applied"
    assert took_s < 10, f"a finished chunk took {took_s:.3f} s to answer (its wait was 20 s)"


async def test_a_wait_ends_with_the_status_then_and_bad_waits_are_refused(api: httpx.AsyncClient) -> None:
    chunk_id = await post(api, "bo", "I play the cello.")
    started = time.monotonic()
    response = await api.get(f"/v1/chunks/{chunk_id}?wait=0.5")
    took_s = time.monotonic() - started
    print(f"a wait of 0.5 s answered after {took_s:.3f} s")
    assert response.status_code == 200
    assert response.json()["status"] == "queued"  # no worker: the wait ran out
    assert took_s >= 0.5
    for bad in ("-1", "31", "nan", "soon"):
        refused = await api.get(f"/v1/chunks/{chunk_id}?wait={bad}")
        assert refused.status_code in (400, 422), (bad, refused.text)
    missing = await api.get(f"/v1/chunks/{uuid.uuid4()}?wait=1")
    assert missing.status_code == 404


async def test_many_waiting_reads_hold_no_database_connection(
    api: httpx.AsyncClient,
    served: LiveApp,
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    chunk_ids = [await post(api, f"user-{i}", f"fact number {i}") for i in range(50)]
    # 500 reads wait, ten on each chunk, on as many connections of the client.
    limits = httpx.Limits(max_connections=600, max_keepalive_connections=600)
    async with httpx.AsyncClient(
        base_url=str(api.base_url), headers=api.headers, timeout=60, limits=limits
    ) as many:
        reads = [asyncio.create_task(many.get(f"/v1/chunks/{chunk_ids[i % 50]}?wait=30")) for i in range(500)]
        await waiting_reads(served, 500)
        assert not any(read.done() for read in reads), "they wait"

        async def api_connections(state: str) -> int:
            async with sessionmaker() as session:
                query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'memstore-api'"
                return int(await session.scalar(text(query + state)) or 0)

        # While 500 requests wait, the API's pool holds what it held before: a few idle connections,
        # none in use or in a transaction (once each has read its chunk: it registers its wait first).
        await wait_for(
            lambda: api_connections(" AND state <> 'idle'"),
            lambda busy: busy == 0,
            timeout_s=30,
            what="no API connection in use while the reads wait",
        )
        assert not any(read.done() for read in reads), "they still wait"
        assert await api_connections("") <= settings.db_pool_size + settings.db_max_overflow
        async with running_worker(settings):
            answers = await asyncio.wait_for(asyncio.gather(*reads), 60)
    assert {a.json()["status"] for a in answers} == {"applied"}


async def test_several_chunks_at_once(api: httpx.AsyncClient, served: LiveApp, settings: Settings) -> None:
    ids = [await post(api, "cy", f"fact {i}") for i in range(3)]
    query = "&".join(f"chunk_id={i}" for i in ids)
    waiting = asyncio.create_task(api.get(f"/v1/chunks?{query}&wait=20"))
    await waiting_reads(served, 3)
    assert not waiting.done()
    async with running_worker(settings):
        response = await asyncio.wait_for(waiting, 20)
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item["chunk_id"] for item in items] == ids
    assert {item["status"] for item in items} == {"applied"}
    other = await api.get(f"/v1/chunks?chunk_id={ids[0]}&chunk_id={uuid.uuid4()}")
    assert other.status_code == 404
