"""A hand edit embeds its new text before it reads or locks anything: no transaction is open, and no
row locked, while the embedder answers."""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.memories import services
from app.embeddings.openai import OpenAIEmbedder
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.support.fake_llm import FakeLLM
from tests.support.history import held_by_others, memory, write


async def test_a_hand_edit_embeds_before_its_transaction(
    tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    async with FakeLLM() as embeddings:
        embedder = OpenAIEmbedder(embeddings.base_url, "m", 384)

        async def edit() -> None:
            async with sessionmaker() as session, session.begin():
                await services.edit_memory(
                    session,
                    tenant.tenant_id,
                    lyon.id,
                    content="The user lives in Paris.",
                    tags=None,
                    reason=None,
                    actor="key:test",
                    request_id=None,
                    embedder=embedder,
                )

        with embeddings.held_embeddings() as arrived:
            task = asyncio.create_task(edit())
            assert await asyncio.to_thread(arrived.wait, 10)
            held = await held_by_others(sessionmaker)
        await task
        await embedder.aclose()
    assert held == []
    assert (await memory(sessionmaker, "The user lives in Paris.")).version == 2
