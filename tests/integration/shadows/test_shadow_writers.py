"""Shadow writers: each writes the tenant's chunks into a bank of its own, which never shows in the
tenant's reads, never holds up or changes the primary bank, and is compared with it chunk by chunk."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent, Chunk, Memory, MemoryVersion, Tenant
from tests.conftest import TenantKeys, make_tenant
from tests.integration.shadows.conftest import FACTS
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.waiting import wait_for
from tests.support.workers import chunk_counts, running_worker, wait_for_chunks, wait_until

Client = AsyncTestClient[Litestar]


async def post_facts(api: Client, headers: dict[str, str], user: str = "ana") -> list[str]:
    ids = []
    for day, key in enumerate(FACTS, start=1):
        body = {
            "user_id": user,
            "messages": [
                {"role": "user", "content": f"{key}: note this", "created_at": f"2026-11-{day:02d}T10:00:00Z"}
            ],
        }
        response = await api.post("/v1/chunks", json=body, headers=headers)
        assert response.status_code == 202, response.text
        ids.append(response.json()["chunk_id"])
    return ids


async def bank_id(sm: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, name: str) -> uuid.UUID:
    async with sm() as session:
        found = await session.scalar(
            select(Tenant.id).where(
                Tenant.shadow_of == tenant_id, Tenant.settings["shadow"]["name"].astext == name
            )
        )
    assert found is not None, f"no bank {name}"
    return found


async def wait_for_bank(
    sm: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, name: str, expected: int
) -> dict[str, int]:
    async def exists() -> bool:
        async with sm() as session:
            return (
                await session.scalar(
                    select(Tenant.id).where(
                        Tenant.shadow_of == tenant_id, Tenant.settings["shadow"]["name"].astext == name
                    )
                )
                is not None
            )

    await wait_until(exists, 30, f"bank {name}")
    return await wait_for_chunks(sm, await bank_id(sm, tenant_id, name), expected, timeout_s=30)


async def test_a_shadow_bank_evolves_apart_and_the_comparison_counts_what_was_scripted(
    api: Client,
    tenant: TenantKeys,
    shadow_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    trial_llm: FakeLLM,
) -> None:
    response = await api.patch("/v1/admin/settings", json={"shadow_writers": ["trial"]}, headers=tenant.admin)
    assert response.status_code == 200, response.text
    assert response.json()["shadow_writers"] == ["trial"]
    async with running_worker(shadow_settings):
        await post_facts(api, tenant.admin)
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 4) == {"applied": 4}
        assert await wait_for_bank(sessionmaker, tenant.tenant_id, "trial", 4) == {"applied": 4}

    # The tenant's reads show its own bank only.
    listed = (await api.get("/v1/memories?user_id=ana", headers=tenant.admin)).json()["items"]
    assert sorted(m["content"] for m in listed) == sorted(FACTS.values())
    found = await api.post(
        "/v1/memories/search",
        json={"user_id": "ana", "query": "knitting sweaters hobby"},
        headers=tenant.admin,
    )
    assert all("Knitting" not in r["memory"]["content"] for r in found.json()["results"])
    # The shadow saw its own bank: the trial writer was called once per chunk.
    assert len(trial_llm.requests) == 4

    report = await api.get("/v1/admin/writers/compare?a=primary&b=trial", headers=tenant.admin)
    assert report.status_code == 200, report.text
    total = report.json()["tenant"]
    assert (total["chunks"], total["both_applied"], total["agreeing_chunks"], total["agreement"]) == (
        4,
        4,
        3,
        0.75,
    )
    assert total["a"]["ops"] == {"ADD": 4}
    assert total["b"]["ops"] == {"ADD": 3}
    assert (total["a"]["memories_per_chunk"], total["b"]["memories_per_chunk"]) == (1.0, 0.75)
    assert total["a"]["rates"] == total["b"]["rates"] == {"update": 0.0, "supersede": 0.0, "delete": 0.0}
    assert (total["a"]["failed"], total["b"]["failed"]) == (0, 0)
    assert total["b"]["tokens_per_chunk"]["prompt"] > 0
    memories = total["memories"]
    assert (memories["matched"], memories["only_a"], memories["only_b"]) == (2, 2, 1)
    assert sorted(memories["examples"]["only_a"]) == sorted([FACTS["F3"], FACTS["F4"]])
    assert memories["examples"]["only_b"] == ["Knitting sweaters is a favourite hobby."]
    per_chunk = {row["seq"]: row for row in report.json()["chunks"]}
    assert [per_chunk[s]["agree"] for s in (1, 2, 3, 4)] == [True, True, True, False]
    assert per_chunk[4]["b"]["ops"] == {}
    assert [u["user_id"] for u in report.json()["users"]] == ["ana"]

    banks = (await api.get("/v1/admin/banks", headers=tenant.admin)).json()["items"]
    assert [(b["name"], b["writer"], b["kind"], b["progress"]["applied"]) for b in banks] == [
        ("trial", "trial", "live", 4)
    ]
    missing = await api.get("/v1/admin/writers/compare?b=nope", headers=tenant.admin)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "bank_not_found"


async def _bank_as_written(sm: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID) -> dict[str, Any]:
    """What a tenant's own bank holds, without ids or times: memories, versions, audit actions."""
    async with sm() as session:
        memories = (
            await session.execute(
                select(Memory.user_id, Memory.content, Memory.status, Memory.version)
                .where(Memory.tenant_id == tenant_id)
                .order_by(Memory.user_id, Memory.content)
            )
        ).all()
        versions = (
            await session.execute(
                select(
                    MemoryVersion.version,
                    MemoryVersion.op,
                    MemoryVersion.content,
                    MemoryVersion.writer,
                    MemoryVersion.model,
                )
                .where(MemoryVersion.tenant_id == tenant_id)
                .order_by(MemoryVersion.content, MemoryVersion.version)
            )
        ).all()
        actions = (
            await session.scalars(
                select(AuditEvent.action).where(AuditEvent.tenant_id == tenant_id).order_by(AuditEvent.action)
            )
        ).all()
    return {"memories": list(memories), "versions": list(versions), "audit": list(actions)}


async def test_failing_and_slow_shadows_neither_delay_nor_change_the_primary(
    api: Client,
    tenant: TenantKeys,
    shadow_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    broken_llm: FakeLLM,
    slow_llm: FakeLLM,
) -> None:
    alone = await make_tenant(sessionmaker, "alone")
    for keys, shadows in ((tenant, ["broken", "slow", "trial"]), (alone, [])):
        response = await api.patch("/v1/admin/settings", json={"shadow_writers": shadows}, headers=keys.admin)
        assert response.status_code == 200, response.text
    async with running_worker(shadow_settings):
        for keys in (tenant, alone):
            for user in ("ana", "bo", "cy"):
                await post_facts(api, keys.admin, user)
        # Every primary chunk is applied while the slow shadow's first calls (20 s each) are still
        # out: the primary waited for none of them.
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 12, timeout_s=18) == {"applied": 12}
        assert await wait_for_chunks(sessionmaker, alone.tenant_id, 12, timeout_s=18) == {"applied": 12}
        slow = await bank_id(sessionmaker, tenant.tenant_id, "slow")
        assert (await chunk_counts(sessionmaker, slow)).get("applied", 0) == 0
        # ... and the slow shadow is at work (on a loaded machine its first call may start just after).
        await wait_for(
            lambda: slow_llm.in_flight, lambda n: n >= 1, timeout_s=10, what="the slow shadow's first call"
        )
        assert (await chunk_counts(sessionmaker, slow)).get("applied", 0) == 0
        # A bank's scopes take at most half of the worker's shadow slots.
        assert slow_llm.max_in_flight <= shadow_settings.shadow_max_jobs // 2
        # The failing shadow's chunks fail in its own bank, with the error kept there.
        broken = await wait_for_bank(sessionmaker, tenant.tenant_id, "broken", 12)
        assert broken == {"failed": 12}
        assert len(broken_llm.requests) >= 12

    mine, theirs = (
        await _bank_as_written(sessionmaker, tenant.tenant_id),
        await _bank_as_written(sessionmaker, alone.tenant_id),
    )
    assert mine["memories"] == theirs["memories"]
    assert mine["versions"] == theirs["versions"]
    # The only audit events that differ are the settings changes themselves.
    assert [a for a in mine["audit"] if a != "tenant.shadow_writers_set"] == [
        a for a in theirs["audit"] if a != "tenant.shadow_writers_set"
    ]
    async with sessionmaker() as session:
        errors = (
            await session.scalars(
                select(Chunk.last_error).where(
                    Chunk.tenant_id == await bank_id(sessionmaker, tenant.tenant_id, "broken")
                )
            )
        ).all()
    assert errors
    assert all(e and "500" in e for e in errors)


async def test_shadow_writers_must_be_configured_writers(api: Client, tenant: TenantKeys) -> None:
    response = await api.patch(
        "/v1/admin/settings", json={"shadow_writers": ["trial", "nope"]}, headers=tenant.admin
    )
    assert response.status_code == 422
    assert response.json()["error"]["details"]["field"] == "shadow_writers[1]"
    assert (await api.get("/v1/admin/settings", headers=tenant.admin)).json()["shadow_writers"] is None


async def test_a_purge_erases_the_users_copies_in_shadow_banks(
    api: Client, tenant: TenantKeys, shadow_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await api.patch("/v1/admin/settings", json={"shadow_writers": ["trial"]}, headers=tenant.admin)
    async with running_worker(shadow_settings):
        await post_facts(api, tenant.admin)
        await wait_for_bank(sessionmaker, tenant.tenant_id, "trial", 4)
    response = await api.delete("/v1/admin/users/ana?purge=true", headers=tenant.admin)
    assert response.status_code == 200, response.text
    trial = await bank_id(sessionmaker, tenant.tenant_id, "trial")
    async with sessionmaker() as session:
        left = await session.scalar(select(Memory.id).where(Memory.tenant_id == trial).limit(1))
        chunks = await session.scalar(select(Chunk.id).where(Chunk.tenant_id == trial).limit(1))
    assert left is None
    assert chunks is None
    assert response.json()["deleted"]["chunks"] == 8


async def test_a_replay_asked_over_the_api_is_written_by_the_workers_and_resumes(
    api: Client, tenant: TenantKeys, shadow_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await post_facts(api, tenant.admin)
    async with running_worker(shadow_settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 4)
        response = await api.post(
            "/v1/admin/replays", json={"writer": "trial", "name": "t1"}, headers=tenant.admin
        )
        assert response.status_code == 202, response.text
        assert (response.json()["fed"], response.json()["complete"]) == (4, True)
        assert await wait_for_bank(sessionmaker, tenant.tenant_id, "t1", 4) == {"applied": 4}
        again = await api.post(
            "/v1/admin/replays", json={"writer": "trial", "name": "t1"}, headers=tenant.admin
        )
        assert again.json()["fed"] == 0
        assert again.json()["bank"]["progress"] == {"total": 4, "applied": 4, "failed": 0, "pending": 0}
    clash = await api.post(
        "/v1/admin/replays", json={"writer": "primary", "name": "t1"}, headers=tenant.admin
    )
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "bank_conflict"
    unknown = await api.post("/v1/admin/replays", json={"writer": "nope"}, headers=tenant.admin)
    assert unknown.status_code == 422
    report = (await api.get("/v1/admin/writers/compare?b=t1", headers=tenant.admin)).json()
    assert report["tenant"]["agreement"] == 0.75


async def test_a_failed_chunk_shows_what_its_writer_said_and_what_its_calls_cost(
    api: Client,
    tenant: TenantKeys,
    shadow_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    primary_llm: FakeLLM,
) -> None:
    # The same unusable answer twice at temperature 0: the chunk fails on its first attempt.
    primary_llm.enqueue(Reply(content="not json at all"), Reply(content="not json at all"))
    body = {"user_id": "ana", "messages": [{"role": "user", "content": "F1: note this"}]}
    chunk_id = (await api.post("/v1/chunks", json=body, headers=tenant.admin)).json()["chunk_id"]
    async with running_worker(shadow_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 1) == {"failed": 1}
    shown = (await api.get(f"/v1/chunks/{chunk_id}", headers=tenant.admin)).json()
    assert "not json at all" in shown["raw_output"]
    assert shown["usage"]["calls"] == 2
    assert shown["usage"]["prompt_tokens"] > 0
    ingest_only = (
        await api.post("/v1/admin/keys", json={"name": "in", "roles": ["ingest"]}, headers=tenant.admin)
    ).json()["key"]
    seen = (
        await api.get(f"/v1/chunks/{chunk_id}", headers={"Authorization": f"Bearer {ingest_only}"})
    ).json()
    assert seen["raw_output"] is None
    assert seen["usage"] == shown["usage"]
