"""The service on a Citus cluster of a coordinator and two workers, through the real API and a real
worker (offline writer): twenty tenants spread over both workers ingest and have their chunks applied,
search (hybrid and vector), read history and revert, purge a user (checked on each worker's shards
directly), stay apart (through the API, and as the service role in psql on the coordinator and on a
worker), and the hot path's statements each reach one shard."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.distribution import describe
from app.db.engine import create_engine, create_sessionmaker
from app.db.tenancy import tenant_scope
from app.domain.accounts.services import create_tenant
from app.domain.ingest.repositories import ChunkRepository
from app.domain.memories.repositories import MemoryRepository
from app.domain.pipeline.locks import Lease
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.search.services import Searcher, SearchQuery
from app.embeddings import embedder_from_settings
from app.server.asgi import create_app
from tests.citus.conftest import Cluster, service_settings
from tests.support.workers import running_worker, wait_for_chunks

TENANTS = 20
CITIES = ["Oslo", "Lyon", "Kyoto", "Quito", "Perth"]
SHARD_TABLES = (
    "chunks", "memories", "memory_versions", "changesets", "scopes", "audit_events", "reviews",
    "writer_views", "graph_scopes", "webhook_events", "webhook_deliveries",
)  # fmt: skip


@dataclass
class Tenant:
    id: uuid.UUID
    headers: dict[str, str]
    city: str


@dataclass
class Bank:
    api: AsyncTestClient[Litestar]
    settings: Settings
    sessionmaker: async_sessionmaker[AsyncSession]
    engine: AsyncEngine
    tenants: list[Tenant]


@pytest.fixture(scope="module")
async def bank(cluster: Cluster) -> AsyncIterator[Bank]:
    """Twenty tenants, each with one user who said where they live, every chunk applied by a worker."""
    settings = service_settings(
        cluster.service_url,
        cluster.owner_url,
        cluster.redis_url,
    )
    engine = create_engine(settings.as_owner(), application_name="memstore-tests")
    sessionmaker = create_sessionmaker(engine)
    tenants = []
    for i in range(TENANTS):
        async with sessionmaker() as session, session.begin():
            tenant, key = await create_tenant(session, f"citus-{i:02d}-{uuid.uuid4().hex[:6]}")
        tenants.append(Tenant(tenant.id, {"Authorization": f"Bearer {key}"}, CITIES[i % len(CITIES)]))
    async with AsyncTestClient(create_app(settings, configure_logs=False)) as api:
        for t in tenants:
            response = await api.post(
                "/v1/chunks",
                json={"user_id": "ada", "messages": [{"role": "user", "content": f"I live in {t.city}."}]},
                headers=t.headers,
            )
            assert response.status_code == 202, response.text
        async with running_worker(settings):
            for t in tenants:
                assert await wait_for_chunks(sessionmaker, t.id, 1) == {"applied": 1}
        yield Bank(api, settings, sessionmaker, engine, tenants)
    await engine.dispose()


async def test_the_schema_is_distributed_by_tenant_over_both_workers(cluster: Cluster, bank: Bank) -> None:
    async with bank.engine.connect() as conn:
        layout = await describe(conn)
    assert (layout.workers, len(layout.distributed), len(layout.reference), layout.local) == (2, 13, 3, ())
    coordinator = await cluster.connect(cluster.coordinator)
    try:
        nodes = {
            await coordinator.fetchval(
                "SELECT nodename FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)"
                " WHERE p.shardid = get_shard_id_for_distribution_column('chunks', $1::uuid)",
                t.id,
            )
            for t in bank.tenants
        }
    finally:
        await coordinator.close()
    assert nodes == {str(w.socket_dir) for w in cluster.workers}


async def test_each_tenant_finds_its_memory_by_hybrid_and_vector_search(bank: Bank) -> None:
    for t in bank.tenants[7:]:  # the first seven are changed by the tests below
        for mode in ("hybrid", "vector"):
            response = await bank.api.post(
                "/v1/memories/search",
                json={"user_id": "ada", "query": f"lives in {t.city}", "mode": mode},
                headers=t.headers,
            )
            assert response.status_code == 200, response.text
            contents = [r["memory"]["content"] for r in response.json()["results"]]
            assert contents[:1] == [f"The user lives in {t.city}."], (mode, contents)


async def test_a_memorys_history_and_a_revert(bank: Bank) -> None:
    t = bank.tenants[0]
    listing = (await bank.api.get("/v1/memories", params={"user_id": "ada"}, headers=t.headers)).json()
    [memory] = listing["items"]
    history = (await bank.api.get(f"/v1/memories/{memory['id']}/history", headers=t.headers)).json()
    assert [v["op"] for v in history["versions"]] == ["ADD"]
    changeset_id = history["versions"][0]["changeset_id"]
    response = await bank.api.post(
        f"/v1/admin/changesets/{changeset_id}/revert", json={"dry_run": False}, headers=t.headers
    )
    assert response.status_code == 200, response.text
    history = (await bank.api.get(f"/v1/memories/{memory['id']}/history", headers=t.headers)).json()
    assert len(history["versions"]) == 2
    assert history["versions"][-1]["status"] == "deleted"
    found = await bank.api.post(
        "/v1/memories/search", json={"user_id": "ada", "query": t.city}, headers=t.headers
    )
    assert found.json()["results"] == []


async def test_tenants_stay_apart_through_the_api(bank: Bank) -> None:
    a, b = bank.tenants[1], bank.tenants[2]
    theirs = (await bank.api.get("/v1/memories", params={"user_id": "ada"}, headers=b.headers)).json()[
        "items"
    ]
    assert (await bank.api.get(f"/v1/memories/{theirs[0]['id']}", headers=a.headers)).status_code == 404
    found = await bank.api.post(
        "/v1/memories/search", json={"user_id": "ada", "query": f"lives in {b.city}"}, headers=a.headers
    )
    assert all(b.city not in r["memory"]["content"] for r in found.json()["results"]) or a.city == b.city


@pytest.mark.parametrize("where", ["coordinator", "worker"])
async def test_the_service_role_sees_only_its_tenants_rows_in_psql(
    cluster: Cluster, bank: Bank, where: str
) -> None:
    node = cluster.coordinator if where == "coordinator" else cluster.workers[0]
    conn = await cluster.connect(node, user="memstore_service")
    try:
        assert await conn.fetchval("SELECT count(*) FROM memories") == 0  # no tenant set: nothing
        for t in bank.tenants[1:4]:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL memstore.tenant_ids = '{t.id}'")
                seen = await conn.fetch("SELECT DISTINCT tenant_id FROM memories")
                assert [r["tenant_id"] for r in seen] == [t.id]
                chunks = await conn.fetchval("SELECT count(*) FROM chunks")
                assert chunks == 1
    finally:
        await conn.close()


async def _shard_rows(cluster: Cluster, tenant_id: uuid.UUID, user_id: str) -> dict[str, int]:
    """The user's rows in every shard on every worker, read on the worker from the shards themselves."""
    rows: dict[str, int] = {}
    for worker in cluster.workers:
        conn = await cluster.connect(worker)
        try:
            await conn.execute("SET citus.override_table_visibility = off")
            shards = await conn.fetch(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'user_id'"
                " WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname ~ $1",
                f"^({'|'.join(SHARD_TABLES)})_[0-9]+$",
            )
            for shard in (r["relname"] for r in shards):
                n = await conn.fetchval(
                    f"SELECT count(*) FROM {shard} WHERE tenant_id = $1 AND user_id = $2",
                    tenant_id,
                    user_id,
                )
                if n:
                    rows[f"{worker.data_dir.name}/{shard}"] = n
        finally:
            await conn.close()
    return rows


async def test_a_purged_user_leaves_nothing_on_any_shard(cluster: Cluster, bank: Bank) -> None:
    t = bank.tenants[4]  # a tenant no other test reads (the tests run in any order)
    before = await _shard_rows(cluster, t.id, "ada")
    assert any(shard.split("/")[1].startswith("memory_versions_") for shard in before), before
    response = await bank.api.delete("/v1/admin/users/ada", params={"purge": "true"}, headers=t.headers)
    assert response.status_code == 200, response.text
    assert await _shard_rows(cluster, t.id, "ada") == {}
    other = bank.tenants[3]
    assert await _shard_rows(cluster, other.id, "ada")  # another tenant's user is untouched
    # The purge's event (written by the tables' owner, as the purge) is in the tenant's chain, intact.
    events = await bank.api.get("/v1/admin/audit", params={"action": "user.purged"}, headers=t.headers)
    assert [(e["target_id"], e["summary"]) for e in events.json()["items"]] == [
        ("ada", {"deleted": response.json()["deleted"]})
    ]
    verdict = (await bank.api.get("/v1/admin/audit/verify", headers=t.headers)).json()
    assert (verdict["ok"], verdict["unsealed"]) == (True, 0), verdict


_SHARD = re.compile(r"\b(" + "|".join(SHARD_TABLES) + r")_([0-9]+)\b")


async def _shards_reached(
    cluster: Cluster, settings: Settings, tenant_id: uuid.UUID, work: Any
) -> tuple[set[str], set[str]]:
    """The workers and shard groups (by hash range) the statements of `work(session)` reached, read
    from the coordinator's log of the commands it sent on (`citus.log_remote_commands`)."""
    engine = create_engine(settings, application_name="memstore-tests-routing")
    logged: list[asyncpg.PostgresLogMessage] = []
    try:
        with tenant_scope([tenant_id]):
            async with AsyncSession(engine, expire_on_commit=False) as session, session.begin():
                raw = await (await session.connection()).get_raw_connection()
                driver = raw.driver_connection
                assert driver is not None
                driver.add_log_listener(lambda _conn, message: logged.append(message))
                await session.execute(text("SET LOCAL citus.log_remote_commands = on"))
                await session.execute(text("SET LOCAL client_min_messages = log"))
                await work(session)
                await session.rollback()
    finally:
        await engine.dispose()
    commands = [m for m in logged if str(m.message).startswith("issuing")]
    assert commands, "no command reached a worker"
    # The commands on the shards of tenant tables (a reference table's write goes to every node).
    sharded = [m for m in commands if _SHARD.search(str(m.message))]
    servers = {m.detail.split("on server ")[1].split(" ")[0] for m in sharded if m.detail}
    shard_ids = {int(match[1]) for m in sharded for match in _SHARD.findall(str(m.message))}
    conn = await cluster.connect(cluster.coordinator)
    try:
        ranges = await conn.fetch(
            "SELECT DISTINCT shardminvalue FROM pg_dist_shard WHERE shardid = ANY ($1::bigint[])",
            list(shard_ids),
        )
    finally:
        await conn.close()
    return servers, {r["shardminvalue"] for r in ranges}


async def test_the_hot_paths_statements_reach_one_shard(cluster: Cluster, bank: Bank) -> None:
    t = bank.tenants[5]
    vector = [0.0] * 383 + [1.0]

    async def hot_path(session: AsyncSession) -> None:
        # ingest: the scope's and the tenant's backlog
        await ChunkRepository(session).unfinished([(t.id, "ada")], 1, [t.id], 1, adding=5)
        # claim (a lease no backend holds: the statement runs, nothing is claimed)
        claim = await PipelineRepository(session).claim_next(
            t.id, "ada", 3, Lease(0, 0, 0, None), distributed=True
        )
        assert claim.claimed is None
        # apply's near-duplicate probe, and a scoped read
        await MemoryRepository(session).closest_active([(t.id, "ada", vector)])
        await MemoryRepository(session).page(t.id, "ada", agent_id=None, statuses=None, after=None, limit=10)

    servers, groups = await _shards_reached(cluster, bank.settings, t.id, hot_path)
    assert len(servers) == 1, servers
    assert len(groups) == 1, groups


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
async def test_a_scoped_search_reaches_one_shard(cluster: Cluster, bank: Bank, mode: str) -> None:
    t = bank.tenants[6]
    searcher = Searcher(bank.settings, embedder_from_settings(bank.settings))

    async def search(session: AsyncSession) -> None:
        hits = await searcher.search(session, t.id, SearchQuery(f"lives in {t.city}", "ada", mode=mode))
        assert hits

    servers, groups = await _shards_reached(cluster, bank.settings, t.id, search)
    assert (len(servers), len(groups)) == (1, 1), (servers, groups)


async def test_the_near_duplicate_probe_of_a_batch_of_several_tenants(bank: Bank) -> None:
    """The group commit's probe for a batch of several tenants (on a cluster, a statement a tenant),
    each tenant's memories alone."""
    settings_embedder = embedder_from_settings(bank.settings)
    picked = bank.tenants[7:10]
    vectors = await settings_embedder.embed([f"The user lives in {t.city}." for t in picked])
    items = [(t.id, "ada", v) for t, v in zip(picked, vectors, strict=True)]
    async with AsyncSession(bank.engine) as session:
        found = await MemoryRepository(session).closest_active(items, k=2)
    for t, nearest in zip(picked, found, strict=True):
        assert [content for _, _, content in nearest] == [f"The user lives in {t.city}."]
        assert nearest[0][1] > 0.99
