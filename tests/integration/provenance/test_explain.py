"""`GET /v1/memories/{id}/explain`: each version beside the messages, context, candidates and changeset
behind it, written by the real pipeline; chunks show their messages to keys that may read them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent
from app.server.asgi import create_app
from tests.conftest import TenantKeys, bearer
from tests.support.fake_llm import FakeLLM
from tests.support.scenario import user_chunks
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]


async def _key(client: Client, tenant: TenantKeys, roles: list[str]) -> dict[str, str]:
    response = await client.post("/v1/admin/keys", json={"name": "k", "roles": roles}, headers=tenant.admin)
    assert response.status_code == 201, response.text
    return bearer(response.json()["key"])


async def _memories(client: Client, tenant: TenantKeys) -> dict[str, dict[str, Any]]:
    response = await client.get(
        "/v1/memories", params={"user_id": "ana", "status": "all"}, headers=tenant.admin
    )
    return {m["content"]: m for m in response.json()["items"]}


async def _seed(
    client: Client, tenant: TenantKeys, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> list[dict[str, Any]]:
    """Ana says she lives in Lyon, is vegetarian, then moved to Seattle (which supersedes Lyon)."""
    chunks = user_chunks(
        "ana", facts=["I live in Lyon.", "I'm vegetarian.", "I moved to Seattle last month."]
    )
    accepted = []
    for chunk in chunks:
        response = await client.post("/v1/chunks", json=chunk, headers=tenant.admin)
        assert response.status_code == 202, response.text
        accepted.append(response.json())
    async with running_worker(settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 3) == {"applied": 3}
    return accepted


async def test_explain_shows_each_version_with_its_messages_context_candidates_and_changes(
    client: Client, tenant: TenantKeys, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    accepted = await _seed(client, tenant, settings, sessionmaker)
    memories = await _memories(client, tenant)
    lyon, seattle = memories["The user lives in Lyon."], memories["The user lives in Seattle."]

    response = await client.get(f"/v1/memories/{seattle['id']}/explain", headers=tenant.admin)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["memory"]["content"] == "The user lives in Seattle."
    [added] = body["versions"]
    assert added["version"]["op"] == "ADD"
    assert added["version"]["writer"] == "offline"
    assert added["version"]["supersedes"] == [lyon["id"]]
    source = added["source"]
    assert source["chunk_id"] == accepted[2]["chunk_id"]
    assert source["seq"] == 3
    assert [m["content"] for m in source["messages"]] == ["I moved to Seattle last month.", "Got it."]
    # The offline writer reads only the new messages: the context it was given is empty.
    assert source["context"] == []
    # It was shown the Lyon memory (at version 1) under a local id, and superseded it.
    shown = {c["memory_id"]: c for c in added["candidates"]}
    assert shown[lyon["id"]]["content"] == "The user lives in Lyon."
    assert shown[lyon["id"]]["version"] == 1
    assert shown[lyon["id"]]["status"] == "active"
    changeset = added["changeset"]
    assert changeset["kind"] == "writer"
    assert changeset["status"] == "applied"
    assert [op["op"] for op in changeset["ops"]] == ["SUPERSEDE"]
    assert changeset["raw_output"] is None  # only when asked, by an admin

    # Lyon: added by chunk 1 (no earlier context, nothing to be shown), superseded by chunk 3.
    lyon_versions = (await client.get(f"/v1/memories/{lyon['id']}/explain", headers=tenant.admin)).json()[
        "versions"
    ]
    assert [v["version"]["op"] for v in lyon_versions] == ["ADD", "SUPERSEDE"]
    assert lyon_versions[0]["source"]["context"] == []
    assert lyon_versions[0]["candidates"] == []
    assert lyon_versions[1]["source"]["chunk_id"] == accepted[2]["chunk_id"]

    # An admin rolls Lyon back: a version with no chunk, written by the admin's key.
    rolled = await client.post(
        f"/v1/admin/memories/{lyon['id']}/rollback",
        json={"to_version": 1, "reason": "she moved back"},
        headers=tenant.admin,
    )
    assert rolled.status_code == 200, rolled.text
    lyon_versions = (await client.get(f"/v1/memories/{lyon['id']}/explain", headers=tenant.admin)).json()[
        "versions"
    ]
    last = lyon_versions[-1]
    assert last["version"]["op"] == "ROLLBACK"
    assert last["version"]["actor"].startswith("key:")
    assert last["version"]["reason"] == "she moved back"
    assert last["source"] is None
    assert last["candidates"] is None
    assert last["changeset"]["kind"] == "rollback"


@pytest.fixture
async def llm_settings(settings: Settings, tmp_path: Path) -> AsyncIterator[Settings]:
    """A hy-memory writer named `hy` on the fake model server, shown the scope's last 4 messages."""
    async with FakeLLM() as fake:
        path = tmp_path / "writers.toml"
        path.write_text(
            f'[writers.hy]\nprofile = "hy-memory"\nbase_url = "{fake.base_url}"\nmodel = "hy-memory"\n'
            "context_messages = 4\n"
        )
        yield settings.model_copy(update={"writers_file": path, "writer": "hy"})


async def test_a_model_writers_view_and_raw_output_are_explained_and_raw_reads_audited(
    llm_settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    async with AsyncTestClient(create_app(llm_settings, configure_logs=False)) as client:
        facts = ["I live in Lyon.", "I'm vegetarian.", "I live in Lyon and I love jazz."]
        for chunk in user_chunks("ana", facts=facts):
            assert (await client.post("/v1/chunks", json=chunk, headers=tenant.admin)).status_code == 202
        async with running_worker(llm_settings):
            assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 3) == {"applied": 3}
        memories = await _memories(client, tenant)
        lyon = memories["The user said: I live in Lyon."]
        jazz = memories["The user said: I live in Lyon and I love jazz."]
        path = f"/v1/memories/{jazz['id']}/explain"

        [added] = (await client.get(path, headers=tenant.admin)).json()["versions"]
        assert added["version"]["model"] == "hy-memory"
        assert added["version"]["profile"] == "hy-memory"
        assert added["version"]["prompt_hash"]
        # The scope's last 4 messages before the chunk, as the writer was given them.
        assert [m["content"] for m in added["source"]["context"]] == [
            "I live in Lyon.",
            "Got it.",
            "I'm vegetarian.",
            "Got it.",
        ]
        # What it retrieved for what it extracted: the Lyon memory, at the version it then had.
        shown = {c["memory_id"]: c for c in added["candidates"]}
        assert shown[lyon["id"]]["content"] == "The user said: I live in Lyon."
        assert shown[lyon["id"]]["version"] == 1
        assert added["changeset"]["raw_output"] is None

        reader = await _key(client, tenant, ["read"])
        assert (await client.get(path, headers=reader)).status_code == 200
        refused = await client.get(path, params={"raw_output": "true"}, headers=reader)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"

        async def raw_reads() -> list[str | None]:
            async with sessionmaker() as session:
                rows = await session.scalars(
                    select(AuditEvent.target_id).where(AuditEvent.action == "changeset.raw_read")
                )
                return list(rows)

        assert await raw_reads() == []
        body = (await client.get(path, params={"raw_output": "true"}, headers=tenant.admin)).json()
        raw = body["versions"][0]["changeset"]["raw_output"]
        assert "I live in Lyon and I love jazz." in raw
        assert await raw_reads() == [body["versions"][0]["changeset"]["id"]]


async def test_explain_is_404_for_another_tenant_and_401_without_a_key(
    client: Client,
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await _seed(client, tenant, settings, sessionmaker)
    seattle = (await _memories(client, tenant))["The user lives in Seattle."]
    path = f"/v1/memories/{seattle['id']}/explain"
    other = await client.get(path, headers=other_tenant.admin)
    assert other.status_code == 404
    assert other.json()["error"]["code"] == "not_found"
    assert (await client.get(path)).status_code == 401
    ingest_only = await _key(client, tenant, ["ingest"])
    assert (await client.get(path, headers=ingest_only)).status_code == 403


async def test_a_chunk_shows_its_messages_to_keys_that_may_read_them(
    client: Client, tenant: TenantKeys
) -> None:
    body = {
        "user_id": "ana",
        "messages": [{"role": "user", "content": "I live in Lyon."}],
        "metadata": {"channel": "web"},
    }
    chunk_id = (await client.post("/v1/chunks", json=body, headers=tenant.admin)).json()["chunk_id"]
    reader = await _key(client, tenant, ["read"])
    ingester = await _key(client, tenant, ["ingest"])

    seen = (await client.get(f"/v1/chunks/{chunk_id}", headers=reader)).json()
    assert [m["content"] for m in seen["messages"]] == ["I live in Lyon."]
    assert seen["metadata"] == {"channel": "web"}
    hidden = (await client.get(f"/v1/chunks/{chunk_id}", headers=ingester)).json()
    assert hidden["status"] == "queued"
    assert hidden["messages"] is None
    assert hidden["metadata"] is None


async def test_explain_shows_when_each_version_and_each_memory_shown_held(
    client: Client, tenant: TenantKeys, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """Ana lived in Lyon (said in 2020), then "moved to Berlin last month" (said 10 March 2024, Berlin
    time): Berlin held from 1 February, Lyon until then."""
    said = (
        ("I live in Lyon.", "2020-01-05T10:00:00Z"),
        ("I moved to Berlin last month.", "2024-03-10T09:00:00+01:00"),
    )
    async with running_worker(settings):
        for count, (text, at) in enumerate(said, start=1):
            body = {"user_id": "ana", "messages": [{"role": "user", "content": text, "created_at": at}]}
            assert (await client.post("/v1/chunks", json=body, headers=tenant.admin)).status_code == 202
            await wait_for_chunks(sessionmaker, tenant.tenant_id, count)
    memories = await _memories(client, tenant)
    lyon, berlin = memories["The user lives in Lyon."], memories["The user lives in Berlin."]
    moved = "2024-01-31T23:00:00Z"  # 1 February, midnight at +01:00

    body = (await client.get(f"/v1/memories/{lyon['id']}/explain", headers=tenant.admin)).json()
    assert (body["memory"]["valid_from"], body["memory"]["valid_to"]) == (None, moved)
    # Open when it was added, closed by the SUPERSEDE that replaced it.
    assert [(v["version"]["op"], v["version"]["valid_to"]) for v in body["versions"]] == [
        ("ADD", None),
        ("SUPERSEDE", moved),
    ]

    body = (await client.get(f"/v1/memories/{berlin['id']}/explain", headers=tenant.admin)).json()
    assert (body["memory"]["valid_from"], body["memory"]["valid_to"]) == (moved, None)
    [added] = body["versions"]
    assert (added["version"]["valid_from"], added["version"]["valid_to"]) == (moved, None)
    # The writer was shown Lyon as it then stood: still open.
    [shown] = added["candidates"]
    assert shown["memory_id"] == lyon["id"]
    assert (shown["version"], shown["valid_from"], shown["valid_to"]) == (1, None, None)
