"""A writer's dated plans expire: Hy-Memory's `intentions` with `valid_until` become memories that
expire when their day is over, and an expired memory is never among the candidates a writer is shown
(through the real API, a real worker and the fake model server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import FAST_WORKERS, TenantKeys, writers_toml
from tests.support.fake_llm import FakeLLM, Reply, read_call
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]

DENTIST = "The user plans to visit the dentist in Lyon on 2026-11-02."
JAPAN = "The user plans to visit Japan in December 2099."


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
def llm_settings(settings: Settings, tmp_path: Path, fake_llm: FakeLLM) -> Settings:
    path = tmp_path / "writers.toml"
    fields = {"base_url": fake_llm.base_url, "model": "hy-memory", "timeout_s": 1.0, "max_retries": 1}
    path.write_text(writers_toml({"hy": {"profile": "hy-memory", **fields}}))
    return settings.model_copy(update={**FAST_WORKERS, "writers_file": path, "writer_timeout_s": 5.0})


@pytest.fixture
def api_settings(llm_settings: Settings) -> Settings:
    return llm_settings


async def _post(api: Client, headers: dict[str, str], text: str, day: int) -> None:
    chunk = {
        "user_id": "ana",
        "writer": "hy",
        "messages": [{"role": "user", "content": text, "created_at": f"2026-11-{day:02d}T10:00:00Z"}],
    }
    response = await api.post("/v1/chunks", json=chunk, headers=headers)
    assert response.status_code == 202, response.text


async def _memories(api: Client, headers: dict[str, str], **params: Any) -> dict[str, Any]:
    response = await api.get("/v1/memories", params={"user_id": "ana", **params}, headers=headers)
    assert response.status_code == 200, response.text
    return {m["content"]: m for m in response.json()["items"]}


def _shown_to_reconcile(fake_llm: FakeLLM) -> list[str]:
    calls = [read_call(body) for body in fake_llm.requests]
    [reconcile] = [call for call in calls if call.protocol == "hy-memory.reconcile"]
    fake_llm.requests.clear()
    return [m["content"] for m in reconcile.existing]


async def test_a_dated_plan_expires_and_is_no_longer_shown_to_the_writer(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    plans = {
        "memory": [],
        "intentions": [
            {"content": DENTIST, "tags": ["health"], "valid_until": "2026-11-02", "owner": "user"},
            {"content": JAPAN, "tags": ["travel"], "valid_until": "2099-12-31", "owner": "user"},
        ],
    }
    again = {"memory": [{"content": "The user plans to visit the dentist and Japan again.", "tags": []}]}
    fake_llm.enqueue(Reply.json(plans))
    await _post(api, ingest_headers, "Dentist in Lyon on the 2nd; Japan in December 2099.", 1)
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 1) == {"applied": 1}

        every = await _memories(api, ingest_headers, include_expired="true")
        assert every[DENTIST]["expires_at"] == "2026-11-03T00:00:00Z"  # once 2 November is over (UTC)
        assert every[JAPAN]["expires_at"] == "2100-01-01T00:00:00Z"
        # The plan held until its day was over: that is its validity too.
        assert [every[DENTIST]["valid_to"], every[JAPAN]["valid_to"]] == [
            "2026-11-03T00:00:00Z",
            "2100-01-01T00:00:00Z",
        ]
        assert set(await _memories(api, ingest_headers)) == {JAPAN}
        search = {"user_id": "ana", "query": "when is the dentist appointment in Lyon"}
        found = await api.post("/v1/memories/search", json=search, headers=ingest_headers)
        assert DENTIST not in [r["memory"]["content"] for r in found.json()["results"]]
        found = await api.post(
            "/v1/memories/search", json={**search, "include_expired": True}, headers=ingest_headers
        )
        assert found.json()["results"][0]["memory"]["content"] == DENTIST

        # A later chunk about both plans: the writer is shown the live one only.
        fake_llm.enqueue(Reply.json(again), Reply.json([]))
        await _post(api, ingest_headers, "I'll go to the dentist and to Japan again.", 20)
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2) == {"applied": 2}
        assert _shown_to_reconcile(fake_llm) == [JAPAN]

        # Its expiry cleared by hand (a version, revertible), the plan is shown to the writer again.
        editor = await api.post(
            "/v1/admin/keys", json={"name": "ed", "roles": ["read", "write"]}, headers=tenant.admin
        )
        headers = {"Authorization": f"Bearer {editor.json()['key']}"}
        dentist_id = every[DENTIST]["id"]
        cleared = await api.patch(f"/v1/memories/{dentist_id}", json={"expires_at": None}, headers=headers)
        assert cleared.status_code == 200, cleared.text
        fake_llm.enqueue(Reply.json(again), Reply.json([]))
        await _post(api, ingest_headers, "I'll go to the dentist and to Japan again.", 21)
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 3) == {"applied": 3}
        assert sorted(_shown_to_reconcile(fake_llm)) == sorted([DENTIST, JAPAN])
