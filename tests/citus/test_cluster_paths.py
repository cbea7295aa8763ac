"""More of the service on the Citus cluster, through the real API and a real worker, each test with
tenants of its own: a user's bank restored to a point in time, `as_of` and `valid_at` reads, the audit
chain verified, a webhook delivered to a receiver on 127.0.0.1, the sweeper finding a scope whose
wake-up Redis lost, and an LLM writer profile (Hy-Memory) against the fake model server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.domain.accounts.services import create_tenant
from app.domain.pipeline.jobs import find_stranded_scopes
from app.server.asgi import create_app
from tests.citus.conftest import Cluster, service_settings
from tests.conftest import FAST_WORKERS, writers_toml
from tests.support.fake_llm import FakeLLM
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import WebhookReceiver
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]


@dataclass
class Service:
    api: Client
    settings: Settings
    engine: AsyncEngine  # as the service role, as the API and the worker connect
    sessionmaker: async_sessionmaker[AsyncSession]  # as the tables' owner
    fake_llm: FakeLLM

    async def tenant(self, name: str) -> tuple[uuid.UUID, dict[str, str]]:
        async with self.sessionmaker() as session, session.begin():
            tenant, key = await create_tenant(session, f"paths-{name}-{uuid.uuid4().hex[:6]}")
        return tenant.id, {"Authorization": f"Bearer {key}"}

    async def say(
        self, headers: dict[str, str], user: str, text: str, at: str | None = None, **extra: Any
    ) -> str:
        message: dict[str, Any] = {"role": "user", "content": text}
        if at is not None:
            message["created_at"] = at
        response = await self.api.post(
            "/v1/chunks", json={"user_id": user, "messages": [message], **extra}, headers=headers
        )
        assert response.status_code == 202, response.text
        return str(response.json()["chunk_id"])

    async def contents(self, headers: dict[str, str], user: str, **params: Any) -> list[str]:
        response = await self.api.get("/v1/memories", params={"user_id": user, **params}, headers=headers)
        assert response.status_code == 200, response.text
        return sorted(m["content"] for m in response.json()["items"])


@pytest.fixture(scope="module")
async def service(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    async with FakeLLM() as fake:
        writers = Path(tmp_path_factory.mktemp("writers")) / "writers.toml"
        writers.write_text(
            writers_toml(
                {
                    "hy": {
                        "profile": "hy-memory",
                        "base_url": fake.base_url,
                        "model": "hy-memory",
                        "timeout_s": 5.0,
                    }
                }
            )
        )
        settings = service_settings(
            cluster.service_url,
            cluster.owner_url,
            cluster.redis_url,
            writers_file=writers,
            webhook_allowed_hosts=["127.0.0.0/8"],
            webhook_retry_schedule_s=[0.3, 0.3, 0.3],
            webhook_timeout_s=2.0,
            **FAST_WORKERS,
        )
        owner = create_engine(settings.as_owner(), application_name="memstore-tests")
        engine = create_engine(settings, application_name="memstore-tests")
        try:
            async with AsyncTestClient(create_app(settings, configure_logs=False)) as api:
                yield Service(api, settings, engine, create_sessionmaker(owner), fake)
        finally:
            await engine.dispose()
            await owner.dispose()


async def _applied(service: Service, tenant_id: uuid.UUID, chunks: int) -> None:
    counts = await wait_for_chunks(service.sessionmaker, tenant_id, chunks)
    assert counts == {"applied": chunks}, counts


async def test_a_users_bank_restored_to_a_point_in_time(service: Service) -> None:
    tenant_id, headers = await service.tenant("restore")
    async with running_worker(service.settings):
        await service.say(headers, "ada", "I live in Lyon.")
        await service.say(headers, "ada", "I mainly use Python.")
        await _applied(service, tenant_id, 2)
        await asyncio.sleep(0.05)
        then = datetime.now(UTC).isoformat()
        await asyncio.sleep(0.05)
        await service.say(headers, "ada", "I moved to Seattle.")
        await service.say(headers, "ada", "I'm vegetarian.")
        await _applied(service, tenant_id, 4)
    now = ["The user is vegetarian.", "The user lives in Seattle.", "The user mainly uses Python."]
    assert await service.contents(headers, "ada") == now
    dry = await service.api.post(
        "/v1/admin/users/ada/restore", json={"as_of": then, "dry_run": True}, headers=headers
    )
    assert dry.status_code == 200, dry.text
    assert await service.contents(headers, "ada") == now  # a dry run changes nothing
    restored = await service.api.post(
        "/v1/admin/users/ada/restore", json={"as_of": then, "reason": "bad import"}, headers=headers
    )
    assert restored.status_code == 200, restored.text
    assert await service.contents(headers, "ada") == [
        "The user lives in Lyon.",
        "The user mainly uses Python.",
    ]
    found = await service.api.post(
        "/v1/memories/search", json={"user_id": "ada", "query": "where does the user live"}, headers=headers
    )
    assert [r["memory"]["content"] for r in found.json()["results"]][:1] == ["The user lives in Lyon."]


async def test_as_of_and_valid_at_reads(service: Service) -> None:
    tenant_id, headers = await service.tenant("as-of")
    async with running_worker(service.settings):
        await service.say(headers, "ada", "I live in Lyon.", at="2026-01-10T10:00:00Z")
        await _applied(service, tenant_id, 1)
        await asyncio.sleep(0.05)
        then = datetime.now(UTC).isoformat()
        await asyncio.sleep(0.05)
        await service.say(headers, "ada", "I moved to Seattle.", at="2026-06-10T10:00:00Z")
        await _applied(service, tenant_id, 2)
    assert await service.contents(headers, "ada") == ["The user lives in Seattle."]
    assert await service.contents(headers, "ada", as_of=then) == ["The user lives in Lyon."]
    assert await service.contents(headers, "ada", valid_at="2026-03-01T00:00:00Z") == [
        "The user lives in Lyon."
    ]
    assert await service.contents(headers, "ada", valid_at="2026-07-01T00:00:00Z") == [
        "The user lives in Seattle."
    ]
    for query, expected in (
        ({"as_of": then}, "The user lives in Lyon."),
        ({"valid_at": "2026-03-01T00:00:00Z"}, "The user lives in Lyon."),
        ({}, "The user lives in Seattle."),
    ):
        found = await service.api.post(
            "/v1/memories/search", json={"user_id": "ada", "query": "lives in", **query}, headers=headers
        )
        assert found.status_code == 200, found.text
        assert [r["memory"]["content"] for r in found.json()["results"]][:1] == [expected], query


async def test_the_audit_chain_verifies_and_grows(service: Service) -> None:
    tenant_id, headers = await service.tenant("audit")
    async with running_worker(service.settings):
        await service.say(headers, "ada", "I live in Lyon.")
        await _applied(service, tenant_id, 1)
        first = (await service.api.get("/v1/admin/audit/verify", headers=headers)).json()
        assert first["ok"], first
        assert first["checked"] >= 3, first  # the tenant made, the chunk accepted, its changeset applied
        await service.say(headers, "bob", "I mainly use Python.")
        await _applied(service, tenant_id, 2)
    second = (await service.api.get("/v1/admin/audit/verify", headers=headers)).json()
    assert second["ok"], second
    assert second["checked"] > first["checked"], (first, second)
    assert second["unsealed"] == 0, second


async def test_a_webhook_is_delivered_to_its_receiver(service: Service) -> None:
    tenant_id, headers = await service.tenant("webhook")
    receiver = WebhookReceiver()
    await receiver.start()
    try:
        created = await service.api.post(
            "/v1/admin/webhooks",
            json={"url": receiver.url, "event_types": ["memory.added", "chunk.applied"]},
            headers=headers,
        )
        assert created.status_code == 201, created.text
        hook = created.json()
        receiver.secret = hook["secret"]
        async with running_worker(service.settings):
            chunk_id = await service.say(headers, "ada", "I live in Lyon.")
            await _applied(service, tenant_id, 1)
            received = await receiver.wait_for(2)

            async def deliveries() -> list[dict[str, Any]]:
                response = await service.api.get(
                    f"/v1/admin/webhooks/{hook['id']}/deliveries", headers=headers
                )
                assert response.status_code == 200, response.text
                items: list[dict[str, Any]] = response.json()["items"]
                return items

            await wait_for(
                deliveries,
                lambda items: len(items) == 2 and {d["status"] for d in items} == {"delivered"},
                timeout_s=30,
                what="both deliveries recorded as delivered",
            )
    finally:
        await receiver.stop()
    assert sorted(d.type for d in received) == ["chunk.applied", "memory.added"]
    assert receiver.refused == []
    applied = next(d for d in received if d.type == "chunk.applied")
    assert applied.data["chunk_id"] == chunk_id


async def test_the_sweeper_finds_a_scope_whose_wake_up_was_lost(service: Service) -> None:
    tenant_id, headers = await service.tenant("sweeper")
    await service.say(headers, "ada", "I live in Lyon.")  # no worker: it waits in Postgres
    redis = aioredis.from_url(service.settings.redis_url)
    try:
        await redis.flushall()  # the wake-up and the scheduler's state are lost
    finally:
        await redis.aclose()
    await asyncio.sleep(service.settings.sweep_min_age_s)
    stranded = await find_stranded_scopes(service.engine, service.settings.sweep_min_age_s)
    assert (tenant_id, "ada", False) in stranded, stranded
    async with running_worker(service.settings):
        await _applied(service, tenant_id, 1)
    assert await service.contents(headers, "ada") == ["The user lives in Lyon."]


async def test_an_llm_writer_profile_against_the_fake_model(service: Service) -> None:
    tenant_id, headers = await service.tenant("llm")
    service.fake_llm.requests.clear()
    async with running_worker(service.settings):
        await service.say(headers, "ada", "I live in Lyon.", writer="hy")
        await _applied(service, tenant_id, 1)
        await service.say(headers, "ada", "I mainly use Python.", writer="hy")
        await _applied(service, tenant_id, 2)
    assert service.fake_llm.requests, "the model was not asked"
    listing = (await service.api.get("/v1/memories", params={"user_id": "ada"}, headers=headers)).json()
    contents = sorted(m["content"] for m in listing["items"])
    assert contents == ["The user said: I live in Lyon.", "The user said: I mainly use Python."], contents
    history = (
        await service.api.get(f"/v1/memories/{listing['items'][0]['id']}/history", headers=headers)
    ).json()
    version = history["versions"][0]
    assert (version["writer"], version["model"], version["profile"]) == ("hy", "hy-memory", "hy-memory")


async def test_the_service_reads_the_catalog_without_hiding_shards(cluster: Cluster) -> None:
    """A new connection's type introspection (asyncpg's, for `vector` and the rest) reads pg_class; with
    Citus hiding shards it took about a second a type on the coordinator, every new connection."""
    conn = await cluster.connect(cluster.coordinator, user="memstore_service")
    try:
        assert await conn.fetchval("SHOW citus.override_table_visibility") == "off"
        assert await conn.fetchval("SHOW citus.allow_nested_distributed_execution") == "on"
    finally:
        await conn.close()
