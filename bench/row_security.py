"""What row-level security costs: the same searches as the tables' owner and as the service role.

A throwaway embedded Postgres, migrated; `--memories` memories (hashing vectors, short texts drawn from
a small vocabulary) over `--tenants` tenants of `--users` users each, loaded with COPY (no vector graph:
scoped search is exact). Then `Searcher.search()` in-process, scoped top-10, vector and hybrid, once as
the owner (no policy applies) and once as `memstore_service` with the tenant set (the policy applies),
alternating per query so both see the same machine. Latency p50 / p90 of each, and the ratio.

Then EXPLAIN ANALYZE of the lexical condition over one user and over a whole tenant, as each role:
under a policy Postgres will not use the full-text operator (not leakproof) as an index condition, so
the service finds the tenant's rows through the scope B-tree and filters them instead of probing GIN.

Usage: python bench/row_security.py [--memories 10000] [--tenants 5] [--users 20] [--queries 1500]
                                    [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.db.migrate import upgrade
from app.db.tenancy import SERVICE_ROLE, TENANTS_SETTING, tenant_scope
from app.domain.search.services import Searcher, SearchQuery
from app.embeddings.hashing import HashingEmbedder
from app.lib.embedded import EmbeddedPostgres

WORDS = [
    "coffee",
    "tea",
    "python",
    "rust",
    "seattle",
    "lyon",
    "jazz",
    "piano",
    "dog",
    "cat",
    "hiking",
    "sushi",
    "vegan",
    "chess",
    "garden",
    "novel",
    "guitar",
    "running",
    "yoga",
    "tennis",
]
LEXICAL = (
    "EXPLAIN (ANALYZE, COSTS OFF) SELECT id FROM memories, to_tsquery('english', 'coffee & jazz') q "
    "WHERE tenant_id = $1 {scope} AND status = 'active' AND lexemes @@ q"
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def seed(pg: EmbeddedPostgres, args: argparse.Namespace) -> list[uuid.UUID]:
    embedder = HashingEmbedder(384)
    rng = random.Random(1)
    conn = await asyncpg.connect(pg.dsn())
    try:
        tenants = [uuid.uuid4() for _ in range(args.tenants)]
        for i, tenant in enumerate(tenants):
            await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", tenant, f"t{i}")
        texts = [" ".join(rng.sample(WORDS, 5)) + f" item {k}" for k in range(args.memories)]
        vectors = await embedder.embed(texts)
        rows = [
            (
                uuid.uuid4(),
                tenants[k % args.tenants],
                f"u{k // args.tenants % args.users}",
                text,
                "[" + ",".join(f"{x:.5f}" for x in vector) + "]",
            )
            for k, (text, vector) in enumerate(zip(texts, vectors, strict=True))
        ]
        # Scoped search is exact over the scope's B-tree; no graph needs building for it.
        await conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")
        await conn.execute(
            "CREATE TEMP TABLE seed (id uuid, tenant_id uuid, user_id text, content text, e text)"
        )
        await conn.copy_records_to_table("seed", records=rows)
        await conn.execute(
            "INSERT INTO memories (id, tenant_id, user_id, content, embedding)"
            " SELECT id, tenant_id, user_id, content, e::vector FROM seed"
        )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
    return tenants


async def search_latency(
    pg: EmbeddedPostgres, tenants: list[uuid.UUID], args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    embedder = HashingEmbedder(384)
    roles = {"owner": pg.url(), "service": pg.url(user=SERVICE_ROLE)}
    clients = {}
    for role, url in roles.items():
        settings = Settings(database_url=url, embedder="hashing")
        engine = create_engine(settings, application_name=f"bench-rls-{role}")
        clients[role] = (engine, create_sessionmaker(engine), Searcher(settings, embedder))
    rng = random.Random(2)
    latencies: dict[tuple[str, str], list[float]] = {(r, m): [] for r in roles for m in ("vector", "hybrid")}
    warm = min(200, args.queries // 5)
    try:
        for i in range(args.queries):
            tenant, user = tenants[i % len(tenants)], f"u{(i * 7) % args.users}"
            query = " ".join(rng.sample(WORDS, 3))
            for mode in ("vector", "hybrid"):
                for role in ("owner", "service") if i % 2 else ("service", "owner"):
                    _, sessionmaker, searcher = clients[role]
                    with tenant_scope([tenant]):
                        started = time.perf_counter()
                        async with sessionmaker() as session:
                            await searcher.search(
                                session, tenant, SearchQuery(query, user, top_k=10, mode=mode)
                            )  # type: ignore[arg-type]
                            await session.commit()
                        if i >= warm:
                            latencies[(role, mode)].append(time.perf_counter() - started)
    finally:
        for engine, _, _ in clients.values():
            await engine.dispose()
    figures: dict[str, dict[str, float]] = {}
    for (role, mode), values in latencies.items():
        values.sort()
        figures[f"{mode}_{role}"] = {
            "p50_ms": round(values[len(values) // 2] * 1000, 3),
            "p90_ms": round(values[int(len(values) * 0.9)] * 1000, 3),
        }
    for mode in ("vector", "hybrid"):
        own, svc = figures[f"{mode}_owner"], figures[f"{mode}_service"]
        figures[f"{mode}_ratio"] = {k: round(svc[k] / own[k], 2) for k in own}
    return figures


async def lexical_plans(pg: EmbeddedPostgres, tenant: uuid.UUID) -> dict[str, list[str]]:
    plans: dict[str, list[str]] = {}
    for role, dsn in (("owner", pg.dsn()), ("service", pg.dsn().replace("postgres@", f"{SERVICE_ROLE}@"))):
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f"SELECT set_config('{TENANTS_SETTING}', $1, false)", str(tenant))
            for label, scope in (("user", "AND user_id = 'u0'"), ("tenant", "")):
                rows = await conn.fetch(LEXICAL.format(scope=scope), tenant)
                plans[f"{label}_{role}"] = [r[0] for r in rows]
        finally:
            await conn.close()
    return plans


async def main(args: argparse.Namespace) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="memstore-bench-rls-"))
    pg = EmbeddedPostgres(data_dir / "pg")
    pg.start()
    try:
        await asyncio.to_thread(upgrade, pg.url())
        log(f"seeding {args.memories} memories")
        tenants = await seed(pg, args)
        log("scoped search, owner against service role")
        results: dict[str, Any] = {"params": vars(args).copy()}
        results["search"] = await search_latency(pg, tenants, args)
        results["lexical_plans"] = await lexical_plans(pg, tenants[0])
        return results
    finally:
        pg.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--queries", type=int, default=1500)
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    outcome = asyncio.run(main(arguments))
    for name, figure in outcome["search"].items():
        print(f"{name:16} {figure}")
    for name, plan in outcome["lexical_plans"].items():
        print(f"-- lexical over one {name.replace('_', ', as ')}")
        print("\n".join(line for line in plan if "Scan" in line or "Execution" in line))
    if arguments.json:
        arguments.json.write_text(json.dumps(outcome, indent=2, default=str) + "\n")
