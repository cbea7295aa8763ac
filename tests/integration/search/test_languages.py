"""The lexical half of search in each memory's language: a mixed bank where each memory is read in its
own language (stemmed by its Snowball configuration, or segmented for Chinese and Japanese), found by a
question in the same language sharing a word form with it; the language and lexemes kept on every
version, so search as of a time and undo read them as they were."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.search.reembed import reembed
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.integration.search.test_search import EMBEDDER, change, search
from tests.integration.search.test_search import add as add_memories

# Each memory, its language, and a question that shares only a word form with it (not the form itself:
# the stemmer, or the segmenter, must bring them together), in the same language.
BANK = [
    ("The user adopted two kittens in March.", "en", "Has the user adopted a kitten?"),
    ("Der Nutzer fährt jeden Morgen mit dem Fahrrad zur Arbeit.", "de", "Welche Fahrräder hat er?"),
    ("El usuario trabaja como enfermero en un hospital de Valencia.", "es", "¿Dónde trabajaba?"),
    ("Lundi, l'utilisateur commence des cours de poterie.", "fr", "Aime-t-il la poterie ?"),
    ("我对花生过敏，吃一点就起疹子。", "zh", "花生能吃吗？"),
    ("東京の世田谷区に住んでいます。", "ja", "世田谷区はどんな所？"),
    ("Ele toca violão numa banda de samba.", "pt", "Que bandas ele conhece?"),
]


async def add(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, contents: list[str]
) -> list[uuid.UUID]:
    """Memories of user `u`, through the near-duplicate check: the hashing embedder these tests use
    reads Chinese and Japanese by their characters, so unrelated texts in them are not repeats."""
    return await add_memories(sessionmaker, tenant_id, "u", contents)


async def languages(
    sessionmaker: async_sessionmaker[AsyncSession], user_id: str
) -> dict[str, tuple[str, str]]:
    """Each memory's (language, lexemes) as stored on its head."""
    async with sessionmaker() as session:
        rows = await session.execute(
            text("SELECT content, language, lexemes::text FROM memories WHERE user_id = :u"), {"u": user_id}
        )
        return {r.content: (r.language, r.lexemes) for r in rows}


async def test_each_memory_is_read_in_its_language_and_found_by_a_question_in_it(
    client: AsyncTestClient[Litestar], sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await add(sessionmaker, tenant.tenant_id, [content for content, _, _ in BANK])
    stored = await languages(sessionmaker, "u")
    assert {content: stored[content][0] for content, _, _ in BANK} == {c: lang for c, lang, _ in BANK}
    # Segmented: the Chinese memory's lexemes are words, not the whole clause.
    assert "'花生'" in stored[BANK[4][0]][1]
    assert "'世田谷区'" in stored[BANK[5][0]][1] or "'世田'" in stored[BANK[5][0]][1]
    for content, language, question in BANK:
        found = await search(client, tenant, user_id="u", query=question, mode="lexical", top_k=3)
        assert found, (language, question)
        assert found[0]["memory"]["content"] == content, (language, question, found)


async def test_versions_keep_their_lexemes_for_as_of_and_undo(
    client: AsyncTestClient[Litestar], sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    [memory_id] = await add(sessionmaker, tenant.tenant_id, ["我对花生过敏，吃一点就起疹子。"])
    before = datetime.now(UTC)
    await change(
        sessionmaker, tenant.tenant_id, memory_id, Op(OpKind.UPDATE, "Der Nutzer spielt Geige.", targets=(0,))
    )
    assert (await languages(sessionmaker, "u"))["Der Nutzer spielt Geige."][0] == "de"
    # Now: the German text; as of before the update: the Chinese one, found by its words.
    now = await search(client, tenant, user_id="u", query="花生能吃吗？", mode="lexical", top_k=3)
    assert now == []
    then = await search(
        client, tenant, user_id="u", query="花生能吃吗？", mode="lexical", top_k=3, as_of=before.isoformat()
    )
    assert [r["memory"]["content"] for r in then] == ["我对花生过敏，吃一点就起疹子。"]
    # Rolled back: the head's language and lexemes are the first version's again, copied with its text.
    response = await client.post(
        f"/v1/admin/memories/{memory_id}/rollback", json={"to_version": 1}, headers=tenant.admin
    )
    assert response.status_code == 200, response.text
    assert (await languages(sessionmaker, "u"))["我对花生过敏，吃一点就起疹子。"][0] == "zh"
    found = await search(client, tenant, user_id="u", query="花生能吃吗？", mode="lexical", top_k=3)
    assert [r["memory"]["content"] for r in found] == ["我对花生过敏，吃一点就起疹子。"]


async def test_reembed_reads_a_bank_written_before_languages_in_each_memorys_language(
    client: AsyncTestClient[Litestar], sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """A head written before memories had a language holds English lexemes (a Chinese clause is one
    lexeme): `memstore reembed` analyses each head again as it writes its vector."""
    await add(
        sessionmaker, tenant.tenant_id, ["我对花生过敏，吃一点就起疹子。", "The user adopted two kittens."]
    )
    async with sessionmaker() as session, session.begin():
        await session.execute(
            text("UPDATE memories SET language = 'en', lexemes = to_tsvector('english'::regconfig, content)")
        )
    question = "花生能吃吗？"
    assert await search(client, tenant, user_id="u", query=question, mode="lexical", top_k=3) == []
    outcome = await reembed(sessionmaker, EMBEDDER, force=True)
    assert outcome.finished
    assert outcome.done == 2
    found = await search(client, tenant, user_id="u", query=question, mode="lexical", top_k=3)
    assert [r["memory"]["content"] for r in found] == ["我对花生过敏，吃一点就起疹子。"]
    assert found[0]["memory"]["language"] == "zh"
