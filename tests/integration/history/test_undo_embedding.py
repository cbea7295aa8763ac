"""An undo that must embed a restored text again (a `memstore reembed` since) calls the embedder with no
transaction or lock held, and a memory changed meanwhile is undone from the head it then has."""

from __future__ import annotations

import asyncio

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import MemoryVersion
from app.domain.history import services as history
from app.domain.search.reembed import reembed
from app.domain.search.services import record_embedder
from app.embeddings.openai import OpenAIEmbedder
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.integration.search.test_reembed import (
    HASHING,
    assert_embedded_by,
    memories,
    reversed_model,
)
from tests.integration.search.test_search import add, change
from tests.support.fake_llm import FakeLLM
from tests.support.history import held_by_others

FRENCH, GREEK, IRISH = (f"The user collects {kind} stamps." for kind in ("French", "Greek", "Irish"))


async def test_a_rollback_embeds_outside_any_transaction_and_undoes_from_the_head_it_finds(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    [memory_id] = await add(sessionmaker, tenant.tenant_id, "u", [FRENCH])
    async with sessionmaker() as session, session.begin():
        await record_embedder(session, HASHING)
    await change(sessionmaker, tenant.tenant_id, memory_id, Op(OpKind.UPDATE, GREEK, (0,)))

    async with FakeLLM() as server:
        server.embed_text = reversed_model
        embedder = OpenAIEmbedder(server.base_url, "all-MiniLM-L6-v2", 384)
        assert (await reembed(sessionmaker, embedder)).finished
        calls = len(server.embedding_requests)

        async def rollback() -> history.UndoResult:
            # As a request's session comes to its handler: no transaction open yet.
            async with sessionmaker() as session:
                result = await history.rollback_memory(
                    session,
                    tenant.tenant_id,
                    memory_id,
                    to_version=1,
                    who=history.Actor("test"),
                    embedder=embedder,
                )
                await session.commit()
            return result

        with server.held_embeddings() as arrived:
            undoing = asyncio.create_task(rollback())
            assert await asyncio.to_thread(arrived.wait, 30)
            assert await held_by_others(sessionmaker) == []
            # Nothing is locked, so an edit goes through while the undo waits for the embedder.
            await change(sessionmaker, tenant.tenant_id, memory_id, Op(OpKind.UPDATE, IRISH, (0,)))
        result = await undoing
        await embedder.aclose()

    assert len(server.embedding_requests) == calls + 1  # the French text, once
    [entry] = result.diff
    assert (entry["before"]["content"], entry["before"]["version"]) == (IRISH, 3)
    assert (entry["after"]["content"], entry["after"]["version"]) == (FRENCH, 4)
    memory = (await memories(sessionmaker))[memory_id]
    assert memory.version == 4
    assert_embedded_by(memory, reversed_model, FRENCH)
    async with sessionmaker() as session:
        ops = (
            await session.scalars(
                select(MemoryVersion.op)
                .where(MemoryVersion.memory_id == memory_id)
                .order_by(MemoryVersion.version)
            )
        ).all()
    assert ops == ["ADD", "UPDATE", "UPDATE", "ROLLBACK"]
