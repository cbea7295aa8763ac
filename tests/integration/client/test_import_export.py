"""`memstore import` and `memstore export`, run as a user runs them, against the real service and a
real worker: LoCoMo conversation 1 (when the data is beside the repository) is imported with every chunk
applied and a second import creates nothing; a user's export — of a conversation of its own, imported as
JSON Lines — loaded into a fresh instance reproduces the bank, its versions and its past, hand edits
and rollbacks included, and a second load writes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from memstore_client import Client
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.db.models import Changeset, Chunk, MemoryVersion
from tests.conftest import Servers, TenantKeys, fresh_database, make_tenant
from tests.support.history import db_now
from tests.support.live import live_api
from tests.support.workers import running_worker

LOCOMO = Path(__file__).resolve().parents[4] / "shared" / "data" / "locomo10.json"
ROOT = Path(__file__).resolve().parents[3]


async def memstore(*args: str, key: str) -> tuple[int, str]:
    """`memstore ARGS` in a process of its own; its exit code and what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env |= {"MEMSTORE_API_KEY": key, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    return int(process.returncode or 0), output.decode()


async def counts(sessionmaker: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    async with sessionmaker() as session:
        found = {}
        for name, model in (("chunks", Chunk), ("versions", MemoryVersion), ("changesets", Changeset)):
            found[name] = int(await session.scalar(select(func.count()).select_from(model)) or 0)
        applied = select(func.count()).select_from(Chunk).where(Chunk.status == "applied")
        found["applied"] = int(await session.scalar(applied) or 0)
        return found


# A conversation of the user's own, one chunk per line (`memstore import jsonl`), saying what the
# offline writer remembers.
OWN_CONVERSATION = [
    ["I live in Lyon.", "I mainly use Python."],
    ["I'm vegetarian.", "My daughter's name is Mia."],
    ["I moved to Seattle last month."],
]
OWN_SESSIONS = len(OWN_CONVERSATION)


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"no LoCoMo file at {LOCOMO}")
async def test_locomo_conversation_1_is_applied_whole_and_a_second_import_creates_nothing(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    async with live_api(settings) as url, running_worker(settings):
        code, output = await memstore(
            "import", "locomo", str(LOCOMO), "--conversations", "1", "--url", url, key=tenant.admin_key
        )
        assert code == 0, output
        assert "19 chunks posted: 19 new, 0 already there" in output
        assert "chunks 19 applied" in output
        first = await counts(sessionmaker)
        assert first["chunks"] == first["applied"] == 19
        assert first["versions"] > 0  # the offline writer found something to remember

        code, output = await memstore(
            "import", "locomo", str(LOCOMO), "--conversations", "1", "--url", url, key=tenant.admin_key
        )
        assert code == 0, output
        assert "19 chunks posted: 0 new, 19 already there" in output
        assert await counts(sessionmaker) == first


@pytest.fixture
async def fresh_instance(
    servers: Servers, template_database: str, settings: Settings
) -> AsyncIterator[Settings]:
    """Another instance: a database of its own (migrated, empty) and a Redis database of its own."""
    redis_url = f"{settings.redis_url}{'&' if '?' in settings.redis_url else '?'}db=1"
    redis = aioredis.from_url(redis_url)
    await redis.flushdb()
    await redis.aclose()
    async with fresh_database(servers, template_database) as owner_url:
        service_url = servers.service_url_for(make_url(owner_url).database or "")
        yield settings.model_copy(
            update={"database_url": service_url, "admin_database_url": owner_url, "redis_url": redis_url}
        )


def _bank_as_of(client: Client, user: str, when: datetime) -> list[tuple[str, str, int]]:
    return sorted(
        (m.content, m.status, m.version) for m in client.iter_memories(user, status="all", as_of=when)
    )


async def test_an_export_loaded_into_a_fresh_instance_reproduces_the_bank_and_its_history(
    settings: Settings,
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
    fresh_instance: Settings,
    tmp_path: Path,
) -> None:
    export = tmp_path / "conv-own.jsonl"
    conversation = tmp_path / "conversation.jsonl"
    lines = [
        {"user_id": "conv-own", "messages": [{"role": "user", "content": t, "name": "Ana"} for t in said]}
        for said in OWN_CONVERSATION
    ]
    conversation.write_text("".join(json.dumps(line) + "\n" for line in lines))
    async with live_api(settings) as url, running_worker(settings):
        code, output = await memstore(
            "import", "jsonl", str(conversation), "--url", url, key=tenant.admin_key
        )
        assert code == 0, output
        written_by_model = await db_now(sessionmaker)

        def edit_then_roll_back() -> tuple[list[tuple[str, str, int]], str]:
            """A hand edit and an admin rollback on top of what the writer wrote: history no writer makes."""
            with Client(url, tenant.admin_key) as source:
                memory = next(source.iter_memories("conv-own"))
                source.edit_memory(memory.id, content="An admin's correction.", reason="typo")
                source.rollback(memory.id, 1, reason="the writer was right")
                return _bank_as_of(source, "conv-own", written_by_model), memory.content

        bank_then, rolled_back = await asyncio.to_thread(edit_then_roll_back)
        code, output = await memstore(
            "export", "--user", "conv-own", "--out", str(export), "--url", url, key=tenant.admin_key
        )
        assert code == 0, output
    source = await counts(sessionmaker)
    records = [json.loads(line) for line in export.read_text().splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds[0] == "export"
    assert kinds.count("chunk") == OWN_SESSIONS
    assert sum(len(r["versions"]) for r in records if r["type"] == "memory") == source["versions"]
    assert kinds.count("changeset") == source["changesets"]
    # Each text's language goes with it: the memory's and every version's.
    exported_memories = [r for r in records if r["type"] == "memory"]
    assert {r["language"] for r in exported_memories} == {"en"}
    assert {v.get("language") for r in exported_memories for v in r["versions"]} == {"en"}
    first_chunk = next(r for r in records if r["type"] == "chunk")
    assert first_chunk["seq"] == 1
    assert first_chunk["messages"][0]["name"] == "Ana"

    engine = create_engine(fresh_instance.as_owner(), application_name="memstore-tests-fresh")
    fresh_sessions = create_sessionmaker(engine)
    try:
        fresh_tenant = await make_tenant(fresh_sessions, "acme")
        async with live_api(fresh_instance) as url, running_worker(fresh_instance):
            code, output = await memstore(
                "import", "jsonl", str(export), "--url", url, key=fresh_tenant.admin_key
            )
            assert code == 0, output
            memories = kinds.count("memory")
            assert (
                f"bank of conv-own reproduced: {memories} memories, {source['versions']} versions" in output
            )
            copied = await counts(fresh_sessions)

            def the_copy() -> tuple[list[tuple[str, str, int]], list[str], list[str]]:
                with Client(url, fresh_tenant.admin_key) as copy:
                    memory = next(m for m in copy.iter_memories("conv-own") if m.content == rolled_back)
                    explained = copy.explain(memory.id)
                    assert memory.language == "en"
                    assert {v.version.language for v in explained.versions} == {"en"}
                    ops = [v.version.op for v in explained.versions]
                    source_chunk = explained.versions[0].source
                    assert source_chunk is not None
                    said = [str(m["content"]) for m in source_chunk.messages]
                    return _bank_as_of(copy, "conv-own", written_by_model), ops, said

            copy_then, ops, said = await asyncio.to_thread(the_copy)
            assert copy_then == bank_then  # the time control sees the same past
            assert ops == ["ADD", "UPDATE", "ROLLBACK"]
            assert said  # its version 1 still shows the messages it came from

            # Loading it again writes nothing.
            code, output = await memstore(
                "import", "jsonl", str(export), "--url", url, key=fresh_tenant.admin_key
            )
            assert code == 0, output
            assert "written: 0 changesets, 0 chunks, 0 memories, 0 versions" in output
            assert await counts(fresh_sessions) == copied

            # Replayed through this instance's writer instead, the admin's edits are not made again:
            # the import says how the bank differs, and fails.
            code, output = await memstore(
                "import",
                "jsonl",
                str(export),
                "--replay",
                "--user",
                "conv-own-replayed",
                "--url",
                url,
                key=fresh_tenant.admin_key,
            )
            assert code == 1, output
            assert "bank of conv-own-replayed differs from the export" in output
    finally:
        await engine.dispose()
    assert copied["versions"] == source["versions"]
    assert copied["changesets"] == source["changesets"]
    assert copied["chunks"] == copied["applied"] == OWN_SESSIONS
