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


async def changeset_of(
    sm: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, chunk_id: str
) -> Changeset:
    async with sm() as session:
        chunk = await session.get(Chunk, (tenant_id, uuid.UUID(chunk_id)))
        assert chunk is not None
        assert chunk.changeset_id is not None, "chunk has no changeset"
        changeset = await session.get(Changeset, (tenant_id, chunk.changeset_id))
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
        assert "response_format" not in body  # the framework asks for a ```json fence, by prompt
    extract, reconcile = fake_llm.requests[1], fake_llm.requests[2]
    assert [m["role"] for m in extract["messages"]] == ["system", "user"]
    prompt = extract["messages"][1]["content"]
    # the new messages as the framework hands them over, a JSON array; the earlier ones as its history
    assert '[{"role": "user", "content": "I moved to Seattle last month."}, ' in prompt
    assert "[user]: I live in Lyon.\n[assistant]: Noted." in prompt
    assert "## Memory Date\n\n2026-11-20\n" in prompt
    assert extract["max_tokens"] == 2000
    # reconcile: one user message after an empty system message, existing memories before new ones
    assert reconcile["messages"][0] == {"role": "system", "content": ""}
    shown = reconcile["messages"][1]["content"]
    assert shown.index("## Existing memories") < shown.index("## New memories")
    assert '"memory_id": "0",\n    "content": "The user lives in Lyon."' in shown
    assert '"memory_at": "2026-11-20 10:00"' in shown
    assert reconcile["max_tokens"] == 2000

    changeset = await changeset_of(sessionmaker, tenant.tenant_id, second)
    assert (changeset.writer, changeset.model, changeset.profile) == ("hy", "hy-memory", "hy-memory")
    assert changeset.prompt_hash == get_profile("hy-memory").prompts.hash
    assert changeset.usage["calls"] == 2
    assert changeset.usage["completion_tokens"] > 0
    assert [step["step"] for step in json.loads(changeset.raw_output or "[]")] == ["extract", "reconcile"]
    assert [op["op"] for op in changeset.ops] == ["SUPERSEDE"]
    assert (await changeset_of(sessionmaker, tenant.tenant_id, first)).usage["calls"] == 1


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
        # Mem0 makes the update call with no memory to show too ("Current memory is empty.")
        Reply.json(
            {
                "memory": [
                    {"id": "0", "text": "Likes jazz", "event": "ADD"},
                    {"id": "1", "text": "Works as a nurse", "event": "ADD"},
                ]
            }
        ),
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
    assert "Current memory is empty." in fake_llm.requests[1]["messages"][0]["content"]
    update = fake_llm.requests[3]
    assert [m["role"] for m in update["messages"]] == ["user"]  # Mem0's update is one user message
    # the memories shown and the new facts as Mem0 writes them in: Python lists
    assert (
        "{'id': '0', 'text': 'Likes jazz'}, {'id': '1', 'text': 'Works as a nurse'}"
        in (update["messages"][0]["content"])
    )
    assert "['No longer likes jazz', 'Has a dog named Rex']" in update["messages"][0]["content"]
    assert update["response_format"] == {"type": "json_object"}
    changeset = await changeset_of(sessionmaker, tenant.tenant_id, second)
    assert changeset.profile == "mem0"
    assert [g["guard"] for g in changeset.guards] == ["unknown_id"]
    assert sorted(op["op"] for op in changeset.ops) == ["ADD", "DELETE"]


async def test_mem0_events_without_text_are_skipped_as_mem0_skips_them_and_recorded_as_guards(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    """Mem0 skips an event whose `text` is missing or empty, whatever it asks; so does the profile, but
    a change the model asked for and was not made is on the changeset and /explain, not lost."""
    fake_llm.enqueue(
        Reply.json({"facts": ["Likes tea", "Moved to Oslo"]}),
        Reply.json(
            {
                "memory": [
                    {"id": "0", "text": "Likes tea", "event": "ADD"},
                    {"id": "1", "text": "", "event": "ADD"},
                    {"id": "2", "event": "UPDATE"},
                    {"id": "3", "text": "", "event": "NONE"},  # no change asked: nothing is lost
                ]
            }
        ),
    )
    chunk = await post(api, ingest_headers, "dee", "I like tea. I moved to Oslo.", 1, writer="mem0")
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 1) == {"applied": 1}
    assert await memories(sessionmaker, tenant.tenant_id, "dee") == {"Likes tea": "active"}

    changeset = await changeset_of(sessionmaker, tenant.tenant_id, chunk)
    assert [op["op"] for op in changeset.ops] == ["ADD"]
    assert [(g["guard"], g["op_index"], g["op"]) for g in changeset.guards] == [
        ("no_text", 1, "ADD"),
        ("no_text", 2, "UPDATE"),
    ]
    listed = await api.get("/v1/memories", params={"user_id": "dee"}, headers=tenant.admin)
    [tea] = listed.json()["items"]
    explained = await api.get(f"/v1/memories/{tea['id']}/explain", headers=tenant.admin)
    [added] = explained.json()["versions"]
    assert [g["guard"] for g in added["changeset"]["guards"]] == ["no_text", "no_text"]


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
    assert fake_llm.requests[0]["response_format"]["type"] == "json_schema"  # Memstore's own protocol
    # The model is Hy-Memory: its reasoning is turned off whatever protocol it is spoken to.
    assert fake_llm.requests[0]["chat_template_kwargs"] == {"reasoning_effort": "no_think"}
    changeset = await changeset_of(sessionmaker, tenant.tenant_id, second)
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
    assert "response_format" not in extract
    assert [m["role"] for m in extract["messages"]] == ["user"]  # MemOS's reader: one user message
    assert extract["max_tokens"] == 8000
    # the conversation as MemOS renders it; a message without a time takes the scene's first
    assert (
        "user: [2026-11-01T10:00:00+00:00]: I live in Lyon; Oslo on December 10!\n"
        "assistant: [2026-11-01T10:00:00+00:00]: Noted.\n" in extract["messages"][0]["content"]
    )
    assert "I live in Lyon" not in later["messages"][0]["content"]  # a MemOS add is a scene of its own

    changeset = await changeset_of(sessionmaker, tenant.tenant_id, first)
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
    changeset = await changeset_of(sessionmaker, tenant.tenant_id, second)
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
    assert (await changeset_of(sessionmaker, tenant.tenant_id, by_tenant)).writer == "simple"
    assert (await changeset_of(sessionmaker, tenant.tenant_id, by_chunk)).writer == "offline"
    assert len(fake_llm.requests) == 1


CUT_OFF = (
    '```json\n[{"op": "SUPERSEDE", "memory_ids": ["0"], "content": "The user lives in Seattle.", '
    '"owner": "user", "tags": ["home"]}, {"op": "ADD", "content": "The user has a dog named Rex.", '
    '"owner": "user", "tags": ["Rex"]}, {"op": "ADD", "content": "The user is a pil'
)


async def test_a_reconcile_answer_cut_off_is_asked_again_and_its_complete_ops_applied(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    """An answer cut off at its budget is asked again once with twice the budget; one that is cut off
    again keeps its complete ops (never a part of one), and the chunk is applied, not failed."""
    extracted = [
        {"content": "The user lives in Seattle.", "tags": ["home"], "owner": "user"},
        {"content": "The user has a dog named Rex.", "tags": ["Rex"], "owner": "user"},
        {"content": "The user is a pilot.", "tags": ["work"], "owner": "user"},
    ]
    complete = [
        {"op": "SUPERSEDE", "memory_ids": ["0"], "content": "The user lives in Seattle.", "owner": "user"},
        {"op": "ADD", "content": "The user has a dog named Rex.", "owner": "user", "tags": ["Rex"]},
        {"op": "ADD", "content": "The user is a pilot.", "owner": "user", "tags": ["work"]},
    ]
    answers = (("eve", Reply(content=CUT_OFF, finish_reason="length")), ("fay", Reply.json(complete)))
    for done, (user, resent) in enumerate(answers, start=1):
        fake_llm.enqueue(
            Reply.json(
                {"memory": [{"content": "The user lives in Lyon.", "tags": ["home"], "owner": "user"}]}
            ),
            Reply.json({"memory": extracted}),
            Reply(content=CUT_OFF, finish_reason="length"),
            resent,
        )
        await post(api, ingest_headers, user, "I live in Lyon.", 1, writer="hy")
        await post(api, ingest_headers, user, "Seattle now, with Rex; I fly planes.", 20, writer="hy")
        async with running_worker(llm_settings):
            assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2 * done) == {"applied": 2 * done}
        resend = fake_llm.requests[-1]
        assert resend["max_tokens"] == 2 * fake_llm.requests[-2]["max_tokens"] == 4000
    assert await memories(sessionmaker, tenant.tenant_id, "eve") == {
        "The user lives in Lyon.": "superseded",
        "The user lives in Seattle.": "active",
        "The user has a dog named Rex.": "active",
    }
    assert await memories(sessionmaker, tenant.tenant_id, "fay") == {
        "The user lives in Lyon.": "superseded",
        "The user lives in Seattle.": "active",
        "The user has a dog named Rex.": "active",
        "The user is a pilot.": "active",
    }
    async with sessionmaker() as session:
        changesets = dict(
            (
                await session.execute(
                    select(Chunk.user_id, Changeset)
                    .join(Changeset, Changeset.id == Chunk.changeset_id)
                    .where(Chunk.seq == 2)
                )
            ).all()
        )
    eve, fay = changesets["eve"], changesets["fay"]
    assert [s["step"] for s in json.loads(eve.raw_output or "[]")] == [
        "extract",
        "reconcile",
        "reconcile.resend",
    ]
    assert (eve.usage["resends"], eve.usage["salvaged"]) == (1, 1)
    assert (fay.usage["resends"], fay.usage["salvaged"]) == (1, 0)
    assert [op["op"] for op in eve.ops] == ["SUPERSEDE", "ADD"]
