"""Each profile end to end: API -> worker -> fake model over HTTP -> ops applied with provenance."""

from __future__ import annotations

import json
import uuid
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Changeset, Chunk, Memory, MemoryVersion
from app.writers.profiles import get_profile
from tests.conftest import TenantKeys
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]


async def post(api: Client, headers: dict[str, str], user: str, text: str, day: int, **extra: Any) -> str:
    chunk = {
        "user_id": user,
        "messages": [
            {"role": "user", "content": text, "created_at": f"2026-11-{day:02d}T10:00:00Z"},
            {"role": "assistant", "content": "Noted."},
        ],
        **extra,
    }
    response = await api.post("/v1/chunks", json=chunk, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["chunk_id"])


async def memories(sm: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, user: str) -> dict[str, str]:
    async with sm() as session:
        rows = await session.execute(
            select(Memory.content, Memory.status).where(Memory.tenant_id == tenant_id, Memory.user_id == user)
        )
        return dict(rows.all())


async def changeset_of(sm: async_sessionmaker[AsyncSession], chunk_id: str) -> Changeset:
    async with sm() as session:
        chunk = await session.get(Chunk, uuid.UUID(chunk_id))
        assert chunk is not None
        assert chunk.changeset_id is not None, "chunk has no changeset"
        changeset = await session.get(Changeset, chunk.changeset_id)
        assert changeset is not None
        return changeset


async def test_hy_memory_extracts_then_reconciles_with_supersede(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    fake_llm.enqueue(
        # chunk 1: nothing retrieved, so the extracted memory is added without a reconcile call
        Reply.json({"memory": [{"content": "The user lives in Lyon.", "tags": ["home"], "owner": "user"}]}),
        # chunk 2: extract, then reconcile against the Lyon memory shown as id "0"
        Reply.json(
            {"memory": [{"content": "The user lives in Seattle.", "tags": ["home"], "owner": "user"}]}
        ),
        Reply.json(
            [
                {
                    "op": "SUPERSEDE",
                    "memory_ids": ["0"],
                    "content": "The user lives in Seattle.",
                    "supersede_reason": "moved",
                    "owner": "user",
                    "tags": ["home"],
                }
            ]
        ),
    )
    first = await post(api, ingest_headers, "ana", "I live in Lyon.", 1, writer="hy")
    second = await post(api, ingest_headers, "ana", "I moved to Seattle last month.", 20, writer="hy")
    async with running_worker(llm_settings):
        counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, 2)
    assert counts == {"applied": 2}
    assert await memories(sessionmaker, tenant.tenant_id, "ana") == {
        "The user lives in Lyon.": "superseded",
        "The user lives in Seattle.": "active",
    }

    assert len(fake_llm.requests) == 3
    for body in fake_llm.requests:
        assert body["model"] == "hy-memory"
        assert body["temperature"] == 0
        assert body["chat_template_kwargs"] == {"reasoning_effort": "no_think"}
        assert body["response_format"]["type"] == "json_schema"
    extract, reconcile = fake_llm.requests[1], fake_llm.requests[2]
    assert "I moved to Seattle last month." in extract["messages"][1]["content"]
    assert "I live in Lyon." in extract["messages"][1]["content"]  # earlier messages, for coreference
    assert "Memory date (when the conversation happened): 2026-11-20" in extract["messages"][0]["content"]
    shown = reconcile["messages"][1]["content"]
    assert '"memory_id": "0"' in shown
    # The schema of that call requires the ids, and allows only the one shown.
    branches = reconcile["response_format"]["json_schema"]["schema"]["items"]["anyOf"]
    by_op = {branch["properties"]["op"]["enum"][0]: branch for branch in branches}
    assert by_op["UPDATE"]["properties"]["memory_id"]["enum"] == ["0"]
    assert "memory_id" in by_op["UPDATE"]["required"]
    assert by_op["SUPERSEDE"]["properties"]["memory_ids"]["items"]["enum"] == ["0"]
    assert "memory_ids" in by_op["SUPERSEDE"]["required"]
    assert "The user lives in Lyon." in shown
    assert reconcile["max_tokens"] > extract["max_tokens"] or reconcile["max_tokens"] >= 256

    changeset = await changeset_of(sessionmaker, second)
    assert (changeset.writer, changeset.model, changeset.profile) == ("hy", "hy-memory", "hy-memory")
    assert changeset.prompt_hash == get_profile("hy-memory").prompts.hash
    assert changeset.usage["calls"] == 2
    assert changeset.usage["completion_tokens"] > 0
    assert [step["step"] for step in json.loads(changeset.raw_output or "[]")] == ["extract", "reconcile"]
    assert [op["op"] for op in changeset.ops] == ["SUPERSEDE"]
    assert (await changeset_of(sessionmaker, first)).usage["calls"] == 1


async def test_mem0_events_apply_and_invented_ids_are_ignored(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    fake_llm.enqueue(
        Reply.json({"facts": ["Likes jazz", "Works as a nurse"]}),
        Reply.json({"facts": ["No longer likes jazz", "Has a dog named Rex"]}),
        Reply.json(
            {
                "memory": [
                    {"id": "0", "text": "Likes jazz", "event": "DELETE"},
                    {"id": "1", "text": "Works as a nurse", "event": "NONE"},
                    {"id": "7", "text": "Has a cat", "event": "UPDATE", "old_memory": "?"},
                    {"id": "8", "text": "Has a dog named Rex", "event": "ADD"},
                ]
            }
        ),
    )
    await post(api, ingest_headers, "ben", "I like jazz and I work as a nurse.", 1, writer="mem0")
    second = await post(
        api, ingest_headers, "ben", "Jazz bores me now. My dog Rex is great.", 2, writer="mem0"
    )
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2) == {"applied": 2}
    assert await memories(sessionmaker, tenant.tenant_id, "ben") == {
        "Likes jazz": "deleted",
        "Works as a nurse": "active",
        "Has a dog named Rex": "active",
    }
    update = fake_llm.requests[2]["messages"][1]["content"]
    assert '"id": "0"' in update
    assert '"id": "1"' in update
    schema = fake_llm.requests[2]["response_format"]["json_schema"]["schema"]
    add, change = schema["properties"]["memory"]["items"]["anyOf"]
    assert change["properties"]["id"]["enum"] == ["0", "1"]  # the memories shown
    assert add["properties"]["id"]["enum"] == ["2", "3"]  # one new id per new fact
    changeset = await changeset_of(sessionmaker, second)
    assert changeset.profile == "mem0"
    assert [g["guard"] for g in changeset.guards] == ["unknown_id"]
    assert sorted(op["op"] for op in changeset.ops) == ["ADD", "DELETE"]


async def test_simple_profile_adds_and_near_duplicates_become_noops(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    fake_llm.enqueue(
        Reply.json(
            {"memories": ["The user likes green tea.", "The user likes green tea!", "The user is a pilot."]}
        ),
        Reply.json({"memories": ["The user likes green tea."]}),
    )
    await post(api, ingest_headers, "cy", "I like green tea. I'm a pilot.", 1, writer="simple")
    second = await post(api, ingest_headers, "cy", "Green tea is my favourite.", 2, writer="simple")
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2) == {"applied": 2}
    assert await memories(sessionmaker, tenant.tenant_id, "cy") == {
        "The user likes green tea.": "active",
        "The user is a pilot.": "active",
    }
    assert "response_format" in fake_llm.requests[0]
    assert "chat_template_kwargs" not in fake_llm.requests[0]  # only the hy-memory profile sends it
    changeset = await changeset_of(sessionmaker, second)
    assert [g["guard"] for g in changeset.guards] == ["near_duplicate"]
    assert [op["op"] for op in changeset.ops] == ["NOOP"]
    assert changeset.ops[0]["duplicate_of"]


async def test_memos_memory_list_is_added_with_its_tags_and_repeats_become_noops(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    fake_llm.enqueue(
        Reply.json(
            {
                "memory list": [
                    {
                        "key": "Home city",
                        "memory_type": "UserMemory",
                        "value": "The user lives in Lyon.",
                        "tags": ["home", "city"],
                    },
                    {
                        "key": "Trip to Oslo",
                        "memory_type": "LongTermMemory",
                        "value": "The user plans a trip to Oslo on 2026-12-10.",
                        "tags": ["travel"],
                    },
                ],
                "summary": "The user lives in Lyon and plans a trip to Oslo.",
            }
        ),
        Reply.json(
            {
                "memory list": [
                    {
                        "key": "Home",
                        "memory_type": "UserMemory",
                        "value": "The user lives in Lyon.",
                        "tags": [],
                    }
                ],
                "summary": "The user lives in Lyon.",
            }
        ),
    )
    first = await post(api, ingest_headers, "di", "I live in Lyon; Oslo on December 10!", 1, writer="memos")
    second = await post(api, ingest_headers, "di", "Lyon is home.", 2, writer="memos")
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2) == {"applied": 2}
    assert await memories(sessionmaker, tenant.tenant_id, "di") == {
        "The user lives in Lyon.": "active",
        "The user plans a trip to Oslo on 2026-12-10.": "active",
    }

    extract, later = fake_llm.requests
    schema = extract["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["memory list", "summary"]
    item = schema["properties"]["memory list"]["items"]
    assert item["properties"]["memory_type"]["enum"] == ["UserMemory", "LongTermMemory"]
    assert '"memory list"' in extract["messages"][0]["content"]
    assert "I live in Lyon" in later["messages"][1]["content"]  # earlier messages, for who and what

    changeset = await changeset_of(sessionmaker, first)
    assert (changeset.writer, changeset.profile) == ("memos", "memos")
    assert changeset.prompt_hash == get_profile("memos").prompts.hash
    assert [(op["op"], op["tags"]) for op in changeset.ops] == [
        ("ADD", ["home", "city"]),
        ("ADD", ["travel"]),
    ]
    async with sessionmaker() as session:
        reasons = await session.scalars(
            select(MemoryVersion.reason)
            .where(MemoryVersion.changeset_id == changeset.id)
            .order_by(MemoryVersion.reason)
        )
        assert list(reasons) == ["LongTermMemory: Trip to Oslo", "UserMemory: Home city"]
    assert "plans a trip to Oslo" in json.loads(changeset.raw_output or "[]")[0]["output"]  # the summary
    changeset = await changeset_of(sessionmaker, second)
    assert [g["guard"] for g in changeset.guards] == ["near_duplicate"]
    assert [op["op"] for op in changeset.ops] == ["NOOP"]


async def test_tenant_default_writer_and_the_chunk_field_choose_the_writer(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    refused = await api.patch("/v1/admin/settings", json={"writer": "nope"}, headers=tenant.admin)
    assert refused.status_code == 422
    assert refused.json()["error"]["details"]["field"] == "writer"
    response = await api.patch("/v1/admin/settings", json={"writer": "simple"}, headers=tenant.admin)
    assert response.status_code == 200
    assert response.json()["writer"] == "simple"
    assert (await api.get("/v1/admin/settings", headers=tenant.admin)).json()["writer"] == "simple"
    forbidden = await api.patch("/v1/admin/settings", json={"writer": "hy"}, headers=ingest_headers)
    assert forbidden.status_code == 403

    by_tenant = await post(api, ingest_headers, "dee", "I'm a chess player.", 1)
    by_chunk = await post(api, ingest_headers, "dee", "I play the cello.", 2, writer="offline")
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2) == {"applied": 2}
    assert (await changeset_of(sessionmaker, by_tenant)).writer == "simple"
    assert (await changeset_of(sessionmaker, by_chunk)).writer == "offline"
    assert len(fake_llm.requests) == 1
