"""POST /v1/memories/search: exact per scope, current memories only, as of a time, tenant-isolated,
lexical matches fused with vector ones."""

from __future__ import annotations

import math
import random
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Memory
from app.domain.memories.services import ApplyLimits, Provenance, Shown, apply_ops
from app.domain.search.graph import index_graph
from app.domain.search.repositories import SearchRepository
from app.domain.search.services import ITERATIVE_SCAN_VERSION, Searcher
from app.embeddings import HashingEmbedder
from app.server.asgi import create_app
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys

EMBEDDER = HashingEmbedder(384)
_WORD_LIST = (
    "coffee tea jazz piano hiking lyon seattle python rust garden cat dog sister brother marathon chess "
    "sushi pasta vegan cycling sailing paris berlin tokyo violin novel poetry yoga climbing skiing "
    "football tennis painting photography baking camping running swimming guitar drums opera movies"
)
WORDS = _WORD_LIST.split()


async def add(
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant_id: uuid.UUID,
    user_id: str,
    contents: list[str],
    *,
    agent_id: str | None = None,
    tags: tuple[str, ...] = (),
    duplicate_threshold: float = 1.0,
) -> list[uuid.UUID]:
    """Store memories through apply_ops (the one write path); their ids in order. A
    `duplicate_threshold` above 1 turns the near-duplicate check off."""
    async with sessionmaker() as session, session.begin():
        await apply_ops(
            session,
            tenant_id=tenant_id,
            user_id=user_id,
            ops=[Op(OpKind.ADD, c, tags=tags) for c in contents],
            shown={},
            provenance=Provenance(actor="test", writer="test"),
            embedder=EMBEDDER,
            agent_id=agent_id,
            limits=ApplyLimits(max_ops=10_000, duplicate_threshold=duplicate_threshold),
        )
        rows = await session.execute(
            select(Memory.content, Memory.id).where(Memory.tenant_id == tenant_id, Memory.user_id == user_id)
        )
        by_content = {row.content: row.id for row in rows}
    return [by_content[c] for c in contents]


async def change(
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant_id: uuid.UUID,
    memory_id: uuid.UUID,
    op: Op,
) -> None:
    async with sessionmaker() as session, session.begin():
        memory = await session.get(Memory, (tenant_id, memory_id))
        assert memory is not None
        await apply_ops(
            session,
            tenant_id=tenant_id,
            user_id=memory.user_id,
            ops=[op],
            shown={0: Shown(memory.id, memory.version)},
            provenance=Provenance(actor="test", writer="test"),
            embedder=EMBEDDER,
        )


async def search(client: AsyncTestClient[Litestar], tenant: TenantKeys, **body: Any) -> list[dict[str, Any]]:
    response = await client.post("/v1/memories/search", json=body, headers=tenant.admin)
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def brute_force(contents: dict[uuid.UUID, str], query: str, top_k: int) -> list[tuple[uuid.UUID, float]]:
    q = EMBEDDER.embed_one(query)
    scored = [
        (memory_id, sum(a * b for a, b in zip(q, EMBEDDER.embed_one(c), strict=True)))
        for memory_id, c in contents.items()
    ]
    scored.sort(key=lambda s: -s[1])
    return scored[:top_k]


def assert_brute_force_top_10(
    results: list[dict[str, Any]], contents: dict[uuid.UUID, str], query: str
) -> None:
    """`results` (a search's) are the 10 nearest of `contents` to `query` by brute force: the same
    scores in the same order; ids may swap only between memories scoring the same."""
    expected = brute_force(contents, query, 10)
    got = [(uuid.UUID(r["memory"]["id"]), r["score"]) for r in results]
    assert len(got) == 10
    for (_, want), (_, have) in zip(expected, got, strict=True):
        assert math.isclose(want, have, abs_tol=1e-5)
    assert {i for i, _ in got} <= set(contents)
    tenth = expected[-1][1]
    assert {i for i, s in expected if s > tenth + 1e-5} <= {i for i, _ in got}


def sentence(rng: random.Random) -> str:
    return "The user likes " + " and ".join(rng.sample(WORDS, 3)) + f" (note {rng.randrange(10**6)})."


@pytest.mark.parametrize("hnsw_min_scope", [20_000, 1], ids=["exact", "large-scope-path"])
async def test_scoped_results_equal_brute_force(
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    hnsw_min_scope: int,
) -> None:
    rng = random.Random(7)
    contents = [sentence(rng) for _ in range(300)]
    ids = await add(sessionmaker, tenant.tenant_id, "u", contents)
    await add(sessionmaker, tenant.tenant_id, "someone-else", [sentence(rng) for _ in range(100)])
    mine = dict(zip(ids, contents, strict=True))
    app = create_app(
        settings.model_copy(update={"search_hnsw_min_scope": hnsw_min_scope}), configure_logs=False
    )
    async with AsyncTestClient(app=app) as client:
        for _ in range(15):
            query = " ".join(rng.sample(WORDS, 2))
            results = await search(
                client, tenant, user_id="u", query=query, top_k=10, mode="vector", threshold=-1
            )
            assert_brute_force_top_10(results, mine, query)


async def test_superseded_and_deleted_memories_never_appear(
    client: AsyncTestClient[Litestar], sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    lyon, jazz, _ = await add(
        sessionmaker,
        tenant.tenant_id,
        "u",
        ["The user lives in Lyon.", "The user likes jazz.", "The user works as a nurse."],
    )
    await change(
        sessionmaker, tenant.tenant_id, lyon, Op(OpKind.SUPERSEDE, "The user lives in Seattle.", targets=(0,))
    )
    await change(sessionmaker, tenant.tenant_id, jazz, Op(OpKind.DELETE, targets=(0,)))

    for body in ({"user_id": "u"}, {"all_users": True}):
        for mode in ("hybrid", "vector", "lexical"):
            found = await search(
                client, tenant, query="user lives in Lyon likes jazz", top_k=10, mode=mode, **body
            )
            contents = [r["memory"]["content"] for r in found]
            assert "The user lives in Lyon." not in contents
            assert "The user likes jazz." not in contents
            assert all(r["memory"]["status"] == "active" for r in found)
            if mode != "lexical":
                assert "The user lives in Seattle." in contents


async def test_as_of_returns_the_bank_as_it_was(
    client: AsyncTestClient[Litestar], sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    async def now() -> datetime:
        async with sessionmaker() as session:
            value = await session.scalar(text("SELECT clock_timestamp()"))
        assert isinstance(value, datetime)
        return value

    before = await now()
    [lyon] = await add(sessionmaker, tenant.tenant_id, "u", ["The user lives in Lyon."])
    [chess] = await add(sessionmaker, tenant.tenant_id, "u", ["The user plays chess on Sundays."])
    first = await now()
    await change(
        sessionmaker, tenant.tenant_id, lyon, Op(OpKind.SUPERSEDE, "The user lives in Seattle.", targets=(0,))
    )
    await change(
        sessionmaker,
        tenant.tenant_id,
        chess,
        Op(OpKind.UPDATE, "The user plays chess on Fridays.", targets=(0,)),
    )
    await add(sessionmaker, tenant.tenant_id, "u", ["The user lives near a lake."])

    query = {"user_id": "u", "query": "where does the user live, chess", "top_k": 10, "threshold": -1}
    then = await search(client, tenant, as_of=first.isoformat(), **query)
    assert sorted(r["memory"]["content"] for r in then) == [
        "The user lives in Lyon.",
        "The user plays chess on Sundays.",
    ]
    by_content = {r["memory"]["content"]: r["memory"] for r in then}
    assert by_content["The user lives in Lyon."]["status"] == "active"
    assert by_content["The user plays chess on Sundays."]["version"] == 1
    assert by_content["The user plays chess on Sundays."]["id"] == str(chess)

    current = await search(client, tenant, **query)
    assert sorted(r["memory"]["content"] for r in current) == [
        "The user lives in Seattle.",
        "The user lives near a lake.",
        "The user plays chess on Fridays.",
    ]
    assert await search(client, tenant, as_of=before.isoformat(), **query) == []


async def test_another_tenants_memories_never_appear(
    client: AsyncTestClient[Litestar],
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    theirs = await add(sessionmaker, other_tenant.tenant_id, "u", ["The user lives in Lyon.", "Code 4711."])
    mine = await add(sessionmaker, tenant.tenant_id, "u", ["The user lives in Paris."])
    await add(sessionmaker, tenant.tenant_id, "v", ["The user lives in Lyon, says v."])
    for body in ({"user_id": "u"}, {"all_users": True}):
        for mode in ("hybrid", "vector", "lexical"):
            found = await search(
                client, tenant, query="user lives in Lyon 4711", mode=mode, threshold=-1, **body
            )
            ids = {uuid.UUID(r["memory"]["id"]) for r in found}
            assert not ids & set(theirs)
            if "user_id" in body:
                assert ids <= set(mine)
    # the other tenant's key sees its own
    found = await search(client, other_tenant, user_id="u", query="4711")
    assert next(r["memory"]["content"] for r in found) == "Code 4711."


def vocabulary_model(text_: str) -> list[float]:
    """A stand-in for a semantic model: it knows a vocabulary and nothing of names or numbers."""
    known = " ".join(w for w in text_.lower().replace(".", " ").split() if w in VOCABULARY)
    return EMBEDDER.embed_one(known)


VOCABULARY = {
    *WORDS,
    "user",
    "likes",
    "with",
    "friends",
    "on",
    "weekends",
    "name",
    "neighbour",
    "locker",
    "code",
}


async def test_hybrid_finds_names_and_numbers_the_vector_ranking_misses(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    from app.embeddings.openai import OpenAIEmbedder
    from tests.support.fake_llm import FakeLLM

    with FakeLLM().in_thread() as model_server:
        model_server.embed_text = vocabulary_model
        embedder = OpenAIEmbedder(model_server.base_url, "vocab", 384)
        rng = random.Random(3)
        contents = [
            "The user likes " + " and ".join(rng.sample(WORDS, 3)) + " with friends on weekends."
            for _ in range(200)
        ] + ["Zofia is the name of the neighbour.", "Locker code 90210."]
        async with sessionmaker() as session, session.begin():
            await apply_ops(
                session,
                tenant_id=tenant.tenant_id,
                user_id="u",
                ops=[Op(OpKind.ADD, c) for c in contents],
                shown={},
                provenance=Provenance(actor="test", writer="test"),
                embedder=embedder,
                limits=ApplyLimits(max_ops=10_000, duplicate_threshold=1.0),
            )
        app = create_app(
            settings.model_copy(update={"embedder": "openai", "embedder_base_url": model_server.base_url}),
            configure_logs=False,
        )
        async with AsyncTestClient(app=app) as client:
            for query, wanted in (
                ("Zofia", "Zofia is the name of the neighbour."),
                ("who is zofia?", "Zofia is the name of the neighbour."),
                ("90210", "Locker code 90210."),
            ):
                vector = await search(client, tenant, user_id="u", query=query, mode="vector", top_k=5)
                assert wanted not in [r["memory"]["content"] for r in vector]
                hybrid = await search(client, tenant, user_id="u", query=query, top_k=5)
                assert wanted in [r["memory"]["content"] for r in hybrid[:2]]
                lexical = await search(client, tenant, user_id="u", query=query, mode="lexical", top_k=5)
                assert [r["memory"]["content"] for r in lexical] == [wanted]


async def test_filters_and_threshold(
    client: AsyncTestClient[Litestar], sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await add(
        sessionmaker, tenant.tenant_id, "u", ["The user drinks green tea."], agent_id="a1", tags=("food",)
    )
    await add(
        sessionmaker, tenant.tenant_id, "u", ["The user drinks black tea."], agent_id="a2", tags=("food", "x")
    )
    await add(sessionmaker, tenant.tenant_id, "u", ["The user owns a sailing boat."], agent_id="a1")
    base = {"user_id": "u", "query": "user drinks tea", "threshold": -1}

    def contents(found: list[dict[str, Any]]) -> set[str]:
        return {r["memory"]["content"] for r in found}

    assert contents(await search(client, tenant, agent_id="a2", **base)) == {"The user drinks black tea."}
    assert contents(await search(client, tenant, tags=["food"], **base)) == {
        "The user drinks green tea.",
        "The user drinks black tea.",
    }
    assert contents(await search(client, tenant, tags=["food", "x"], **base)) == {
        "The user drinks black tea."
    }
    strict = await search(client, tenant, **{**base, "threshold": 0.5, "mode": "vector"})
    assert contents(strict) == {"The user drinks green tea.", "The user drinks black tea."}
    assert all(r["similarity"] >= 0.5 for r in strict)
    everything = await search(client, tenant, **{**base, "mode": "vector"})
    assert len(everything) == 3
    assert [r["score"] for r in everything] == sorted((r["score"] for r in everything), reverse=True)


async def test_bad_searches_are_4xx(client: AsyncTestClient[Litestar], tenant: TenantKeys) -> None:
    for body, field in (
        ({"query": "x"}, "user_id"),
        ({"query": "x", "user_id": "u", "top_k": 1000}, "top_k"),
        ({"query": "", "user_id": "u"}, None),
        ({"query": "x", "user_id": "u", "mode": "fuzzy"}, None),
    ):
        response = await client.post("/v1/memories/search", json=body, headers=tenant.admin)
        assert response.status_code == 422, body
        assert response.json()["error"]["code"] == "validation_error"
        if field:
            assert field in response.json()["error"]["details"]
    response = await client.post("/v1/memories/search", json={"query": "x", "user_id": "u"})
    assert response.status_code == 401
    created = await client.post(
        "/v1/admin/keys", json={"name": "ingest-only", "roles": ["ingest"]}, headers=tenant.admin
    )
    key = created.json()["key"]
    response = await client.post(
        "/v1/memories/search", json={"query": "x", "user_id": "u"}, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 403


async def test_a_large_scope_with_a_tiny_ef_search_still_gets_the_exact_top_k(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """pgvector < 0.8 filters an HNSW scan after it, so a scope that is a small share of the tenant can
    come back short; such an answer is redone exactly (on a table this small the planner may also
    prefer the scope's B-tree: either way the top 10 must be the exact one)."""
    rng = random.Random(11)
    contents = [sentence(rng) for _ in range(12)]
    ids = await add(sessionmaker, tenant.tenant_id, "small", contents)
    await add(sessionmaker, tenant.tenant_id, "crowd", [sentence(rng) for _ in range(400)])
    tuned = settings.model_copy(
        update={"search_hnsw_min_scope": 1, "search_ef_search": 10, "search_pool": 10}
    )
    async with AsyncTestClient(app=create_app(tuned, configure_logs=False)) as client:
        query = "coffee jazz"
        results = await search(
            client, tenant, user_id="small", query=query, top_k=10, mode="vector", threshold=-1
        )
    expected = brute_force(dict(zip(ids, contents, strict=True)), query, 10)
    assert [round(r["score"], 5) for r in results] == [round(s, 5) for _, s in expected]


async def test_the_graph_finds_a_full_top_k_of_a_small_scope_by_iterative_scan(
    settings: Settings,
    engine: AsyncEngine,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
) -> None:
    """pgvector 0.8 (the embedded stack's) goes on walking the graph until the scope's filter has passed
    top_k rows: a scope of 2 % of the tenant gets its 10 from the graph route alone, where a plain
    filtered scan of the same graph comes back nearly empty."""
    rng = random.Random(17)
    contents = [sentence(rng) for _ in range(20)]
    mine = dict(zip(await add(sessionmaker, tenant.tenant_id, "small", contents), contents, strict=True))
    await add(sessionmaker, tenant.tenant_id, "crowd", [sentence(rng) for _ in range(1000)])
    # Into the graph, as the workers' indexer puts them (rows not in it would be read exactly).
    assert await index_graph(engine, batch=500, budget_s=60, everything=True) == 1020
    async with sessionmaker() as session, session.begin():
        await session.execute(
            text("ANALYZE memories")
        )  # else the planner guesses one row and skips the graph
    embedding = (await EMBEDDER.embed(["coffee jazz"]))[0]

    async def graph_route(*, iterative: bool) -> list[uuid.UUID]:
        async with sessionmaker() as session, session.begin():
            repo = SearchRepository(session)
            if iterative and await repo.vector_version() < ITERATIVE_SCAN_VERSION:
                pytest.skip("the database's pgvector predates iterative index scans")
            await repo.tune_hnsw(10, iterative=iterative)
            # At a thousand rows the planner would rather sort the tenant than walk its graph.
            await session.execute(text("SELECT set_config('enable_sort', 'off', true)"))
            hits = await repo.search(
                "hnsw",
                tenant_id=tenant.tenant_id,
                user_id="small",
                embedding=embedding,
                vector=True,
                words=[],
                lex_configs=[],
                top_k=10,
                pool=10,
                fusion=settings.search_fusion,
                vector_weight=settings.search_vector_weight,
                rrf_k=settings.search_rrf_k,
                threshold=-1.0,
                agent_id=None,
                tags=(),
                as_of=None,
            )
        return [h.id for h in hits]

    found = await graph_route(iterative=True)
    assert len(found) == 10
    assert set(found) <= set(mine)
    assert len(await graph_route(iterative=False)) < 10  # the same graph, filtered after the scan


@pytest.mark.parametrize("min_scope", [20_000, 1], ids=["exact", "hnsw"])
async def test_writer_candidates_for_several_texts_equal_brute_force(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys, min_scope: int
) -> None:
    """The writer's candidates for many texts (one statement on a scope's exact route) are, for each
    text, the scope's exact nearest memories, as a search would rank them."""
    rng = random.Random(5)
    contents = [sentence(rng) for _ in range(120)]
    ids = await add(sessionmaker, tenant.tenant_id, "w", contents)
    await add(sessionmaker, tenant.tenant_id, "other", [sentence(rng) for _ in range(60)])
    searcher = Searcher(settings.model_copy(update={"search_hnsw_min_scope": min_scope}), EMBEDDER)
    queries = [" ".join(rng.sample(WORDS, 2)) for _ in range(6)]
    async with sessionmaker() as session:
        ranked = await searcher.writer_candidates(session, tenant.tenant_id, "w", [*queries, "  "], 8)
    mine = dict(zip(ids, contents, strict=True))
    assert len(ranked) == len(queries)  # a blank text asks for nothing
    for query, hits in zip(queries, ranked, strict=True):
        expected = brute_force(mine, query, 8)
        assert [round(h.score, 5) for h in hits] == [round(s, 5) for _, s in expected]
        assert {h.id for h in hits} <= set(mine)
        tenth = expected[-1][1]
        assert {i for i, s in expected if s > tenth + 1e-5} <= {h.id for h in hits}


async def test_lexical_ranking_weighs_rare_words_and_matches_word_forms(
    client: AsyncTestClient[Litestar], sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """BM25: a word most memories share (a name) counts for little against the question's rare word,
    and English word forms meet ("hiking" finds "hikes"); the bank as of a time is ranked alike."""
    # Each common memory names Caroline twice: a ranking blind to rarity (ts_rank_cd) puts them first.
    common = [f"Caroline and Caroline's sister talked about work, part {i}." for i in range(30)]
    rare = ["A pottery class started on Monday.", "Melanie hikes in the mountains every summer."]
    await add(sessionmaker, tenant.tenant_id, "u", common + rare)
    for query, wanted in (
        ("When did Caroline start pottery?", rare[0]),
        ("Does Melanie like hiking?", rare[1]),
    ):
        found = await search(client, tenant, user_id="u", query=query, mode="lexical", top_k=3)
        assert found[0]["memory"]["content"] == wanted, found
        scores = [r["score"] for r in found]
        assert scores == sorted(scores, reverse=True)
        assert scores[-1] > 0
    before = datetime.now(UTC)
    await add(sessionmaker, tenant.tenant_id, "u", ["Caroline said pottery is calming."])
    query = "When did Caroline start pottery?"
    now = await search(client, tenant, user_id="u", query=query, mode="lexical", top_k=3)
    assert {r["memory"]["content"] for r in now[:2]} == {rare[0], "Caroline said pottery is calming."}
    then = await search(
        client, tenant, user_id="u", query=query, mode="lexical", top_k=3, as_of=before.isoformat()
    )
    assert then[0]["memory"]["content"] == rare[0]
    assert "Caroline said pottery is calming." not in [r["memory"]["content"] for r in then]


async def test_a_search_over_all_users_as_of_a_time_reads_a_bounded_history(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """Over its bound of versions, an as-of search of every user is a 422 naming the way out (one user);
    one user's as-of search, and a tenant within the bound, are answered."""
    await add(sessionmaker, tenant.tenant_id, "ana", ["The user lives in Lyon.", "The user plays chess."])
    await add(sessionmaker, tenant.tenant_id, "bob", ["The user likes jazz."])
    async with sessionmaker() as session:
        moment = await session.scalar(text("SELECT clock_timestamp()"))
    assert isinstance(moment, datetime)
    body = {"query": "where does the user live", "as_of": moment.isoformat(), "threshold": -1}
    for bound, all_users_status in ((3, 200), (2, 422)):
        bounded = settings.model_copy(update={"search_as_of_all_users_max_versions": bound})
        async with AsyncTestClient(create_app(bounded, configure_logs=False)) as client:
            everyone = await client.post(
                "/v1/memories/search", json={**body, "all_users": True}, headers=tenant.admin
            )
            assert everyone.status_code == all_users_status, everyone.text
            if all_users_status == 422:
                error = everyone.json()["error"]
                assert (error["code"], error["details"]) == ("as_of_too_broad", {"max_versions": 2})
            else:
                users = {r["memory"]["user_id"] for r in everyone.json()["results"]}
                assert users == {"ana", "bob"}
            one = await client.post(
                "/v1/memories/search", json={**body, "user_id": "ana"}, headers=tenant.admin
            )
            assert one.status_code == 200, one.text
            assert len(one.json()["results"]) == 2
            # At a valid time, every user's memories are read exactly too: bounded by their number.
            held = {
                "query": body["query"],
                "valid_at": moment.isoformat(),
                "threshold": -1,
                "all_users": True,
            }
            everyone = await client.post("/v1/memories/search", json=held, headers=tenant.admin)
            assert everyone.status_code == all_users_status, everyone.text
            if all_users_status == 200:
                assert {r["memory"]["user_id"] for r in everyone.json()["results"]} == {"ana", "bob"}
