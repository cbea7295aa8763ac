"""A bank on one Postgres moved onto a Citus cluster by the procedure of docs/operations.md ("Moving a
bank onto a cluster"), step by step as an operator runs it: the service stopped, `pg_dump` of the single
Postgres, the service role made on the coordinator of a new cluster, `pg_restore` into the coordinator,
`memstore db distribute` (which moves the rows into the shards), `memstore migrate` (nothing to do).

The bank is written on one embedded Postgres 16 + pgvector by the real API and a real worker (offline
writer): several tenants, two users each, facts superseded by later ones, a hand edit (UPDATE), a
reverted changeset, and the sealed audit chain. On the cluster, through the real API and worker: the
same memories, histories and counts per tenant, the chain verifies, search finds the memories, new
chunks ingest and apply (the identity columns go on from where the bank left them), and the rows lie
on both workers, none left behind on the coordinator."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.migrate import upgrade
from app.db.tenancy import SERVICE_ROLE
from app.domain.accounts.services import create_tenant
from app.lib.embedded import EmbeddedCitusNode, EmbeddedPostgres, EmbeddedStack
from app.server.asgi import create_app
from tests.citus.conftest import service_settings
from tests.support.workers import running_worker, wait_for_chunks

# Placed on the workers by the hash of their random ids: with 12, all on one worker is a 1-in-2,048 chance
# (with 6 it was 1 in 32, and the rows-on-both-workers test failed so once).
TENANTS = 12
USERS = ("ada", "bob")
# What each user says, one chunk each, in order: a fact, a fact that supersedes it, another fact.
SAID = ("I live in Lyon.", "I moved to Seattle.", "I mainly use Python.")
TABLES = (
    "chunks", "memories", "memory_versions", "changesets", "audit_events", "scopes", "reviews",
    "writer_views", "webhook_events", "webhook_deliveries",
)  # fmt: skip
IDENTITY = {"memory_versions": "id", "audit_events": "id"}


@dataclass
class Tenant:
    id: uuid.UUID
    headers: dict[str, str]


@dataclass
class Bank:
    """What the API and the database said about every tenant, before the move or after it."""

    memories: dict[uuid.UUID, list[dict[str, Any]]] = field(default_factory=dict)
    histories: dict[uuid.UUID, dict[str, list[tuple[Any, ...]]]] = field(default_factory=dict)
    counts: dict[uuid.UUID, dict[str, int]] = field(default_factory=dict)
    chains: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Moved:
    tenants: list[Tenant]
    before: Bank
    after: Bank
    settings: Settings
    api: AsyncTestClient[Litestar]
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    coordinator: EmbeddedCitusNode
    workers: list[EmbeddedCitusNode]
    identity_max: dict[str, int]  # each identity column's highest value before the move
    timings: dict[str, float]
    planned: str  # what `memstore db distribute --dry-run` said
    distributed: str  # what `memstore db distribute` said


async def _read_bank(api: AsyncTestClient[Litestar], owner_dsn: str, tenants: list[Tenant]) -> Bank:
    """Every tenant's memories (all statuses) and their histories through the API, the chain's verdict,
    and the tenant's rows per table read as the owner."""
    bank = Bank()
    for t in tenants:
        memories: list[dict[str, Any]] = []
        for user in USERS:
            response = await api.get(
                "/v1/memories", params={"user_id": user, "status": "all"}, headers=t.headers
            )
            assert response.status_code == 200, response.text
            memories += response.json()["items"]
        bank.memories[t.id] = sorted(memories, key=lambda m: m["id"])
        bank.histories[t.id] = {}
        for memory in memories:
            response = await api.get(f"/v1/memories/{memory['id']}/history", headers=t.headers)
            assert response.status_code == 200, response.text
            bank.histories[t.id][memory["id"]] = [
                (v["version"], v["op"], v["status"], v["content"], v["changeset_id"], v["created_at"])
                for v in response.json()["versions"]
            ]
        verdict = await api.get("/v1/admin/audit/verify", headers=t.headers)
        assert verdict.status_code == 200, verdict.text
        bank.chains[t.id] = verdict.json()
    conn = await asyncpg.connect(owner_dsn)
    try:
        for t in tenants:
            bank.counts[t.id] = {
                table: await conn.fetchval(f"SELECT count(*) FROM {table} WHERE tenant_id = $1", t.id)
                for table in TABLES
            }
    finally:
        await conn.close()
    return bank


async def _write_bank(settings: Settings, api: AsyncTestClient[Litestar], sessionmaker: Any) -> list[Tenant]:
    """The bank of the single Postgres: every user's three chunks applied, one hand edit per tenant, and
    every other tenant's last changeset reverted."""
    tenants = []
    for i in range(TENANTS):
        async with sessionmaker() as session, session.begin():
            tenant, key = await create_tenant(session, f"moved-{i}-{uuid.uuid4().hex[:6]}")
        tenants.append(Tenant(tenant.id, {"Authorization": f"Bearer {key}"}))
    async with running_worker(settings):
        for said in SAID:
            for t in tenants:
                for user in USERS:
                    response = await api.post(
                        "/v1/chunks",
                        json={"user_id": user, "messages": [{"role": "user", "content": said}]},
                        headers=t.headers,
                    )
                    assert response.status_code == 202, response.text
            for t in tenants:  # in order: a user's next fact after the last is applied
                counts = await wait_for_chunks(sessionmaker, t.id, len(USERS) * (SAID.index(said) + 1))
                assert set(counts) == {"applied"}, counts
    for i, t in enumerate(tenants):
        listing = (await api.get("/v1/memories", params={"user_id": "ada"}, headers=t.headers)).json()
        python = next(m for m in listing["items"] if "Python" in m["content"])
        response = await api.patch(
            f"/v1/memories/{python['id']}",
            json={"content": "The user mainly uses Python and Rust.", "reason": "told the support desk"},
            headers=t.headers,
        )
        assert response.status_code == 200, response.text
        if i % 2:
            changesets = (
                await api.get("/v1/admin/changesets", params={"user_id": "bob"}, headers=t.headers)
            ).json()
            newest = changesets["items"][0]["id"]
            response = await api.post(
                f"/v1/admin/changesets/{newest}/revert", json={"dry_run": False}, headers=t.headers
            )
            assert response.status_code == 200, response.text
    return tenants


def _run(args: list[str], **kwargs: Any) -> float:
    """Run a program of the procedure; how long it took (s)."""
    started = time.monotonic()
    subprocess.run(args, check=True, capture_output=True, text=True, **kwargs)
    return time.monotonic() - started


def _memstore(owner_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env |= {
        "MEMSTORE_ADMIN_DATABASE_URL": owner_url,
        "MEMSTORE_DATABASE_URL": owner_url,
        "MEMSTORE_LOG_FORMAT": "console",
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return subprocess.run(
        [sys.executable, "-m", "app", *args], env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
async def moved() -> AsyncIterator[Moved]:
    data_dir = Path(tempfile.mkdtemp(prefix="memstore-move-"))
    single = EmbeddedStack(data_dir / "single")
    cluster = EmbeddedStack(data_dir / "cluster", citus_workers=2)
    timings: dict[str, float] = {}
    try:
        # The bank on one Postgres, written by the service.
        owner_url, redis_url = single.start()
        await asyncio.to_thread(upgrade, owner_url)
        assert single.postgres is not None
        source: EmbeddedPostgres = single.postgres
        settings = service_settings(single.service_url, owner_url, redis_url)
        engine = _owner_engine(settings)
        sessionmaker = async_sessionmaker(engine, expire_on_commit=False)
        async with AsyncTestClient(create_app(settings, configure_logs=False)) as api:
            tenants = await _write_bank(settings, api, sessionmaker)
            before = await _read_bank(api, source.dsn(), tenants)
        await engine.dispose()
        conn = await asyncpg.connect(source.dsn())
        try:
            identity_max = {t: await conn.fetchval(f"SELECT max({c}) FROM {t}") for t, c in IDENTITY.items()}
            timings["rows"] = sum([await conn.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES])
        finally:
            await conn.close()

        # The move: the service is stopped; the bank dumped, restored into a new cluster's coordinator
        # (the service role made there first), distributed, migrated.
        dump = data_dir / "bank.dump"
        timings["pg_dump"] = _run([str(source.bin_dir / "pg_dump"), "-Fc", "-f", str(dump), source.dsn()])
        single.stop()
        cluster_owner_url, cluster_redis_url = cluster.start()
        assert cluster.cluster is not None
        coordinator = cluster.cluster.coordinator
        coordinator.psql(f"CREATE ROLE {SERVICE_ROLE} LOGIN")
        timings["pg_restore"] = _run(
            [str(coordinator.bin_dir / "pg_restore"), "--exit-on-error", "-d", coordinator.dsn(), str(dump)]
        )
        planned = _memstore(cluster_owner_url, "db", "distribute", "--dry-run")
        assert planned.returncode == 0, planned.stderr
        started = time.monotonic()
        distributed = _memstore(cluster_owner_url, "db", "distribute")
        timings["distribute"] = time.monotonic() - started
        assert distributed.returncode == 0, distributed.stderr
        migrated = _memstore(cluster_owner_url, "migrate")
        assert migrated.returncode == 0, migrated.stderr

        # The service on the cluster.
        settings = service_settings(cluster.service_url, cluster_owner_url, cluster_redis_url)
        engine = _owner_engine(settings)
        sessionmaker = async_sessionmaker(engine, expire_on_commit=False)
        async with AsyncTestClient(create_app(settings, configure_logs=False)) as api:
            after = await _read_bank(api, coordinator.dsn(), tenants)
            yield Moved(
                tenants, before, after, settings, api, engine, sessionmaker, coordinator,
                cluster.cluster.nodes, identity_max, timings, planned.stdout, distributed.stdout,
            )  # fmt: skip
        await engine.dispose()
    finally:
        cluster.stop()
        single.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def _owner_engine(settings: Settings) -> AsyncEngine:
    from app.db.engine import create_engine

    return create_engine(settings.as_owner(), application_name="memstore-tests")


async def test_every_tenant_has_the_same_memories_histories_and_rows(moved: Moved) -> None:
    for t in moved.tenants:
        assert moved.after.memories[t.id] == moved.before.memories[t.id]
        assert moved.after.histories[t.id] == moved.before.histories[t.id]
        assert moved.after.counts[t.id] == moved.before.counts[t.id]
    ops = {v[1] for t in moved.tenants for h in moved.before.histories[t.id].values() for v in h}
    assert {"ADD", "SUPERSEDE", "UPDATE"} <= ops, ops


async def test_the_audit_chain_verifies_on_the_cluster(moved: Moved) -> None:
    for t in moved.tenants:
        before, after = moved.before.chains[t.id], moved.after.chains[t.id]
        assert before["ok"], before
        assert before["checked"] > 0, before
        assert after == before


async def test_search_finds_the_moved_memories(moved: Moved) -> None:
    for t in moved.tenants:
        for mode in ("hybrid", "vector"):
            response = await moved.api.post(
                "/v1/memories/search",
                json={"user_id": "ada", "query": "lives in Seattle", "mode": mode},
                headers=t.headers,
            )
            assert response.status_code == 200, response.text
            contents = [r["memory"]["content"] for r in response.json()["results"]]
            assert contents[:1] == ["The user lives in Seattle."], (mode, contents)


async def test_new_chunks_ingest_and_apply_after_the_move(moved: Moved) -> None:
    async with running_worker(moved.settings):
        for t in moved.tenants:
            response = await moved.api.post(
                "/v1/chunks",
                json={"user_id": "ada", "messages": [{"role": "user", "content": "I'm vegetarian."}]},
                headers=t.headers,
            )
            assert response.status_code == 202, response.text
        for t in moved.tenants:
            chunks = moved.before.counts[t.id]["chunks"] + 1
            counts = await wait_for_chunks(moved.sessionmaker, t.id, chunks)
            assert counts == {"applied": chunks}, counts
    conn = await asyncpg.connect(moved.coordinator.dsn())
    try:
        for table, column in IDENTITY.items():
            ids = [
                r[0]
                for r in await conn.fetch(
                    f"SELECT {column} FROM {table} WHERE {column} > $1 ORDER BY 1",
                    moved.identity_max[table],
                )
            ]
            assert ids, f"no new {table} row after the move"
            assert len(ids) == len(set(ids))
    finally:
        await conn.close()
    for t in moved.tenants:
        found = await moved.api.post(
            "/v1/memories/search", json={"user_id": "ada", "query": "vegetarian"}, headers=t.headers
        )
        assert [r["memory"]["content"] for r in found.json()["results"]][:1] == ["The user is vegetarian."]
        verdict = (await moved.api.get("/v1/admin/audit/verify", headers=moved.tenants[0].headers)).json()
        assert verdict["ok"], verdict
        assert verdict["checked"] > moved.before.chains[moved.tenants[0].id]["checked"]


async def test_the_rows_lie_on_both_workers_and_none_on_the_coordinator(moved: Moved) -> None:
    per_worker, hnsw = {}, {}
    for worker in moved.workers:
        conn = await asyncpg.connect(worker.dsn())
        try:
            await conn.execute("SET citus.override_table_visibility = off")
            shards = await conn.fetch(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname ~ '^memory_versions_[0-9]+$'"
            )
            # The HNSW indexes restored with the bank are built on each shard of memories.
            hnsw[worker.data_dir.name] = await conn.fetchval(
                "SELECT count(*) FROM pg_indexes"
                " WHERE tablename ~ '^memories_[0-9]+$' AND indexdef ~ 'USING hnsw'"
            )
            per_worker[worker.data_dir.name] = sum(
                [await conn.fetchval(f"SELECT count(*) FROM {r['relname']}") for r in shards]
            )
        finally:
            await conn.close()
    assert all(per_worker.values()), per_worker
    assert all(hnsw.values()), hnsw
    total = sum(moved.before.counts[t.id]["memory_versions"] for t in moved.tenants)
    assert sum(per_worker.values()) >= total
    conn = await asyncpg.connect(moved.coordinator.dsn())
    try:
        # The coordinator's own table of each distributed one (its shell) keeps no copy of the rows.
        sizes = {t: await conn.fetchval("SELECT pg_relation_size($1::regclass)", t) for t in TABLES}
    finally:
        await conn.close()
    assert sizes == dict.fromkeys(TABLES, 0), sizes


async def test_the_dry_run_said_what_the_distribution_then_did(moved: Moved) -> None:
    versions = sum(moved.before.counts[t.id]["memory_versions"] for t in moved.tenants)
    planned = "memory_versions: distributed by tenant_id, co-located with chunks"
    assert f"would distribute: {planned}, {versions} rows moved into its shards" in moved.planned
    assert f"distributed: memory_versions: {versions} rows moved into its shards" in moved.distributed
    assert f"distributed: tenants: {len(moved.tenants)} rows copied to every node" in moved.distributed


async def test_the_append_only_guards_stand_on_the_coordinator_and_the_shards(moved: Moved) -> None:
    conn = await asyncpg.connect(moved.coordinator.dsn())
    try:
        guards = await conn.fetch(
            "SELECT tgrelid::regclass::text AS t, tgname, tgenabled::text FROM pg_trigger"
            " WHERE NOT tgisinternal AND tgname LIKE '%no_truncate'"
        )
        assert guards, "no TRUNCATE guard on the coordinator"
        assert {g["tgenabled"] for g in guards} == {"O"}, guards
        with pytest.raises(asyncpg.exceptions.RestrictViolationError, match="append-only"):
            await conn.execute("TRUNCATE memory_versions")
    finally:
        await conn.close()


async def test_distribute_refuses_a_worker(moved: Moved) -> None:
    from app.cli.db import distribute_database
    from app.db.distribution import DistributionError

    with pytest.raises(DistributionError, match="not the coordinator"):
        await distribute_database(moved.workers[0].url())
