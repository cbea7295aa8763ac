"""The vector graph off the write path: no write inserts into it, the workers' indexer adds what was
written in batches, of the tenants and scopes whose searches go through the graph, and search finds
every memory meanwhile (the graph and its tail, merged)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from datetime import UTC, datetime

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine
from app.db.models import GraphScope, Memory
from app.domain.search.graph import index_graph
from app.server.asgi import create_app
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.integration.search.test_search import (
    WORDS,
    add,
    assert_brute_force_top_10,
    change,
    search,
    sentence,
)
from tests.support.waiting import wait_for
from tests.support.workers import running_worker


async def graph_marks(sessionmaker: async_sessionmaker[AsyncSession], ids: list[uuid.UUID]) -> list[bool]:
    async with sessionmaker() as session:
        rows = dict(
            (await session.execute(select(Memory.id, Memory.in_graph).where(Memory.id.in_(ids)))).all()
        )
    return [rows[i] for i in ids]


async def in_graph(sessionmaker: async_sessionmaker[AsyncSession]) -> tuple[int, int]:
    """(active memories in the graph, active memories not yet in it)."""
    async with sessionmaker() as session:
        rows = dict(
            (
                await session.execute(
                    select(Memory.in_graph, func.count())
                    .where(Memory.status == "active")
                    .group_by(Memory.in_graph)
                )
            ).all()
        )
    return rows.get(True, 0), rows.get(False, 0)


@pytest.mark.parametrize("hnsw_min_scope", [20_000, 1], ids=["all-users", "large-scope"])
async def test_search_through_the_graph_and_its_tail_equals_brute_force(
    settings: Settings,
    engine: AsyncEngine,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    hnsw_min_scope: int,
) -> None:
    """Half of the memories in the graph and half written since: searches over all users and over one
    large scope (both through the graph) rank every memory, as brute force does."""
    rng = random.Random(23)
    contents: dict[uuid.UUID, str] = {}
    users = ("ann", "bob", "cy")
    for user in users:
        batch = [sentence(rng) for _ in range(80)]
        contents.update(zip(await add(sessionmaker, tenant.tenant_id, user, batch), batch, strict=True))
    await add(sessionmaker, other_tenant.tenant_id, "ann", [sentence(rng) for _ in range(80)])
    assert await index_graph(engine, batch=50, budget_s=60, everything=True) == 320
    for user in users:
        batch = [sentence(rng) for _ in range(80)]
        contents.update(zip(await add(sessionmaker, tenant.tenant_id, user, batch), batch, strict=True))
    # an updated memory leaves the graph with its new text; a deleted one leaves search altogether
    moved, gone = list(contents)[:2]
    await change(
        sessionmaker, tenant.tenant_id, moved, Op(OpKind.UPDATE, "The user likes opera now.", targets=(0,))
    )
    contents[moved] = "The user likes opera now."
    await change(sessionmaker, tenant.tenant_id, gone, Op(OpKind.DELETE, targets=(0,)))
    del contents[gone]
    assert await in_graph(sessionmaker) == (318, 241)

    async with sessionmaker() as session:
        owners = dict((await session.execute(select(Memory.id, Memory.user_id))).all())
    tuned = settings.model_copy(update={"search_hnsw_min_scope": hnsw_min_scope})
    async with AsyncTestClient(app=create_app(tuned, configure_logs=False)) as client:
        for _ in range(8):
            query = " ".join(rng.sample(WORDS, 2))
            for user in (None, "bob") if hnsw_min_scope == 1 else (None,):
                scope = {i: c for i, c in contents.items() if user is None or owners[i] == user}
                body = {"all_users": True} if user is None else {"user_id": user}
                results = await search(
                    client, tenant, query=query, top_k=10, mode="vector", threshold=-1, **body
                )
                assert_brute_force_top_10(results, scope, query)


async def test_no_write_puts_a_memory_in_the_graph(
    settings: Settings,
    engine: AsyncEngine,
    sessionmaker: async_sessionmaker[AsyncSession],
    client: AsyncTestClient[Litestar],
    tenant: TenantKeys,
) -> None:
    """Adds, updates, a restore, a rollback and a revert each leave the heads they write out of the
    graph (`in_graph` false: the row version joins no HNSW index); the indexer then adds them."""
    ids = await add(sessionmaker, tenant.tenant_id, "u", ["The user likes tea.", "The user has a cat."])
    assert await graph_marks(sessionmaker, ids) == [False, False]
    assert await index_graph(engine, batch=10, budget_s=60, everything=True) == 2
    assert await graph_marks(sessionmaker, ids) == [True, True]
    before_update = datetime.now(UTC)
    await asyncio.sleep(0.01)  # time itself must pass: the update's timestamp strictly after this one

    await change(
        sessionmaker, tenant.tenant_id, ids[0], Op(OpKind.UPDATE, "The user likes green tea.", targets=(0,))
    )
    assert await graph_marks(sessionmaker, ids) == [False, True]
    await index_graph(engine, batch=10, budget_s=60, everything=True)

    restore = await client.post(
        "/v1/admin/users/u/restore", json={"as_of": before_update.isoformat()}, headers=tenant.admin
    )
    assert restore.status_code == 200, restore.text
    assert await graph_marks(sessionmaker, ids) == [False, True]  # only the head the restore moved
    await index_graph(engine, batch=10, budget_s=60, everything=True)

    rollback = await client.post(
        f"/v1/admin/memories/{ids[0]}/rollback", json={"to_version": 2}, headers=tenant.admin
    )
    assert rollback.status_code == 200, rollback.text
    assert await graph_marks(sessionmaker, ids) == [False, True]
    await index_graph(engine, batch=10, budget_s=60, everything=True)

    revert = await client.post(
        f"/v1/admin/changesets/{rollback.json()['changeset_id']}/revert",
        json={},
        headers=tenant.admin,
    )
    assert revert.status_code == 200, revert.text
    assert await graph_marks(sessionmaker, ids) == [False, True]
    assert await index_graph(engine, batch=10, budget_s=60, everything=True) == 1
    assert await in_graph(sessionmaker) == (2, 0)


async def test_the_indexer_skips_rows_a_writer_holds(
    engine: AsyncEngine, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """A head locked by a write in progress is left for a later batch: the indexer never waits on a
    writer (nor marks a row about to be written again)."""
    ids = await add(sessionmaker, tenant.tenant_id, "u", [f"The user owns {n} books." for n in range(5)])
    async with sessionmaker() as session, session.begin():
        await session.execute(select(Memory.id).where(Memory.id == ids[0]).with_for_update())
        started = time.monotonic()
        assert await index_graph(engine, batch=2, budget_s=60, everything=True) == 4
        assert time.monotonic() - started < 5
    assert await graph_marks(sessionmaker, ids) == [False, True, True, True, True]
    assert await index_graph(engine, batch=2, budget_s=60, everything=True) == 1


async def test_the_graph_holds_the_memories_of_the_searches_that_go_through_it(
    settings: Settings,
    engine: AsyncEngine,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    """The indexer adds no memory until a search goes through the graph: a search over all users asks
    for its tenant's memories, a large scope's search for that scope's, an exact search for nothing.
    Every search ranks every memory meanwhile; a purge erases the user's request with the rest."""
    rng = random.Random(5)
    contents: dict[uuid.UUID, str] = {}
    for user in ("ann", "bob"):
        batch = [sentence(rng) for _ in range(30)]
        contents.update(zip(await add(sessionmaker, tenant.tenant_id, user, batch), batch, strict=True))
    for user in ("cy", "dee"):
        await add(sessionmaker, other_tenant.tenant_id, user, [sentence(rng) for _ in range(10)])

    async def wanted() -> set[tuple[uuid.UUID, str]]:
        async with sessionmaker() as session:
            rows = await session.execute(select(GraphScope.tenant_id, GraphScope.user_id))
            return {(tenant_id, user_id) for tenant_id, user_id in rows}

    exact = settings.model_copy(update={"search_hnsw_min_scope": 20_000})
    async with AsyncTestClient(app=create_app(exact, configure_logs=False)) as client:
        await search(client, tenant, query="tea", user_id="ann", mode="vector")
        await search(client, tenant, query="tea", user_id="ann", mode="hybrid")
        assert await wanted() == set()
        assert await index_graph(engine, batch=16, budget_s=60) == 0

        query = " ".join(rng.sample(WORDS, 2))
        results = await search(client, tenant, query=query, all_users=True, mode="vector", threshold=-1)
        assert_brute_force_top_10(results, contents, query)  # read exactly: nothing in the graph yet
        assert await wanted() == {(tenant.tenant_id, "")}
    assert await index_graph(engine, batch=16, budget_s=60) == 60
    assert await in_graph(sessionmaker) == (60, 20)  # the other tenant's memories stay out

    large = settings.model_copy(update={"search_hnsw_min_scope": 5})
    async with AsyncTestClient(app=create_app(large, configure_logs=False)) as client:
        await search(client, other_tenant, query="tea", user_id="cy", mode="vector")
        await search(client, other_tenant, query="tea", user_id="cy", mode="lexical")  # no graph to use
    assert await wanted() == {(tenant.tenant_id, ""), (other_tenant.tenant_id, "cy")}
    assert await index_graph(engine, batch=16, budget_s=60) == 10
    assert await in_graph(sessionmaker) == (70, 10)  # dee's were not searched through the graph

    async with AsyncTestClient(app=create_app(settings, configure_logs=False)) as client:
        purged = await client.delete(
            "/v1/admin/users/cy", params={"purge": "true"}, headers=other_tenant.admin
        )
        assert purged.status_code == 200, purged.text
    assert await wanted() == {(tenant.tenant_id, "")}


async def test_a_running_worker_adds_new_memories_to_the_graph(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """The indexer runs in the workers, every second: the memories searched through the graph, or all
    of them with `graph_index_all`; with its budget 0 it is off."""
    await add(sessionmaker, tenant.tenant_id, "u", [f"The user ran {n} km." for n in range(30)])
    async with running_worker(
        settings.model_copy(update={"graph_index_budget_s": 0, "graph_index_all": True})
    ) as worker:
        await wait_for(lambda: "pipeline" in worker.ctx, timeout_s=60, what="the worker started")
        # Time itself must pass: that nothing is indexed shows only after the indexer's passes would
        # have run (the first at start, the next a second or two later).
        await asyncio.sleep(2.5)
    assert await in_graph(sessionmaker) == (0, 30)
    async with running_worker(settings) as worker:
        await wait_for(lambda: "pipeline" in worker.ctx, timeout_s=60, what="the worker started")
        await asyncio.sleep(2.5)  # time itself must pass, as above
        assert await in_graph(sessionmaker) == (0, 30)  # nobody searched through the graph
    async with running_worker(settings.model_copy(update={"graph_index_all": True})):
        await wait_for(
            lambda: in_graph(sessionmaker),
            lambda counts: counts == (30, 0),
            timeout_s=15,
            what="every memory in the graph (in, out)",
            interval_s=0.1,
        )


async def test_the_service_role_marks_rows_only_through_the_indexer(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """The function the workers call answers a count, nothing of any tenant's content."""
    await add(sessionmaker, tenant.tenant_id, "u", ["The user likes chess."])
    service = create_engine(settings, application_name="memstore-tests-service")
    try:
        async with service.begin() as conn:
            assert await conn.scalar(text("SELECT count(*) FROM memories")) == 0  # no tenant set: no rows
            tails = (await conn.execute(text("SELECT * FROM memstore_graph_tails(true)"))).all()
            assert [tuple(t) for t in tails] == [(tenant.tenant_id, "")]
            assert (
                await conn.scalar(text("SELECT memstore_index_graph(:t, '', 10)"), {"t": tenant.tenant_id})
                == 1
            )
    finally:
        await service.dispose()
    assert await in_graph(sessionmaker) == (1, 0)
