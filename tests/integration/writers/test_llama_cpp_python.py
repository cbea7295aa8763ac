"""Writers against a server that answers as llama-cpp-python's does, with a small model behind it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Changeset, Chunk, Memory
from app.writers.profiles.simple import MEMORIES_SCHEMA
from tests.conftest import TenantKeys
from tests.integration.writers.conftest import PROFILES
from tests.support.fake_llm import FakeLLM, LlamaCppPython
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]
# Writers of the simple profile with a fixed response_format, besides one writer per profile with the
# default (`auto`), and one per profile held to its schema as llama.cpp takes one (a small model).
FIXED = {"plain": "json_object", "grammar": "json_object_schema"}
HELD = {f"{name}-held": profile for name, profile in PROFILES.items()}


@pytest.fixture
def writers_file(tmp_path: Path, fake_llm: FakeLLM) -> Path:
    path = tmp_path / "writers.toml"
    common = f'base_url = "{fake_llm.base_url}"\nmodel = "smollm2"\ntimeout_s = 1.0\nmax_retries = 1\n'
    tables = [f'[writers.{name}]\nprofile = "{profile}"\n{common}' for name, profile in PROFILES.items()]
    tables += [
        f'[writers.{name}]\nprofile = "simple"\nresponse_format = "{form}"\n{common}'
        for name, form in FIXED.items()
    ]
    tables += [
        f'[writers.{name}]\nprofile = "{profile}"\nresponse_format = "json_object_schema"\n{common}'
        for name, profile in HELD.items()
    ]
    path.write_text("\n".join(tables))
    return path


async def post(api: Client, headers: dict[str, str], user: str, writer: str, text: str, day: int) -> str:
    chunk = {
        "user_id": user,
        "writer": writer,
        "messages": [{"role": "user", "content": text, "created_at": f"2026-11-{day:02d}T10:00:00Z"}],
    }
    response = await api.post("/v1/chunks", json=chunk, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["chunk_id"])


async def test_each_profile_asks_as_its_reference_and_a_small_model_needs_its_schema(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    server = LlamaCppPython()
    fake_llm.responder = server
    second: dict[str, str] = {}
    for writer in [*PROFILES, *HELD]:
        await post(api, ingest_headers, f"u-{writer}", writer, "I live in Lyon.", 1)
        second[writer] = await post(api, ingest_headers, f"u-{writer}", writer, "I also live in Lyon now.", 2)
    async with running_worker(llm_settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 2 * (len(PROFILES) + len(HELD)))

    async with sessionmaker() as session:
        statuses = dict(
            (await session.execute(select(Chunk.user_id, Chunk.status).where(Chunk.seq == 2))).all()
        )
        steps: dict[str, list[Any]] = {}
        for writer, chunk_id in second.items():
            chunk = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(chunk_id)))
            assert chunk is not None
            changeset = (
                await session.get(Changeset, (chunk.tenant_id, chunk.changeset_id))
                if chunk.changeset_id
                else None
            )
            steps[writer] = [s["step"] for s in json.loads(changeset.raw_output or "[]")] if changeset else []
    # Held to its schema (the schema inside json_object, enforced by the server's grammar), every
    # profile gets every chunk applied, and every answer conformed to the schema of its call.
    assert {statuses[f"u-{w}"] for w in HELD} == {"applied"}
    assert server.violations == []
    assert steps["hy-held"] == ["extract", "reconcile"]
    assert steps["mem0-held"] == ["extract", "update"]
    # By default each profile asks in its reference's form: Memstore's own `simple` its schema (refused
    # once as json_schema by this server, then sent inside json_object), Mem0 any JSON, Hy-Memory and
    # MemOS nothing; a small model left to itself answers in its own shape, which no repair fixes.
    assert statuses["u-simple"] == "applied"
    assert server.refused == 1
    assert {statuses[f"u-{w}"] for w in ("hy", "mem0", "mem0v3")} == {"failed"}
    assert statuses["u-memos"] == "applied"  # an answer without "memory list" is no memory to MemOS
    assert steps["memos"] == ["extract"]
    async with sessionmaker() as session:
        attempts = dict((await session.execute(select(Chunk.user_id, Chunk.attempts))).all())
    assert attempts["u-simple"] == 1  # the refusal cost no attempt


async def test_json_object_schema_sends_the_schema_inside_json_object_and_json_object_sends_none(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    server = LlamaCppPython()
    fake_llm.responder = server
    plain = await post(api, ingest_headers, "u-plain", "plain", "I live in Lyon.", 1)
    grammar = await post(api, ingest_headers, "u-grammar", "grammar", "I live in Oslo.", 1)
    async with running_worker(llm_settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 2)

    def sent(city: str) -> list[dict[str, Any]]:
        return [b["response_format"] for b in fake_llm.requests if city in b["messages"][1]["content"]]

    assert server.refused == 0  # neither writer tries json_schema first
    assert set(map(json.dumps, sent("Lyon"))) == {json.dumps({"type": "json_object"})}
    assert sent("Oslo") == [{"type": "json_object", "schema": MEMORIES_SCHEMA}]
    async with sessionmaker() as session:
        chunk = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(plain)))
        assert chunk is not None
        # Without the schema the small model answers in its own shape, which no repair fixes.
        assert chunk.status == "failed"
        assert "unparseable extract output" in (chunk.last_error or "")
        chunk = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(grammar)))
        assert chunk is not None
        assert chunk.status == "applied"
        contents = (
            await session.execute(select(Memory.content).where(Memory.user_id == "u-grammar"))
        ).scalars()
        assert list(contents) == ["The user said: I live in Oslo."]
