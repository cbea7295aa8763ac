"""The core loop with real arq workers: ordered per scope, parallel across scopes, exactly once,
with provenance on every version."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine
from app.db.models import Changeset, Chunk, Memory, MemoryVersion
from app.domain.pipeline.locks import scope_lock_key
from app.domain.pipeline.services import PipelineDeps, ScopeRun, process_scope
from app.domain.pipeline.services.drain import _process_next
from app.embeddings import embedder_from_settings
from app.writers.registry import WriterRegistry
from tests.conftest import TenantKeys
from tests.support.scenario import bank, changesets_per_chunk, order_violations, post_users
from tests.support.waiting import wait_for
from tests.support.workers import running_worker, wait_for_chunks
from tests.support.writers import SlowWriter

Client = AsyncTestClient[Litestar]

EXPECTED_ACTIVE = {
    "The user is vegetarian.",
    "The user mainly uses Python.",
    "The user's daughter is named Mia.",
    "The user lives in Seattle.",
}


@contextlib.asynccontextmanager
async def pipeline_deps(settings: Settings, engine: object) -> AsyncIterator[PipelineDeps]:
    """What a worker process shares between its jobs, for calling `process_scope` directly."""
    assert isinstance(engine, AsyncEngine)
    deps = PipelineDeps(
        engine=engine,
        settings=settings,
        writers=WriterRegistry(settings),
        embedder=embedder_from_settings(settings),
        worker_name="test",
    )
    try:
        yield deps
    finally:
        await deps.aclose()


async def test_twenty_users_in_parallel_each_in_order_with_provenance(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    users = [f"user-{i:02d}" for i in range(20)]
    SlowWriter.max_in_flight = 0
    accepted = await post_users(api, ingest_headers, users, writer="slow")
    async with running_worker(pipeline_settings):
        counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, len(accepted))
    assert counts == {"applied": len(accepted)}
    assert SlowWriter.max_in_flight > 1, "scopes were not processed concurrently"
    assert await order_violations(sessionmaker, tenant.tenant_id) == []
    assert set((await changesets_per_chunk(sessionmaker, tenant.tenant_id)).keys()) == {1}

    result = await bank(sessionmaker, tenant.tenant_id)
    assert set(result) == set(users)
    for user in users:
        active = {c for c, status, _ in result[user]["memories"] if status == "active"}
        assert active == EXPECTED_ACTIVE, user
        statuses = {c: s for c, s, _ in result[user]["memories"]}
        assert statuses["The user lives in Lyon."] == "superseded"
        assert statuses["The user likes jazz."] == "deleted"

    async with sessionmaker() as session:
        versions = (
            await session.scalars(select(MemoryVersion).where(MemoryVersion.tenant_id == tenant.tenant_id))
        ).all()
        chunk_ids = set(
            (await session.scalars(select(Chunk.id).where(Chunk.tenant_id == tenant.tenant_id))).all()
        )
    for v in versions:
        assert v.chunk_id in chunk_ids
        assert v.changeset_id is not None
        assert v.writer == "slow"
        assert v.prompt_hash
        assert v.actor.startswith("worker:")
        assert v.created_at is not None

    # The history endpoint tells the story of the moved location.
    one = accepted[0]
    status = (await api.get(f"/v1/chunks/{one['chunk_id']}", headers=ingest_headers)).json()
    assert status["status"] == "applied"
    assert status["changeset_id"]
    assert status["attempts"] == 1
    listing = (
        await api.get("/v1/memories", params={"user_id": "user-00", "status": "all"}, headers=ingest_headers)
    ).json()
    lyon = next(m for m in listing["items"] if m["content"] == "The user lives in Lyon.")
    history = (await api.get(f"/v1/memories/{lyon['id']}/history", headers=ingest_headers)).json()
    assert [v["op"] for v in history["versions"]] == ["ADD", "SUPERSEDE"]
    seattle = next(m for m in listing["items"] if m["content"] == "The user lives in Seattle.")
    assert history["versions"][1]["superseded_by"] == seattle["id"]
    assert history["versions"][0]["chunk_id"] == one["chunk_id"]
    assert history["versions"][0]["writer"] == "slow"


async def test_fifty_concurrent_chunks_of_one_user_apply_in_order_without_duplicates(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    likes = ["jazz", "tea", "hiking", "chess", "sushi"]

    async def post(i: int) -> dict[str, object]:
        body = {"user_id": "solo", "messages": [{"role": "user", "content": f"I like {likes[i % 5]}."}]}
        response = await api.post("/v1/chunks", json=body, headers=ingest_headers)
        assert response.status_code == 202
        return dict(response.json())

    # Two workers race for the same scope while chunks are still arriving.
    async with running_worker(pipeline_settings), running_worker(pipeline_settings):
        accepted = await asyncio.gather(*(post(i) for i in range(50)))
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 50)
    assert sorted(a["seq"] for a in accepted) == list(range(1, 51))
    assert await order_violations(sessionmaker, tenant.tenant_id) == []
    assert (await changesets_per_chunk(sessionmaker, tenant.tenant_id)) == {1: 50}
    async with sessionmaker() as session:
        contents = (
            await session.scalars(
                select(Memory.content).where(Memory.tenant_id == tenant.tenant_id, Memory.status == "active")
            )
        ).all()
        noops = await session.scalar(
            select(func.count()).select_from(Changeset).where(Changeset.ops.contains([{"op": "NOOP"}]))
        )
    assert sorted(contents) == sorted(f"The user likes {x}." for x in likes)
    assert noops == 45


async def test_redelivered_work_is_a_no_op(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: object,
) -> None:
    await post_users(api, ingest_headers, ["again"])
    async with running_worker(pipeline_settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 8)
    before = await bank(sessionmaker, tenant.tenant_id)
    async with pipeline_deps(pipeline_settings, engine) as deps:
        for _ in range(3):
            run = await process_scope(deps, tenant.tenant_id, "again")
            assert run.applied == 0
    assert await bank(sessionmaker, tenant.tenant_id) == before
    assert set((await changesets_per_chunk(sessionmaker, tenant.tenant_id)).values()) == {8}


async def test_chunk_left_processing_by_a_dead_worker_is_applied_once(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: object,
) -> None:
    [accepted] = await post_users(api, ingest_headers, ["orphan"], facts=["I live in Oslo."])
    chunk_id = uuid.UUID(accepted["chunk_id"])
    async with sessionmaker() as session, session.begin():  # what a worker killed mid-write leaves behind
        await session.execute(
            update(Chunk)
            .where(Chunk.tenant_id == tenant.tenant_id, Chunk.id == chunk_id)
            .values(status="processing", attempts=1)
        )
    async with pipeline_deps(pipeline_settings, engine) as deps:
        run = await process_scope(deps, tenant.tenant_id, "orphan")
    assert run.applied == 1
    async with sessionmaker() as session:
        chunk = await session.get(Chunk, (tenant.tenant_id, chunk_id))
        assert chunk is not None
        assert (chunk.status, chunk.attempts) == ("applied", 2)
    assert (await bank(sessionmaker, tenant.tenant_id))["orphan"]["memories"] == [
        ("The user lives in Oslo.", "active", 1)
    ]


async def test_a_chunk_that_keeps_killing_its_worker_is_failed(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: object,
) -> None:
    accepted = await post_users(api, ingest_headers, ["poison"], facts=["I live in Oslo.", "I like tea."])
    first = uuid.UUID(accepted[0]["chunk_id"])
    async with sessionmaker() as session, session.begin():
        await session.execute(update(Chunk).where(Chunk.id == first).values(status="processing", attempts=3))
    async with pipeline_deps(pipeline_settings, engine) as deps:
        run = await process_scope(deps, tenant.tenant_id, "poison")
    assert (run.failed, run.applied) == (1, 1)
    status = (await api.get(f"/v1/chunks/{first}", headers=ingest_headers)).json()
    assert status["status"] == "failed"
    assert "gave up" in status["error"]


async def test_writer_failure_fails_that_chunk_only(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    facts = ["I live in Lyon.", "boom: I like jazz.", "I mainly use Rust."]
    accepted = await post_users(api, ingest_headers, ["fragile"], writer="failing", facts=facts)
    async with running_worker(pipeline_settings):
        counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, 3)
    assert counts == {"applied": 2, "failed": 1}
    failed = (await api.get(f"/v1/chunks/{accepted[1]['chunk_id']}", headers=ingest_headers)).json()
    assert failed["status"] == "failed"
    assert failed["attempts"] == pipeline_settings.max_attempts
    assert "not valid JSON" in failed["error"]
    async with sessionmaker() as session:
        raw = await session.scalar(
            select(Chunk.raw_output).where(Chunk.id == uuid.UUID(accepted[1]["chunk_id"]))
        )
    assert raw == '{"memory": ['
    memories = (await bank(sessionmaker, tenant.tenant_id))["fragile"]["memories"]
    assert [c for c, _, _ in memories] == ["The user lives in Lyon.", "The user mainly uses Rust."]


async def test_writer_sees_recent_context_and_scope_candidates_only(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    settings = pipeline_settings.model_copy(update={"context_messages": 3})
    # Memories exist for this user and for another user; the probe must only be shown this user's.
    await post_users(api, ingest_headers, ["seen", "other"], facts=["I live in Oslo.", "I like tea."])
    async with running_worker(settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 4)
    await post_users(api, ingest_headers, ["seen"], writer="probe", facts=["Where do I live?"])
    async with running_worker(settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 5)
    async with sessionmaker() as session:
        usage = await session.scalar(select(Changeset.usage).where(Changeset.writer == "probe"))
    assert usage is not None
    # The last 3 messages before the chunk, oldest first (each earlier chunk: a user and an assistant turn).
    assert usage["context"] == ["Got it.", "I like tea.", "Got it."]
    assert sorted(c for _, c in usage["candidates"]) == ["The user likes tea.", "The user lives in Oslo."]
    assert sorted(i for i, _ in usage["candidates"]) == [0, 1]


async def test_offline_writer_finds_the_fact_it_replaces_in_a_large_bank(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # Few candidates per query, many memories: "I moved to Berlin" shares no word with "The user lives
    # in Lyon", so only a search in the memory's own phrasing finds the fact to supersede (older
    # memories win ties, so a search on the raw text would return two of the likes).
    settings = pipeline_settings.model_copy(update={"candidate_limit": 2})
    likes = [f"I like {x}." for x in ["jazz", "tea", "chess", "sushi", "hiking"]]
    facts = [*likes, "I live in Lyon.", "I moved to Berlin."]
    await post_users(api, ingest_headers, ["big"], facts=facts)
    async with running_worker(settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, len(facts))
    memories = {c: s for c, s, _ in (await bank(sessionmaker, tenant.tenant_id))["big"]["memories"]}
    assert memories["The user lives in Lyon."] == "superseded"
    assert memories["The user lives in Berlin."] == "active"
    assert sum(1 for s in memories.values() if s == "active") == 6


async def test_writer_calls_in_flight_are_not_bounded_by_database_connections(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker holds no connection while the writer thinks: twelve scopes keep twelve slow writer
    calls in flight through a pool of two connections (one of which holds the scope locks)."""
    users = [f"wide-{i}" for i in range(12)]
    facts = ["I live in Oslo.", "I like tea."]
    await post_users(api, ingest_headers, users, writer="slow", facts=facts)
    monkeypatch.setenv("MEMSTORE_TEST_WRITER_DELAY_S", "0.4")
    SlowWriter.max_in_flight = 0
    small = pipeline_settings.model_copy(update={"db_pool_size": 2, "db_max_overflow": 0})
    engine = create_engine(small, application_name="memstore-tests-small-pool")
    try:
        async with pipeline_deps(small, engine) as deps:
            runs = await asyncio.gather(*(process_scope(deps, tenant.tenant_id, u) for u in users))
    finally:
        await engine.dispose()
    assert [r.applied for r in runs] == [len(facts)] * len(users)
    assert SlowWriter.max_in_flight >= 10
    assert await order_violations(sessionmaker, tenant.tenant_id) == []
    assert await changesets_per_chunk(sessionmaker, tenant.tenant_id) == {1: len(users) * len(facts)}


async def backend_gone(sessionmaker: async_sessionmaker[AsyncSession], pid: int) -> None:
    """Wait until a terminated backend has exited (pg_terminate_backend only signals it)."""

    async def running() -> int:
        async with sessionmaker() as session:
            query = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
            return int(await session.scalar(query, {"pid": pid}) or 0)

    await wait_for(running, lambda n: n == 0, timeout_s=10, what=f"backend {pid} gone")


async def test_a_scope_lock_lost_unnoticed_stops_the_claims(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: object,
) -> None:
    """The lock connection's backend is killed while the worker still believes it holds the scope:
    its claims must take nothing, or two workers would each re-claim the chunk, spending its attempts."""
    facts = ["I live in Oslo.", "I like tea."]
    await post_users(api, ingest_headers, ["cut"], facts=facts)
    key = scope_lock_key(tenant.tenant_id, "cut")
    async with pipeline_deps(pipeline_settings, engine) as deps:
        lease = await deps.locks.try_acquire(key)
        assert lease is not None
        async with sessionmaker() as session, session.begin():
            await session.execute(select(func.pg_terminate_backend(lease.pid)))
        await backend_gone(sessionmaker, lease.pid)
        run = ScopeRun()
        assert deps.locks.holds(lease)  # nothing on the lock connection has failed yet
        assert not await _process_next(deps, tenant.tenant_id, "cut", run, lease)
        assert run.lost_lock
        async with sessionmaker() as session:
            attempts = (await session.scalars(select(Chunk.attempts).where(Chunk.user_id == "cut"))).all()
        assert attempts == [0, 0]
        await deps.locks.lost(lease)
        assert (await process_scope(deps, tenant.tenant_id, "cut")).applied == len(facts)
    assert await changesets_per_chunk(sessionmaker, tenant.tenant_id) == {1: len(facts)}
