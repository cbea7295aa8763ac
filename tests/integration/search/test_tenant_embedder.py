"""A tenant's own embedder: chosen in its settings, its memories re-embedded alone (resumable) while its
searches answer `embedder_mismatch` and its chunks wait, every other tenant untouched; then its
searches, its writer's candidates and its new memories all use its embedder, and the deployment's
`memstore reembed` passes it over.

The deployment embeds with the hashing model; the tenant's embedder is the `openai` one against the
fake model server, whose vectors (`reversed_model`) differ from the hashing model's for every text."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent, Chunk, Memory
from app.domain.accounts.services import create_tenant
from app.domain.pipeline.repositories import TenantOptions
from app.domain.pipeline.scheduler import queues
from app.domain.pipeline.services.deps import LimitsPolicy
from app.domain.search.reembed import reembed
from app.domain.search.services import record_embedder
from app.domain.search.tenant_embedder import OWN, SWITCH, ask_switch, switch_tenant
from app.embeddings import Embedders, HashingEmbedder
from app.embeddings.base import DUPLICATE_THRESHOLDS
from app.lib.queue import create_redis
from app.server.asgi import create_app
from app.writers.registry import WriterRegistry
from tests.conftest import FAST_WORKERS, TenantKeys
from tests.integration.search.test_reembed import reversed_model
from tests.integration.search.test_search import add
from tests.support.fake_llm import FakeLLM
from tests.support.waiting import wait_for
from tests.support.workers import chunk_counts, running_worker, wait_for_chunks

HASHING = HashingEmbedder(384)
CONTENTS = [f"The user collects {kind} stamps." for kind in ("French", "Dutch", "Czech", "Greek", "Irish")]


@pytest.fixture
def model_server() -> Iterator[FakeLLM]:
    with FakeLLM().in_thread() as server:
        server.embed_text = reversed_model
        yield server


@pytest.fixture
def tenant_settings(settings: Settings, model_server: FakeLLM) -> Settings:
    """The deployment: hashing for everyone, and `openai` (the fake server) for tenants that choose it."""
    return settings.model_copy(
        update={
            "tenant_embedders": ["openai"],
            "embedder_base_url": model_server.base_url,
            "embedder_switch_settle_s": 0.0,
            **FAST_WORKERS,
        }
    )


def assert_vectors(memories: list[Memory], model: Callable[[str], list[float]]) -> None:
    assert memories
    for memory in memories:
        assert memory.embedding is not None
        want = model(memory.content)
        close = all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(memory.embedding, want, strict=True))
        assert close, memory.content


async def stored(sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID) -> list[Memory]:
    async with sessionmaker() as session:
        return list((await session.scalars(select(Memory).where(Memory.tenant_id == tenant_id))).all())


async def settings_of(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID
) -> dict[str, object]:
    from app.db.models import Tenant

    async with sessionmaker() as session:
        tenant = await session.get(Tenant, tenant_id)
        assert tenant is not None
        return dict(tenant.settings)


async def test_a_tenant_moves_to_its_own_embedder_alone(
    tenant_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    for t in (tenant, other_tenant):
        await add(sessionmaker, t.tenant_id, "u", CONTENTS)
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
    body = {"user_id": "u", "query": "Greek stamps", "mode": "vector"}

    async with AsyncTestClient(app=create_app(tenant_settings, configure_logs=False)) as api:
        refused = await api.patch("/v1/admin/settings", json={"embedder": "nope"}, headers=tenant.admin)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["details"]["allowed"] == ["hashing", "openai"]
        unchanged = await api.patch("/v1/admin/settings", json={"embedder": None}, headers=tenant.admin)
        assert unchanged.json()["embedder_switching_to"] is None  # already the deployment's: no move

        asked = await api.patch("/v1/admin/settings", json={"embedder": "openai"}, headers=tenant.admin)
        assert asked.status_code == 200, asked.text
        assert (asked.json()["embedder"], asked.json()["embedder_switching_to"]) == (None, "openai")

        # Meanwhile: the tenant's searches are refused, the other tenant's answer as before.
        waiting = await api.post("/v1/memories/search", json=body, headers=tenant.admin)
        assert waiting.status_code == 409, waiting.text
        assert waiting.json()["error"]["code"] == "embedder_mismatch"
        other = await api.post("/v1/memories/search", json=body, headers=other_tenant.admin)
        assert other.status_code == 200, other.text
        assert other.json()["results"][0]["memory"]["content"] == "The user collects Greek stamps."

        # The move, interrupted after one batch, then resumed from its cursor.
        embedders = Embedders(tenant_settings)
        try:
            part = await switch_tenant(
                sessionmaker, embedders, tenant.tenant_id, actor="test", batch_size=2, budget_s=0.0
            )
            assert (part.to, part.embedded, part.finished) == ("openai", 2, False)
            assert (await settings_of(sessionmaker, tenant.tenant_id))[SWITCH]["cursor"] is not None  # type: ignore[index]
            rest = await switch_tenant(sessionmaker, embedders, tenant.tenant_id, actor="test", batch_size=2)
            assert (rest.embedded, rest.finished) == (3, True)
        finally:
            await embedders.aclose()

        assert_vectors(await stored(sessionmaker, tenant.tenant_id), reversed_model)
        assert_vectors(await stored(sessionmaker, other_tenant.tenant_id), HASHING.embed_one)
        options = await settings_of(sessionmaker, tenant.tenant_id)
        assert (options.get(OWN), options.get(SWITCH)) == ("openai", None)

        # Its searches answer again (by its embedder: the query is embedded by the fake server).
        found = await wait_for(
            lambda: api.post("/v1/memories/search", json=body, headers=tenant.admin),
            lambda r: r.status_code == 200,
            timeout_s=10,
            what="the tenant's searches answering again",
        )
        assert found.json()["results"][0]["memory"]["content"] == "The user collects Greek stamps."
        now = (await api.get("/v1/admin/settings", headers=tenant.admin)).json()
        assert (now["embedder"], now["embedder_switching_to"]) == ("openai", None)

    async with sessionmaker() as session:
        actions = (
            await session.scalars(
                select(AuditEvent.action)
                .where(AuditEvent.tenant_id == tenant.tenant_id, AuditEvent.action.like("tenant.embedder%"))
                .order_by(AuditEvent.id)
            )
        ).all()
    assert actions == ["tenant.embedder_set", "tenant.embedder_switched"]

    # The deployment's re-embedding passes the tenant over: its vectors stay its embedder's.
    await reembed(sessionmaker, HASHING, force=True)
    assert_vectors(await stored(sessionmaker, tenant.tenant_id), reversed_model)


async def test_a_moving_tenants_chunks_wait_then_its_writes_use_its_embedder(
    tenant_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    await add(sessionmaker, tenant.tenant_id, "ada", CONTENTS[:2])
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
        assert await ask_switch(session, tenant.tenant_id, "openai", default="hashing", actor="test")

    async def post(t: TenantKeys, text: str) -> None:
        response = await api.post(
            "/v1/chunks",
            json={"user_id": "ada", "messages": [{"role": "user", "content": text}]},
            headers=t.admin,
        )
        assert response.status_code == 202, response.text

    async with (
        AsyncTestClient(app=create_app(tenant_settings, configure_logs=False)) as api,
        running_worker(tenant_settings),
    ):
        await post(tenant, "I live in Oslo.")
        await post(other_tenant, "I live in Lyon.")
        assert await wait_for_chunks(sessionmaker, other_tenant.tenant_id, 1) == {"applied": 1}
        # The moving tenant's chunk waits, queued and untouched: the scheduler holds the tenant paused.
        redis = create_redis(tenant_settings.redis_url)
        try:
            await wait_for(
                lambda: queues(redis),
                lambda found: any(q.tenant_id == str(tenant.tenant_id) and q.paused for q in found),
                timeout_s=20,
                what="the moving tenant paused in the scheduler",
            )
        finally:
            await redis.aclose()
        async with sessionmaker() as session:
            waiting = await session.scalar(select(Chunk).where(Chunk.tenant_id == tenant.tenant_id))
        assert waiting is not None
        assert (waiting.status, waiting.attempts) == ("queued", 0)
        shown = (await api.get(f"/v1/chunks/{waiting.id}", headers=tenant.admin)).json()
        assert shown["waiting_for"] == "embedder_move"

        # The move is done (here, by hand; a worker's job in production): the chunk is applied.
        embedders = Embedders(tenant_settings)
        try:
            assert (await switch_tenant(sessionmaker, embedders, tenant.tenant_id, actor="test")).finished
        finally:
            await embedders.aclose()
        # Unpaused within MOVE_RECHECK_S (a worker's job that ends a move unpauses its tenant at once).
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 1) == {"applied": 1}

    mine = await stored(sessionmaker, tenant.tenant_id)
    assert "The user lives in Oslo." in {m.content for m in mine}
    assert_vectors(mine, reversed_model)  # the new memory and the re-embedded ones alike
    assert_vectors(await stored(sessionmaker, other_tenant.tenant_id), HASHING.embed_one)


async def test_a_worker_carries_out_the_move_the_settings_ask_for(
    tenant_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await add(sessionmaker, tenant.tenant_id, "u", CONTENTS)
    async with (
        AsyncTestClient(app=create_app(tenant_settings, configure_logs=False)) as api,
        running_worker(tenant_settings),
    ):
        asked = await api.patch("/v1/admin/settings", json={"embedder": "openai"}, headers=tenant.admin)
        assert asked.status_code == 200, asked.text
        await wait_for(
            lambda: settings_of(sessionmaker, tenant.tenant_id),
            lambda s: s.get(OWN) == "openai" and SWITCH not in s,
            timeout_s=30,
            what="the worker's job finishing the move",
        )
        # And back to the deployment's: the tenant follows it again.
        back = await api.patch("/v1/admin/settings", json={"embedder": None}, headers=tenant.admin)
        assert back.json()["embedder_switching_to"] == "hashing"
        await wait_for(
            lambda: settings_of(sessionmaker, tenant.tenant_id),
            lambda s: OWN not in s and SWITCH not in s,
            timeout_s=30,
            what="the move back",
        )
    assert_vectors(await stored(sessionmaker, tenant.tenant_id), HASHING.embed_one)


async def test_a_tenant_created_with_its_embedder_needs_no_move(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    async with sessionmaker() as session, session.begin():
        tenant, _ = await create_tenant(session, f"e5-{uuid.uuid4().hex[:6]}", embedder="e5")
    options = await settings_of(sessionmaker, tenant.id)
    assert (options.get(OWN), options.get(SWITCH)) == ("e5", None)
    counts = await chunk_counts(sessionmaker, tenant.id)
    assert counts == {}


def test_the_near_duplicate_thresholds_are_the_tenants_embedders(settings: Settings) -> None:
    policy = LimitsPolicy(settings, WriterRegistry(settings))
    assert policy.for_chunk(TenantOptions(), "offline").duplicate_thresholds == {}
    own = policy.for_chunk(TenantOptions(embedder="e5"), "offline").duplicate_thresholds
    assert own == DUPLICATE_THRESHOLDS["e5"]


async def test_a_tenants_shadow_banks_have_its_embedder_and_move_with_it(
    tenant_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """A shadow bank's memories are compared with its tenant's (`shadows.compare`): a bank made while the
    tenant has its own embedder gets it, and a move re-embeds the banks with the tenant."""
    from app.domain.shadows.services import ensure_bank

    async with sessionmaker() as session, session.begin():
        early = await ensure_bank(session, tenant.tenant_id, name="early", writer="offline", kind="live")
    await add(sessionmaker, tenant.tenant_id, "u", CONTENTS[:3])
    await add(sessionmaker, early.id, "u", CONTENTS[:2])
    async with sessionmaker() as session, session.begin():
        assert await ask_switch(session, tenant.tenant_id, "openai", default="hashing", actor="test")
        late = await ensure_bank(session, tenant.tenant_id, name="late", writer="offline", kind="live")
    assert (await settings_of(sessionmaker, early.id))[SWITCH]["to"] == "openai"  # type: ignore[index]
    assert (await settings_of(sessionmaker, late.id))[SWITCH]["to"] == "openai"  # type: ignore[index]

    embedders = Embedders(tenant_settings)
    try:
        moved = await switch_tenant(sessionmaker, embedders, tenant.tenant_id, actor="test", batch_size=2)
    finally:
        await embedders.aclose()
    assert (moved.embedded, moved.finished) == (5, True)
    for bank_id in (early.id, late.id):
        options = await settings_of(sessionmaker, bank_id)
        assert (options.get(OWN), options.get(SWITCH)) == ("openai", None)
    assert_vectors(await stored(sessionmaker, early.id), reversed_model)
    assert_vectors(await stored(sessionmaker, tenant.tenant_id), reversed_model)
    async with sessionmaker() as session, session.begin():
        newer = await ensure_bank(session, tenant.tenant_id, name="newer", writer="offline", kind="live")
    assert (await settings_of(sessionmaker, newer.id)).get(OWN) == "openai"
