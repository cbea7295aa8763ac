"""Writers against a server that answers as llama-cpp-python's does, with a small model behind it."""

from __future__ import annotations

import json
import uuid
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Changeset, Chunk
from tests.conftest import TenantKeys
from tests.integration.writers.conftest import PROFILES
from tests.support.fake_llm import FakeLLM, LlamaCppPython
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]


async def post(api: Client, headers: dict[str, str], user: str, writer: str, text: str, day: int) -> str:
    chunk = {
        "user_id": user,
        "writer": writer,
        "messages": [{"role": "user", "content": text, "created_at": f"2026-11-{day:02d}T10:00:00Z"}],
    }
    response = await api.post("/v1/chunks", json=chunk, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["chunk_id"])


async def test_with_the_default_response_format_every_profile_gets_every_chunk_applied(
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
    for writer in PROFILES:
        await post(api, ingest_headers, f"u-{writer}", writer, "I live in Lyon.", 1)
        second[writer] = await post(api, ingest_headers, f"u-{writer}", writer, "I also live in Lyon now.", 2)
    async with running_worker(llm_settings):
        counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, 2 * len(PROFILES))
    assert counts == {"applied": 2 * len(PROFILES)}

    # Each writer (its own endpoint) is refused once, then sends the schema inside json_object, which
    # the server enforces; every answer conformed to the schema of its call.
    assert server.refused == len(PROFILES)
    assert server.violations == []
    assert server.enforced == len(fake_llm.requests) - len(PROFILES)
    sent = [body["response_format"] for body in fake_llm.requests]
    assert sum(form["type"] == "json_schema" for form in sent) == len(PROFILES)
    assert all(set(form) == {"type", "schema"} for form in sent if form["type"] == "json_object")
    async with sessionmaker() as session:
        attempts = (await session.execute(select(Chunk.attempts))).scalars().all()
        assert set(attempts) == {1}  # the refusal cost no attempt
        steps: dict[str, list[Any]] = {}
        for writer, chunk_id in second.items():
            chunk = await session.get(Chunk, uuid.UUID(chunk_id))
            assert chunk is not None
            changeset = await session.get(Changeset, chunk.changeset_id)
            assert changeset is not None
            steps[writer] = [step["step"] for step in json.loads(changeset.raw_output or "[]")]
    # The two-step profiles made their second call, under its own schema, too.
    assert steps["hy"] == ["extract", "reconcile"]
    assert steps["mem0"] == ["extract", "update"]
