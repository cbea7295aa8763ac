"""Whatever goes wrong with one chunk ends recorded on that chunk: a fault that is not the chunk's
(the embedder down, a writer this worker does not know, the worker stopping) costs it no attempt,
and one that is (what Postgres cannot store, a time off the calendar) fails it alone, with its error."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Changeset, Chunk
from app.domain.pipeline.services import PipelineDeps, TenantOptionsCache, process_scope
from app.embeddings import embedder_from_settings
from app.server.asgi import create_app
from app.writers.base import Op, OpKind, WriteRequest, WriteResult
from app.writers.offline import OfflineWriter
from app.writers.registry import WriterRegistry
from tests.conftest import TenantKeys, bearer
from tests.integration.pipeline.test_core_loop import pipeline_deps
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.scenario import post_users
from tests.support.waiting import wait_for
from tests.support.workers import running_worker, wait_for_chunks
from tests.support.writers import PLUGINS, SlowWriter

Client = AsyncTestClient[Litestar]


class NulTagWriter(OfflineWriter):
    """A writer whose output Postgres cannot store: a NUL in a tag and in the reason."""

    def __init__(self, name: str = "nul") -> None:
        super().__init__(name=name)

    async def write(self, request: WriteRequest) -> WriteResult:
        result = await super().write(request)
        if any("poison" in m.content for m in request.messages):
            result.ops.append(Op(OpKind.ADD, "The user said poison.", tags=("a\x00b",), reason="x\x00y"))
        return result


async def chunk_row(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, chunk_id: object
) -> Chunk:
    async with sessionmaker() as session:
        chunk = await session.get(Chunk, (tenant_id, uuid.UUID(str(chunk_id))))
        assert chunk is not None
        return chunk


async def test_embedder_stopped_mid_run_costs_no_chunk(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """The embeddings server goes away for several seconds with two attempts per chunk: every chunk is
    applied once it is back, none failed, and meanwhile the chunk shows why it waits."""
    embeddings = FakeLLM()
    async with embeddings:
        settings = pipeline_settings.model_copy(
            update={
                "embedder": "openai",
                "embedder_base_url": embeddings.base_url,
                "embedder_max_retries": 0,
                "embedder_timeout_s": 2.0,
                "max_attempts": 2,
                "retry_backoff_max_s": 0.5,
            }
        )
        port = embeddings.port
        users = ["amy", "bob", "cat"]
        async with running_worker(settings):
            first = await post_users(api, ingest_headers, users, facts=["I live in Oslo."])
            await wait_for_chunks(sessionmaker, tenant.tenant_id, len(first))
            await embeddings.__aexit__(None, None, None)  # the server is stopped
            later = await post_users(api, ingest_headers, users, facts=["I like tea.", "I moved to Rome."])
            waiting = later[0]["chunk_id"]

            async def chunk() -> dict[str, Any]:
                answer: dict[str, Any] = (
                    await api.get(f"/v1/chunks/{waiting}", headers=ingest_headers)
                ).json()
                return answer

            def queued_with_the_error(answer: dict[str, Any]) -> bool:
                # Between two tries; during one (every half second at most) the chunk is `processing`.
                return answer["status"] == "queued" and "embedding" in (answer["error"] or "")

            what = "the waiting chunk queued, with the embedder's error on it"
            await wait_for(chunk, queued_with_the_error, timeout_s=30, what=what)
            # Time itself must pass: down long enough for many more retries than the chunks have
            # attempts (they back off 0.5 s at most), which nothing else shows.
            await asyncio.sleep(6)
            answer = await wait_for(chunk, queued_with_the_error, timeout_s=30, what=what)
            assert answer["attempts"] == 0  # an outage uses up no attempt
            async with FakeLLM(port=port):  # back where it was
                counts = await wait_for_chunks(
                    sessionmaker, tenant.tenant_id, len(first) + len(later), timeout_s=60
                )
    assert counts == {"applied": len(first) + len(later)}
    done = (await api.get(f"/v1/chunks/{waiting}", headers=ingest_headers)).json()
    assert (done["status"], done["error"], done["attempts"]) == ("applied", None, 1)


async def test_an_embedder_that_refuses_the_text_fails_that_chunk_not_forever(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """A 4xx from the embeddings server is about the input (too long for the model, say), not an
    outage: retrying cannot help, so the chunk uses its attempts and fails, and the queue goes on."""
    refusal = b'{"error": {"message": "input is too long for this model"}}'
    async with FakeLLM() as embeddings:
        embeddings.embedding_script.extend(Reply(status=400, body=refusal) for _ in range(2))
        settings = pipeline_settings.model_copy(
            update={"embedder": "openai", "embedder_base_url": embeddings.base_url, "max_attempts": 2}
        )
        accepted = await post_users(api, ingest_headers, ["amy"], facts=["I live in Oslo.", "I like tea."])
        async with running_worker(settings):
            counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, len(accepted), timeout_s=60)
    assert counts == {"failed": 1, "applied": 1}
    refused = await chunk_row(sessionmaker, tenant.tenant_id, accepted[0]["chunk_id"])
    assert refused.status == "failed"
    assert refused.attempts == 2
    assert "HTTP 400" in (refused.last_error or "")


async def test_a_writer_unknown_to_the_worker_waits_for_one_that_knows_it(
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: AsyncEngine,
) -> None:
    """The API knows writer `ghost`, this worker does not (configuration rolling out): the chunk is not
    written by another writer; it waits, with the reason on it, for a worker that knows `ghost`."""
    api_settings = pipeline_settings.model_copy(
        update={"writer_plugins": {**PLUGINS, "ghost": "tests.support.writers:SlowWriter"}}
    )
    api, headers = await ingest_client(api_settings, tenant)
    try:
        [accepted] = await post_users(api, headers, ["ghosted"], writer="ghost", facts=["I live in Oslo."])
        async with pipeline_deps(pipeline_settings, engine) as deps:
            run = await process_scope(deps, tenant.tenant_id, "ghosted")
        assert (run.applied, run.failed, run.retried) == (0, 0, 1)
        answer = (await api.get(f"/v1/chunks/{accepted['chunk_id']}", headers=headers)).json()
        assert answer["status"] == "queued"
        assert answer["attempts"] == 0
        assert answer["error"] == "UnknownWriterError: unknown writer 'ghost' on this worker"

        async with sessionmaker() as session, session.begin():  # its backoff has passed
            await session.execute(update(Chunk).values(available_at=Chunk.received_at))
        async with pipeline_deps(api_settings, engine) as deps:
            assert (await process_scope(deps, tenant.tenant_id, "ghosted")).applied == 1
    finally:
        await api.__aexit__(None, None, None)
    async with sessionmaker() as session:
        writers = (await session.scalars(select(Changeset.writer))).all()
    assert writers == ["ghost"]


async def ingest_client(settings: Settings, tenant: TenantKeys) -> tuple[Client, dict[str, str]]:
    """An API with `settings` (and so their writers), and an ingest key of `tenant`."""
    api = AsyncTestClient(create_app(settings, configure_logs=False))
    await api.__aenter__()
    key = await api.post(
        "/v1/admin/keys", json={"name": "app", "roles": ["ingest", "read"]}, headers=tenant.admin
    )
    return api, bearer(key.json()["key"])


async def test_output_postgres_cannot_store_fails_that_chunk_alone_with_its_error(
    tenant: TenantKeys, pipeline_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    settings = pipeline_settings.model_copy(
        update={"writer_plugins": {**PLUGINS, "nul": f"{__name__}:NulTagWriter"}, "sweep_min_age_s": 0.2}
    )
    facts = ["I live in Oslo.", "poison: I like tea.", "I mainly use Rust."]
    api, headers = await ingest_client(settings, tenant)
    try:
        accepted = await post_users(api, headers, ["brittle"], writer="nul", facts=facts)
    finally:
        await api.__aexit__(None, None, None)
    async with running_worker(settings):
        counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, len(facts))
    assert counts == {"applied": 2, "failed": 1}
    failed = await chunk_row(sessionmaker, tenant.tenant_id, accepted[1]["chunk_id"])
    assert failed.status == "failed"
    assert failed.attempts == settings.max_attempts
    assert failed.last_error is not None
    assert "gave up" not in failed.last_error
    # Postgres's own words, not a note that the worker gave up.
    assert failed.last_error == "UntranslatableCharacterError: unsupported Unicode escape sequence"


async def test_a_message_time_off_the_calendar_fails_its_chunk_not_its_users_queue(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """A stored chunk whose message time cannot be converted (UTC before year 1): the chunk fails
    after its attempts with the real error, and the user's later chunks are applied."""
    settings = pipeline_settings.model_copy(update={"sweep_min_age_s": 0.2})
    accepted = await post_users(api, ingest_headers, ["edge"], facts=["I live in Oslo.", "I like tea."])
    async with sessionmaker() as session, session.begin():  # accepted before the edge refused such times
        poisoned: list[dict[str, Any]] = [
            {"role": "user", "content": "I live in Oslo.", "created_at": "0001-01-01T00:00:00+14:00"}
        ]
        await session.execute(
            update(Chunk).where(Chunk.id == uuid.UUID(accepted[0]["chunk_id"])).values(messages=poisoned)
        )
    async with running_worker(settings):
        counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, len(accepted))
    assert counts == {"applied": 1, "failed": 1}
    failed = await chunk_row(sessionmaker, tenant.tenant_id, accepted[0]["chunk_id"])
    assert failed.attempts == settings.max_attempts
    assert failed.last_error is not None
    assert "gave up" not in failed.last_error
    assert "range" in failed.last_error  # "date value out of range" (OverflowError), not a generic note


async def test_a_cancelled_claim_gives_its_attempt_back(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker stopping mid-writer-call (its job cancelled) made no attempt: the chunk is queued again
    with its attempts as before, for the next worker."""
    [accepted] = await post_users(api, ingest_headers, ["stopped"], writer="slow", facts=["I like tea."])
    monkeypatch.setenv("MEMSTORE_TEST_WRITER_DELAY_S", "30")
    async with pipeline_deps(pipeline_settings, engine) as deps:
        job = asyncio.create_task(process_scope(deps, tenant.tenant_id, "stopped"))

        # Claimed, and past the claim's own statements: in the writer's call, as a stopping worker is.
        await wait_for(
            lambda: chunk_row(sessionmaker, tenant.tenant_id, accepted["chunk_id"]),
            lambda chunk: chunk.status == "processing" and SlowWriter.in_flight > 0,
            timeout_s=10,
            what="the chunk claimed and its writer called",
        )
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    chunk = await chunk_row(sessionmaker, tenant.tenant_id, accepted["chunk_id"])
    assert (chunk.status, chunk.attempts) == ("queued", 0)


async def test_the_tenant_options_cache_is_bounded(
    pipeline_settings: Settings, engine: AsyncEngine, tenant: TenantKeys
) -> None:
    deps = PipelineDeps(
        engine=engine,
        settings=pipeline_settings,
        writers=WriterRegistry(pipeline_settings),
        embedder=embedder_from_settings(pipeline_settings),
        worker_name="test",
        tenants=TenantOptionsCache(size=3),
    )
    try:
        tenants = [uuid.uuid4() for _ in range(5)] + [tenant.tenant_id]
        async with AsyncSession(deps.reads) as session:
            for tenant_id in tenants:
                await deps.tenants.get(session, tenant_id)
        assert list(deps.tenants.entries) == tenants[-3:]
    finally:
        await deps.aclose()
