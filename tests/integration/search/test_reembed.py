"""Changing embedder: searches with the new one are refused until `memstore reembed` has moved the
stored vectors; a re-embedding interrupted half-way resumes where it stopped; it calls the embedder with
no transaction open, and a memory edited meanwhile ends with the vector of its new text."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import EmbeddingConfig, Memory, MemoryVersion
from app.domain.history import services as history
from app.domain.search import services
from app.domain.search.reembed import ReembedError, reembed
from app.domain.search.services import Searcher, SearchQuery, record_embedder
from app.embeddings import HashingEmbedder
from app.embeddings.openai import OpenAIEmbedder
from app.lib.errors import EmbedderMismatch
from app.server.asgi import create_app
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.integration.search.test_search import add, change
from tests.support.history import held_by_others
from tests.support.semantic import semantic_embedder

HASHING = HashingEmbedder(384)
CONTENTS = [f"The user collects {kind} stamps." for kind in ("French", "Dutch", "Czech", "Greek", "Irish")]


def reversed_model(text: str) -> list[float]:
    """Another model: the same texts land elsewhere."""
    return HASHING.embed_one(" ".join(reversed(text.split())) + " v2")


async def config(sessionmaker: async_sessionmaker[AsyncSession]) -> EmbeddingConfig:
    async with sessionmaker() as session:
        row = await session.scalar(select(EmbeddingConfig))
    assert row is not None
    return row


async def test_reembed_is_required_resumable_and_complete(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    from tests.support.fake_llm import FakeLLM

    await add(sessionmaker, tenant.tenant_id, "u", CONTENTS)
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)

    with FakeLLM().in_thread() as server:
        server.embed_text = reversed_model
        new_settings = settings.model_copy(
            update={"embedder": "openai", "embedder_base_url": server.base_url}
        )
        body = {"user_id": "u", "query": "stamps"}
        async with AsyncTestClient(app=create_app(new_settings, configure_logs=False)) as client:
            response = await client.post("/v1/memories/search", json=body, headers=tenant.admin)
            assert response.status_code == 409
            assert response.json()["error"]["code"] == "embedder_mismatch"

        embedder = OpenAIEmbedder(server.base_url, "all-MiniLM-L6-v2", 384)
        seen: list[tuple[int, int]] = []
        partial = await reembed(
            sessionmaker, embedder, batch_size=2, max_batches=1, progress=lambda d, t: seen.append((d, t))
        )
        assert (partial.finished, partial.done, partial.total) == (False, 2, 5)
        state = await config(sessionmaker)
        assert (state.name, state.target_name) == (HASHING.name, embedder.name)
        assert state.cursor is not None

        done = await reembed(sessionmaker, embedder, batch_size=2, progress=lambda d, t: seen.append((d, t)))
        assert (done.finished, done.resumed_from, done.done, done.previous) == (True, 2, 5, HASHING.name)
        assert seen == [(0, 5), (2, 5), (2, 5), (4, 5), (5, 5)]
        state = await config(sessionmaker)
        assert (state.name, state.target_name, state.cursor) == (embedder.name, None, None)

        async with sessionmaker() as session:
            memories = (await session.scalars(select(Memory))).all()
        for memory in memories:
            assert memory.embedding is not None
            want = reversed_model(memory.content)
            assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(memory.embedding, want, strict=True))

        async with AsyncTestClient(app=create_app(new_settings, configure_logs=False)) as client:
            response = await client.post("/v1/memories/search", json=body, headers=tenant.admin)
            assert response.status_code == 200
            assert len(response.json()["results"]) == 5

        again = await reembed(sessionmaker, embedder)
        assert again.finished
        assert again.resumed_from == again.total  # nothing left to do


def assert_embedded_by(memory: Memory, model: Callable[[str], list[float]], content: str) -> None:
    assert memory.content == content
    assert memory.embedding is not None
    want = model(content)
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(memory.embedding, want, strict=True))


async def memories(sessionmaker: async_sessionmaker[AsyncSession]) -> dict[uuid.UUID, Memory]:
    async with sessionmaker() as session:
        return {m.id: m for m in (await session.scalars(select(Memory))).all()}


async def test_reembed_waits_for_the_embedder_with_no_transaction_open(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    from tests.support.fake_llm import FakeLLM

    await add(sessionmaker, tenant.tenant_id, "u", CONTENTS)
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
    async with FakeLLM() as server:
        server.embed_text = reversed_model
        embedder = OpenAIEmbedder(server.base_url, "all-MiniLM-L6-v2", 384)
        with server.held_embeddings() as arrived:
            running = asyncio.create_task(reembed(sessionmaker, embedder, batch_size=2))
            assert await asyncio.to_thread(arrived.wait, 30)
            assert await held_by_others(sessionmaker) == []
        assert (await running).finished
        await embedder.aclose()
    for memory in (await memories(sessionmaker)).values():
        assert_embedded_by(memory, reversed_model, memory.content)


async def test_a_memory_edited_while_its_batch_is_embedded_gets_its_new_texts_vector(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    from tests.support.fake_llm import FakeLLM

    ids = await add(sessionmaker, tenant.tenant_id, "u", CONTENTS)
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
    edited = "The user collects Maltese stamps."
    async with FakeLLM() as server:
        server.embed_text = reversed_model
        embedder = OpenAIEmbedder(server.base_url, "all-MiniLM-L6-v2", 384)
        with server.held_embeddings() as arrived:
            running = asyncio.create_task(reembed(sessionmaker, embedder))
            assert await asyncio.to_thread(arrived.wait, 30)
            # Edited (by a process with the new model, as the CLI asks) after the batch was read.
            await change(sessionmaker, tenant.tenant_id, ids[0], Op(OpKind.UPDATE, edited, (0,)))
        done = await running
        await embedder.aclose()
    assert (done.finished, done.done) == (True, len(CONTENTS))
    stored = await memories(sessionmaker)
    assert_embedded_by(stored[ids[0]], reversed_model, edited)
    for memory_id, content in zip(ids[1:], CONTENTS[1:], strict=True):
        assert_embedded_by(stored[memory_id], reversed_model, content)


async def test_reembed_refuses_another_dimension(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await add(sessionmaker, tenant.tenant_id, "u", CONTENTS[:1])
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
    with pytest.raises(ReembedError, match="768-dimensional"):
        await reembed(sessionmaker, HashingEmbedder(768))
    assert (await config(sessionmaker)).name == HASHING.name


async def test_the_command_moves_a_hashing_bank_to_the_default_embedder(
    database_url: str,
    owner_database_url: str,
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
) -> None:
    """A bank written with `hashing` is switched to the default semantic embedder by `memstore reembed`
    (no MEMSTORE_EMBEDDER set); afterwards a query that shares no word with the memory finds it."""
    contents = ["The user is vegetarian.", "The user lives in Seattle.", "The user mainly uses Python."]
    await add(sessionmaker, tenant.tenant_id, "u", contents)
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env |= {
        "MEMSTORE_DATABASE_URL": database_url,
        "MEMSTORE_ADMIN_DATABASE_URL": owner_database_url,
        "MEMSTORE_LOG_FORMAT": "console",
    }
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app", "reembed", "--batch-size", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "3 memories embedded by onnx:all-MiniLM-L6-v2-int8:384 (was hashing-v2-384)" in result.stdout

    searcher = Searcher(settings, semantic_embedder())
    async with sessionmaker() as session:
        hits = await searcher.search(
            session,
            tenant.tenant_id,
            SearchQuery("which programming language does the user use", "u", top_k=3, mode="vector"),
        )
    assert hits[0].content == "The user mainly uses Python."


async def test_a_running_process_notices_a_reembed_to_another_model(
    sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that checked its embedder once does not keep trusting it after the stored vectors
    have moved to another model."""
    searcher = Searcher(settings, HASHING)
    async with sessionmaker() as session, session.begin():
        await searcher.check_embedder(session)
        await session.execute(
            EmbeddingConfig.__table__.update().values(name="another-model", target_name=None)  # type: ignore[attr-defined]
        )
    monkeypatch.setattr(services, "_EMBEDDER_CHECK_TTL_S", 0.0)
    async with sessionmaker() as session:
        with pytest.raises(EmbedderMismatch):
            await searcher.check_embedder(session)


async def test_an_undo_after_a_reembed_keeps_the_bank_on_the_new_model(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """Rolled back after `memstore reembed`: a text that comes back is embedded by the new model (its
    stored vector is the old model's), and a memory whose text stays keeps its re-embedded vector."""
    from tests.support.fake_llm import FakeLLM

    french, dutch = "The user collects French stamps.", "The user collects Dutch stamps."
    first, other = await add(sessionmaker, tenant.tenant_id, "u", [french, dutch])
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
    await change(
        sessionmaker, tenant.tenant_id, first, Op(OpKind.UPDATE, "The user collects Greek stamps.", (0,))
    )
    await change(sessionmaker, tenant.tenant_id, other, Op(OpKind.DELETE, targets=(0,)))

    with FakeLLM().in_thread() as server:
        server.embed_text = reversed_model
        embedder = OpenAIEmbedder(server.base_url, "all-MiniLM-L6-v2", 384)
        assert (await reembed(sessionmaker, embedder)).finished
        async with sessionmaker() as session, session.begin():
            for memory_id in (first, other):
                await history.rollback_memory(
                    session,
                    tenant.tenant_id,
                    memory_id,
                    to_version=1,
                    who=history.Actor("test"),
                    embedder=embedder,
                )
        await embedder.aclose()

    async with sessionmaker() as session:
        memories = {m.id: m for m in (await session.scalars(select(Memory))).all()}
        restored = {
            v.memory_id: v
            for v in (await session.scalars(select(MemoryVersion).where(MemoryVersion.version == 3))).all()
        }
    for memory_id, content in ((first, french), (other, dutch)):
        memory = memories[memory_id]
        assert (memory.content, memory.status, memory.version) == (content, "active", 3)
        assert memory.embedding is not None
        want = reversed_model(content)
        assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(memory.embedding, want, strict=True))
        assert restored[memory_id].embedding is not None
        assert list(restored[memory_id].embedding) == list(memory.embedding)


class CountingEmbedder(HashingEmbedder):
    """The hashing embedder, counting the texts it is asked to embed."""

    texts = 0

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.texts += len(texts)
        return await super().embed(texts)


async def test_without_a_reembed_an_undo_embeds_nothing(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """The stored vectors are the recorded embedder's (recorded after they were written, even): an undo
    copies them inside Postgres and asks the embedder for nothing."""
    french = "The user collects French stamps."
    [memory_id] = await add(sessionmaker, tenant.tenant_id, "u", [french])
    await change(
        sessionmaker, tenant.tenant_id, memory_id, Op(OpKind.UPDATE, "The user collects Irish stamps.", (0,))
    )
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
    counting = CountingEmbedder(384)
    async with sessionmaker() as session, session.begin():
        await history.rollback_memory(
            session, tenant.tenant_id, memory_id, to_version=1, who=history.Actor("test"), embedder=counting
        )
    assert counting.texts == 0
    async with sessionmaker() as session:
        memory = await session.get(Memory, (tenant.tenant_id, memory_id))
    assert memory is not None
    assert (memory.content, memory.version) == (french, 3)
    assert memory.embedding is not None
    want = HASHING.embed_one(french)
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(memory.embedding, want, strict=True))
