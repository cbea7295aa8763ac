"""Search at scale: scoped exact search, cross-scope HNSW, hybrid ranking, and the Mem0 pattern, at 1M.

Builds a synthetic bank in a throwaway embedded Postgres (the one `memstore up` runs: Postgres 16,
pgvector 0.6, shared_buffers 256 MB): `--memories` memories over `--users` users, sizes skewed (a few
users hold `--big-user-size` memories each, the rest follow a log-normal), 384-dim vectors drawn
around facets of topics of domains (each user talks about a handful of topics), queries being new
statements drawn the same way, rows in random arrival order. The schema is the real one, built by
the migrations; rows are loaded with COPY.

Measured, each figure labelled with the level it is taken at:
- SQL: one asyncpg statement, the repository's query shape, no Python service code;
- service: `Searcher.search()` in-process (SQLAlchemy session, statement composition, result objects),
  the embedding precomputed (a lookup embedder), so the model's own time is not counted;
- scoped top-10 latency p50 / p99 with 8 concurrent clients (goal p50 <= 5 ms, p99 <= 20 ms), users
  drawn uniformly, and separately for the largest users (which the HNSW index serves);
- cross-scope (whole tenant) HNSW recall@10 against exact brute force (numpy), and latency, for
  several ef_search values (goal recall >= 0.95);
- the query Mem0 runs on pgvector (a JSONB payload filter, no B-tree on the scope) on a copy of the
  same rows, as the comparison;
- single-row insert cost with and without the HNSW index.

Usage: python bench/search.py [--memories 1000000] [--users 10000] [--big-users 5]
                              [--big-user-size 50000] [--json out.json] [--plot docs/search-bench.png]
Needs the `bench` extra (numpy, matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.db.migrate import upgrade
from app.domain.search.services import Searcher, SearchQuery
from app.lib.embedded import EmbeddedPostgres

DIM = 384
GOAL_P50_MS, GOAL_P99_MS, GOAL_RECALL = 5.0, 20.0, 0.95
KNN_EPSILON = 1e-3  # a k-NN result counts if within this of the true 10th's distance (ann-benchmarks)
DOMAINS, TOPICS = 50, 2_000  # topics grouped in broad domains (work, food, travel ...)
FACETS = 20  # facets per topic ("coffee: espresso", "coffee: the grinder" ...), cosine ~0.8 to the topic
NOISE = 0.6  # spread of a memory around its facet (cosine ~0.86): two statements of one fact ~0.74


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(latencies_ms: list[float], wall_s: float | None = None) -> dict[str, float]:
    figures = {
        "n": len(latencies_ms),
        "p50_ms": round(pct(latencies_ms, 50), 2),
        "p99_ms": round(pct(latencies_ms, 99), 2),
        "mean_ms": round(statistics.fmean(latencies_ms), 2),
    }
    if wall_s:
        figures["qps"] = round(len(latencies_ms) / wall_s, 1)
    return figures


def user_sizes(rng: np.random.Generator, memories: int, users: int, big: int, big_size: int) -> np.ndarray:
    """Memories per user: `big` users of `big_size`, the rest log-normal, summing to `memories`."""
    rest = memories - big * big_size
    raw = rng.lognormal(mean=0.0, sigma=1.2, size=users - big)
    sizes = np.maximum(1, np.floor(raw / raw.sum() * rest)).astype(np.int64)
    diff = int(rest - sizes.sum())  # hand out (or take back) what rounding left
    largest = np.argsort(-raw)
    if diff > 0:
        sizes[largest[:diff]] += 1
    elif diff < 0:
        sizes[largest[0]] += diff
    return np.concatenate([np.full(big, big_size, dtype=np.int64), sizes])


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


@dataclass
class Bank:
    """A synthetic bank: who owns each memory, its topic and vector, and the order rows arrive in."""

    sizes: np.ndarray
    user_topics: list[np.ndarray]
    owner: np.ndarray
    facets: np.ndarray
    topic: np.ndarray
    vectors: np.ndarray
    order: np.ndarray

    def query_for(self, rng: np.random.Generator, u: int) -> np.ndarray:
        """A new statement (not a stored row) about something user `u` talks about."""
        t = rng.choice(self.user_topics[u])
        noise = rng.standard_normal(DIM).astype(np.float32) * (NOISE / np.sqrt(DIM))
        return unit(self.facets[t, rng.integers(0, FACETS)] + noise)


def synthetic_bank(
    rng: np.random.Generator, memories: int, users: int, big_users: int, big_user_size: int
) -> Bank:
    """`memories` 384-dim vectors over `users` users, sizes skewed, each user on a handful of topics."""
    sizes = user_sizes(rng, memories, users, big_users, big_user_size)
    # Topics near their domain (cosine ~0.6 within a domain), all sharing a common direction, as
    # sentence embeddings do (unrelated sentences still score ~0.1-0.2), rather than 2,000 islands.
    domains = unit(rng.standard_normal((DOMAINS, DIM)))
    common = unit(rng.standard_normal(DIM))
    centroids = unit(
        domains[rng.integers(0, DOMAINS, TOPICS)]
        + 0.8 * unit(rng.standard_normal((TOPICS, DIM)))
        + 0.35 * common
    )
    user_topics = [rng.choice(TOPICS, size=int(rng.integers(3, 12)), replace=False) for _ in range(users)]
    owner = np.repeat(np.arange(users), sizes)
    facets = unit(centroids[:, None, :] + 0.75 * unit(rng.standard_normal((TOPICS, FACETS, DIM)))).astype(
        np.float32
    )
    facet = rng.integers(0, FACETS, memories)
    topic = np.array([rng.choice(user_topics[u]) for u in owner]) if memories <= 50_000 else None
    if topic is None:  # vectorised for 1M: a random topic of each row's user
        lengths = np.array([len(t) for t in user_topics])
        flat = np.concatenate(user_topics)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        topic = flat[offsets[owner] + (rng.random(len(owner)) * lengths[owner]).astype(np.int64)]
    vectors = np.empty((memories, DIM), dtype=np.float32)
    for start in range(0, memories, 100_000):
        part = slice(start, start + 100_000)
        noise = rng.standard_normal((len(owner[part]), DIM)).astype(np.float32) * (NOISE / np.sqrt(DIM))
        vectors[part] = unit(facets[topic[part], facet[part]] + noise)
    order = rng.permutation(memories)  # arrival order: users interleaved, as in production
    return Bank(sizes, user_topics, owner, facets, topic, vectors, order)


async def for_bulk_loads(conn: asyncpg.Connection, *, maintenance_work_mem: str) -> str:
    """Settings for loading a bank and building its indexes in one go; the server's pgvector version."""
    await conn.execute(f"ALTER SYSTEM SET maintenance_work_mem = '{maintenance_work_mem}'")
    await conn.execute("ALTER SYSTEM SET max_parallel_maintenance_workers = 1")
    await conn.execute("ALTER SYSTEM SET checkpoint_timeout = '30min'")
    await conn.execute("ALTER SYSTEM SET max_wal_size = '20GB'")
    await conn.execute("SELECT pg_reload_conf()")
    return str(await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))


async def recall_at_10(
    conn: asyncpg.Connection,
    sql: str,
    tenant_id: uuid.UUID,
    ef_search: int,
    queries: list[tuple[np.ndarray, set[uuid.UUID], float]],
) -> dict[str, Any]:
    """Recall@10 of `sql` (query vector $1, tenant $2) at `ef_search` over `queries` (vector, the true
    ten's ids, the true 10th's distance), and its latency. Two recalls: by id (strict: a different row
    at the same distance counts as a miss), and ann-benchmarks' k-NN recall (a result counts if its
    distance is within 1e-3 of the true 10th's), which does not punish near-ties between many equally
    close statements of one fact."""
    latencies, recalls, knn = [], [], []
    for q, want, tenth in queries:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
            started = time.perf_counter()
            rows = await conn.fetch(sql, q, tenant_id)
            latencies.append((time.perf_counter() - started) * 1000)
        recalls.append(len({r["id"] for r in rows} & want) / 10)
        knn.append(sum(1 for r in rows if r["distance"] <= tenth + KNN_EPSILON) / 10)
    return {
        "recall_at_10": round(statistics.fmean(recalls), 4),
        "knn_recall_at_10": round(statistics.fmean(knn), 4),
        "min_recall": round(min(recalls), 2),
        "sql_1_client": summary(latencies),
    }


class LookupEmbedder:
    """Precomputed query vectors by text, so service figures exclude the embedding model."""

    name = "hashing-v1-384"  # what the schema records; the bench writes vectors itself
    dim = DIM

    def __init__(self) -> None:
        self.vectors: dict[str, list[float]] = {}

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [self.vectors[t] for t in texts]

    async def aclose(self) -> None:
        """Nothing is held open."""


async def run_clients(
    clients: int, duration_s: float, one: Callable[[int], Awaitable[None]]
) -> tuple[list[float], float]:
    """`clients` concurrent loops calling `one(i)` for `duration_s`; latencies (ms) and wall time."""
    latencies: list[float] = []
    stop = time.perf_counter() + duration_s
    counter = iter(range(10**9))

    async def loop() -> None:
        while time.perf_counter() < stop:
            i = next(counter)
            started = time.perf_counter()
            await one(i)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    return latencies, time.perf_counter() - started


EXACT_SQL = """
SELECT id, (embedding <=> $1) + 0 AS distance FROM memories
WHERE tenant_id = $2 AND user_id = $3 AND status = 'active' AND embedding IS NOT NULL
ORDER BY 2 LIMIT 10"""
HNSW_SQL = """
SELECT id, embedding <=> $1 AS distance FROM memories
WHERE tenant_id = $2 AND status = 'active' AND in_graph AND embedding IS NOT NULL
ORDER BY embedding <=> $1 LIMIT 10"""
HNSW_SCOPED_SQL = """
SELECT id FROM memories WHERE tenant_id = $2 AND user_id || '' = $3 AND status = 'active' AND in_graph
ORDER BY embedding <=> $1 LIMIT 10"""
MEM0_SQL = """
SELECT id, vector <=> $1 AS distance, payload FROM mem0_memories
WHERE payload->>'user_id' = $2 ORDER BY distance LIMIT 10"""


def service_process(
    database_url: str,
    tenant_id: uuid.UUID,
    queries: list[tuple[str, str, list[float]]],
    clients: int,
    duration_s: float,
    mode: str,
    seed: int,
) -> tuple[list[float], float]:
    """One API-like process: its own engine and Searcher, `clients` concurrent searches."""

    async def run() -> tuple[list[float], float]:
        embedder = LookupEmbedder()
        for _, text_, vector in queries:
            embedder.vectors[text_] = vector
        settings = Settings(database_url=database_url, db_pool_size=clients + 2)
        engine = create_engine(settings, application_name="bench-search")
        sessionmaker = create_sessionmaker(engine)
        searcher = Searcher(settings, embedder)
        order = random.Random(seed).sample(range(len(queries)), len(queries))

        async def one(i: int) -> None:
            user, text_, _ = queries[order[i % len(order)]]
            async with sessionmaker() as session:
                query = SearchQuery(text_, user, top_k=10, mode=mode)  # type: ignore[arg-type]
                await searcher.search(session, tenant_id, query)
                await session.commit()

        for i in range(100):  # warm: connections, prepared statements, scope-size cache
            await one(i)
        try:
            return await run_clients(clients, duration_s, one)
        finally:
            await engine.dispose()

    return asyncio.run(run())


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(42)
    results: dict[str, Any] = {"params": vars(args).copy()}
    data_dir = Path(tempfile.mkdtemp(prefix="memstore-bench-search-"))
    pg = EmbeddedPostgres(data_dir / "pg")
    pg.start()
    try:
        database_url = pg.url()
        await asyncio.to_thread(upgrade, database_url)
        dsn = pg.dsn()

        async def connect() -> asyncpg.Connection:
            conn = await asyncpg.connect(dsn)
            await register_vector(conn)
            return conn

        conn = await connect()
        results["pgvector"] = await for_bulk_loads(conn, maintenance_work_mem="6GB")
        tenant_id, other_tenant = uuid.uuid4(), uuid.uuid4()
        await conn.execute(
            "INSERT INTO tenants (id, name) VALUES ($1, 'bench'), ($2, 'bench-inserts')",
            tenant_id,
            other_tenant,
        )

        # --- the bank -----------------------------------------------------------------------
        log(f"generating {args.memories:,} memories over {args.users:,} users")
        bank = synthetic_bank(rng, args.memories, args.users, args.big_users, args.big_user_size)
        sizes, owner, facets = bank.sizes, bank.owner, bank.facets
        topic, vectors, order = bank.topic, bank.vectors, bank.order
        ids = [uuid.uuid4() for _ in range(args.memories)]
        user_names = [f"user-{u:05d}" for u in range(args.users)]
        results["users"] = {
            "count": args.users,
            "largest": int(sizes.max()),
            "median": int(np.median(sizes)),
            "p99": int(np.percentile(sizes, 99)),
            "mean": round(float(sizes.mean()), 1),
        }

        log("dropping the search indexes for the load (built afterwards, timed)")
        await conn.execute("DROP INDEX ix_memories_embedding_hnsw")
        await conn.execute("DROP INDEX ix_memories_lexemes")
        started = time.perf_counter()

        def records(rows: np.ndarray) -> Any:
            for i in rows:
                u = owner[i]
                yield (
                    ids[i],
                    tenant_id,
                    user_names[u],
                    f"The user mentioned topic t{topic[i]} (note {i}).",
                    vectors[i],
                    True,  # in the graph, as the workers' indexer leaves every memory once it has run
                )

        columns = ["id", "tenant_id", "user_id", "content", "embedding", "in_graph"]
        for start in range(0, args.memories, 50_000):
            await conn.copy_records_to_table(
                "memories", records=records(order[start : start + 50_000]), columns=columns
            )
            if start % 200_000 == 0:
                log(f"  loaded {start + 50_000:,}")
        # The lexemes the service writes with each text (`app.lib.lexical`; these texts are English).
        await conn.execute("UPDATE memories SET lexemes = to_tsvector('english'::regconfig, content)")
        results["load_s"] = round(time.perf_counter() - started, 1)
        await conn.execute("VACUUM ANALYZE memories")
        log(f"loaded in {results['load_s']} s")

        async def insert_cost(label: str, n: int, *, in_graph: bool = True) -> dict[str, float]:
            """Single-row INSERTs, one transaction each: into the graph (what the indexer's mark costs a
            row), or out of it (how the service writes a memory, `in_graph` false)."""
            lat = []
            for k in range(n):
                noise = rng.standard_normal(DIM).astype(np.float32) * (NOISE / np.sqrt(DIM))
                v = unit(facets[k % TOPICS, k % FACETS] + noise)
                started = time.perf_counter()
                await conn.execute(
                    "INSERT INTO memories (id, tenant_id, user_id, content, embedding, in_graph) "
                    "VALUES ($1, $2, $3, $4, $5, $6)",
                    uuid.uuid4(),
                    other_tenant,
                    f"writer-{k % 50}",
                    f"Inserted memory {k} {label}.",
                    v,
                    in_graph,
                )
                lat.append((time.perf_counter() - started) * 1000)
            return summary(lat)

        results["insert_without_hnsw"] = await insert_cost("before", args.inserts)
        log(f"insert without HNSW: {results['insert_without_hnsw']}")

        started = time.perf_counter()
        await conn.execute(
            "CREATE INDEX ix_memories_lexemes ON memories USING gin (lexemes) WHERE status = 'active'"
        )
        results["gin_build_s"] = round(time.perf_counter() - started, 1)
        m, efc = args.hnsw_m, args.hnsw_ef_construction
        log(f"GIN built in {results['gin_build_s']} s; building HNSW (m={m}, ef_construction={efc})")
        started = time.perf_counter()
        await conn.execute(
            "CREATE INDEX ix_memories_embedding_hnsw ON memories USING hnsw (embedding vector_cosine_ops) "
            f"WITH (m = {int(m)}, ef_construction = {int(efc)}) WHERE status = 'active' AND in_graph"
        )
        results["hnsw_build_s"] = round(time.perf_counter() - started, 1)
        log(f"HNSW built in {results['hnsw_build_s']} s")
        results["insert_with_hnsw"] = await insert_cost("after", args.inserts)
        log(f"insert with HNSW: {results['insert_with_hnsw']}")
        results["insert_out_of_graph"] = await insert_cost("written", args.inserts, in_graph=False)
        log(f"insert as the service writes (out of the graph): {results['insert_out_of_graph']}")
        results["sizes_mb"] = {
            name: round(await conn.fetchval("SELECT pg_relation_size($1::regclass)", name) / 2**20)
            for name in (
                "memories",
                "ix_memories_embedding_hnsw",
                "ix_memories_lexemes",
                "ix_memories_scope",
            )
        }
        await conn.execute("VACUUM ANALYZE memories")

        # --- queries --------------------------------------------------------------------------
        def query_for(u: int) -> np.ndarray:
            return bank.query_for(rng, u)

        big = list(range(args.big_users))
        scoped_users = rng.integers(0, args.users, size=4000)
        scoped_queries = [(int(u), query_for(int(u))) for u in scoped_users]

        pool = [await connect() for _ in range(args.clients)]

        async def sql_scoped(i: int, conns: list[asyncpg.Connection], slot: int) -> None:
            u, q = scoped_queries[i % len(scoped_queries)]
            await conns[slot].fetch(EXACT_SQL, q, tenant_id, user_names[u])

        async def measure_sql(
            clients: int, fn: Callable[[int, list[asyncpg.Connection], int], Awaitable[None]], duration: float
        ) -> dict[str, float]:
            slots = asyncio.Queue[int]()
            for s in range(clients):
                slots.put_nowait(s)

            async def one(i: int) -> None:
                slot = await slots.get()
                try:
                    await fn(i, pool, slot)
                finally:
                    slots.put_nowait(slot)

            lat, wall = await run_clients(clients, duration, one)
            return summary(lat, wall)

        log("scoped exact search, SQL level")
        results["scoped_sql_1_client"] = await measure_sql(1, sql_scoped, args.duration)
        results["scoped_sql"] = await measure_sql(args.clients, sql_scoped, args.duration)
        log(f"  {results['scoped_sql']}")

        # Service level: the real Searcher with a SQLAlchemy engine.
        embedder = LookupEmbedder()
        settings = Settings(
            database_url=database_url,
            db_pool_size=args.clients + 2,
            search_ef_search=args.service_ef_search,
        )
        engine = create_engine(settings, application_name="bench-search")
        sessionmaker = create_sessionmaker(engine)
        searcher = Searcher(settings, embedder)
        texts = []
        for k, (u, q) in enumerate(scoped_queries):
            text_ = f"q{k} topic t{k % TOPICS}"
            embedder.vectors[text_] = q.tolist()
            texts.append((u, text_))

        async def service_search(i: int, mode: str, users: list[tuple[int, str]]) -> list[Any]:
            u, text_ = users[i % len(users)]
            async with sessionmaker() as session:
                hits = await searcher.search(
                    session,
                    tenant_id,
                    SearchQuery(text_, user_names[u], top_k=10, mode=mode),  # type: ignore[arg-type]
                )
                await session.commit()
            return hits

        # warm the caches (scope sizes, pgvector version, prepared statements)
        for i in range(200):
            await service_search(i, "vector", texts)
        for mode in ("vector", "hybrid"):
            log(f"scoped search, service level, {mode}")

            async def one(i: int, mode: str = mode) -> None:
                await service_search(i, mode, texts)

            lat, wall = await run_clients(1, args.duration, one)
            results[f"scoped_service_{mode}_1_client"] = summary(lat, wall)
            lat, wall = await run_clients(args.clients, args.duration, one)
            results[f"scoped_service_{mode}"] = summary(lat, wall)
            log(f"  {results[f'scoped_service_{mode}']}")

        # The service as deployed: API processes share the clients (one per core here).
        if args.service_processes > 1:
            from concurrent.futures import ProcessPoolExecutor
            from multiprocessing import get_context

            shipped = [(user_names[u], text_, embedder.vectors[text_]) for u, text_ in texts]
            per_process = args.clients // args.service_processes
            for mode in ("vector", "hybrid"):
                log(f"scoped search, service level, {mode}, {args.service_processes} processes")
                with ProcessPoolExecutor(args.service_processes, mp_context=get_context("spawn")) as ex:
                    futures = [
                        ex.submit(
                            service_process,
                            database_url,
                            tenant_id,
                            shipped,
                            per_process,
                            args.duration,
                            mode,
                            p,
                        )
                        for p in range(args.service_processes)
                    ]
                    parts = [f.result() for f in futures]
                lat = [x for part, _ in parts for x in part]
                wall = max(w for _, w in parts)
                key = f"scoped_service_{mode}_{args.service_processes}_processes"
                results[key] = summary(lat, wall)
                log(f"  {results[key]}")

        # The largest users: HNSW path (scope above search_hnsw_min_scope) vs exact, and its recall.
        log("largest users: HNSW-served scoped search, recall against exact")
        big_queries = [(u, query_for(u)) for u in big for _ in range(40)]
        recall_big, exact_big_lat, hnsw_big_lat = [], [], []
        c = pool[0]
        for u, q in big_queries:
            started = time.perf_counter()
            exact = [r["id"] for r in await c.fetch(EXACT_SQL, q, tenant_id, user_names[u])]
            exact_big_lat.append((time.perf_counter() - started) * 1000)
            async with c.transaction():
                await c.execute(f"SET LOCAL hnsw.ef_search = {args.service_ef_search}")
                started = time.perf_counter()
                approx = [r["id"] for r in await c.fetch(HNSW_SCOPED_SQL, q, tenant_id, user_names[u])]
                hnsw_big_lat.append((time.perf_counter() - started) * 1000)
            recall_big.append(len(set(exact) & set(approx)) / 10)
        big_texts = []
        for k, (u, q) in enumerate(big_queries):
            text_ = f"big{k}"
            embedder.vectors[text_] = q.tolist()
            big_texts.append((u, text_))
        service_big = []
        for i in range(len(big_texts)):
            started = time.perf_counter()
            await service_search(i, "vector", big_texts)
            service_big.append((time.perf_counter() - started) * 1000)
        results["big_users"] = {
            "size": args.big_user_size,
            "exact_sql": summary(exact_big_lat),
            "hnsw_sql": summary(hnsw_big_lat),
            "hnsw_recall_at_10": round(statistics.fmean(recall_big), 4),
            "service_vector": summary(service_big),
        }
        log(f"  {results['big_users']}")

        # Cross-scope: the whole tenant through HNSW vs numpy brute force.
        log("cross-scope HNSW recall@10 and latency by ef_search")
        cross = [query_for(int(u)) for u in rng.integers(0, args.users, size=args.cross_queries)]
        truth, tenth = [], []
        for q in cross:
            scores = vectors @ q
            top = np.argpartition(-scores, 10)[:10]
            truth.append({ids[j] for j in top})
            tenth.append(1.0 - float(scores[top].min()))  # cosine distance of the true 10th
        results["cross_scope"] = {}
        for ef in args.ef_search:
            results["cross_scope"][ef] = await recall_at_10(
                c, HNSW_SQL, tenant_id, ef, list(zip(cross, truth, tenth, strict=True))
            )
            log(f"  ef_search={ef}: {results['cross_scope'][ef]}")
        # The same through the service (all_users): ef_search = max(SEARCH_EF_SEARCH, SEARCH_POOL).
        cross_texts = []
        for k, q in enumerate(cross):
            embedder.vectors[f"cross{k}"] = q.tolist()
            cross_texts.append(f"cross{k}")
        lat, recalls, knn = [], [], []
        for k, text_ in enumerate(cross_texts):
            started = time.perf_counter()
            async with sessionmaker() as session:
                hits = await searcher.search(
                    session, tenant_id, SearchQuery(text_, None, top_k=10, mode="vector", all_users=True)
                )
                await session.commit()
            lat.append((time.perf_counter() - started) * 1000)
            recalls.append(len({h.id for h in hits} & truth[k]) / 10)
            knn.append(sum(1 for h in hits if 1.0 - (h.similarity or 0.0) <= tenth[k] + KNN_EPSILON) / 10)
        results["cross_scope_service"] = {
            "ef_search": max(args.service_ef_search, settings.search_pool),
            "recall_at_10": round(statistics.fmean(recalls), 4),
            "knn_recall_at_10": round(statistics.fmean(knn), 4),
            "service_1_client": summary(lat),
        }
        log(f"  service: {results['cross_scope_service']}")
        # Exact cross-scope for reference (a full scan): a few queries.
        lat = []
        for q in cross[:5]:
            started = time.perf_counter()
            await c.fetch(
                "SELECT id FROM memories WHERE tenant_id = $2 AND status = 'active' "
                "ORDER BY (embedding <=> $1) + 0 LIMIT 10",
                q,
                tenant_id,
            )
            lat.append((time.perf_counter() - started) * 1000)
        results["cross_scope_exact_sql"] = summary(lat)

        # --- the Mem0 pattern -----------------------------------------------------------------------
        log("Mem0 pattern: copying the bank into a (id, vector, payload jsonb) table")
        await c.execute("CREATE TABLE mem0_memories (id uuid PRIMARY KEY, vector vector(384), payload jsonb)")
        started = time.perf_counter()
        await c.execute(
            "INSERT INTO mem0_memories SELECT id, embedding, jsonb_build_object('user_id', user_id, "
            "'data', content, 'hash', md5(content), 'created_at', created_at) "
            "FROM memories WHERE tenant_id = $1",
            tenant_id,
        )
        await c.execute("VACUUM ANALYZE mem0_memories")
        log(f"  copied in {time.perf_counter() - started:.0f} s")
        lat = []
        for u, q in scoped_queries[: args.mem0_queries]:
            started = time.perf_counter()
            await c.fetch(MEM0_SQL, q, user_names[u])
            lat.append((time.perf_counter() - started) * 1000)
        results["mem0_sql_1_client"] = summary(lat)
        log(f"  {results['mem0_sql_1_client']}")

        await engine.dispose()
        for conn_ in pool:
            await conn_.close()
        await conn.close()
    finally:
        pg.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return results


def report(results: dict[str, Any]) -> None:
    print("\n== search benchmark ==")
    print(json.dumps(results, indent=2, default=str))
    s = results["scoped_service_vector"]
    print(
        f"scoped top-10, service, vector, {results['params']['clients']} clients: p50 {s['p50_ms']} ms "
        f"(goal {GOAL_P50_MS}), p99 {s['p99_ms']} ms (goal {GOAL_P99_MS})"
    )
    for metric in ("recall_at_10", "knn_recall_at_10"):
        met = [ef for ef, f in results["cross_scope"].items() if f[metric] >= GOAL_RECALL]
        print(f"cross-scope {metric} goal {GOAL_RECALL} met from ef_search {min(met) if met else 'none'}")


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    labels, p50, p99 = [], [], []
    clients = results["params"]["clients"]
    for key, label in (
        ("scoped_sql", f"scoped exact\nSQL\n{clients} clients"),
        ("scoped_service_vector_1_client", "scoped exact\nservice, vector\n1 client"),
        ("scoped_service_vector", f"scoped exact\nservice, vector\n{clients} clients"),
        ("scoped_service_hybrid", f"scoped exact\nservice, hybrid\n{clients} clients"),
        ("mem0_sql_1_client", "Mem0 JSONB filter\nSQL\n1 client"),
    ):
        if key not in results:
            continue
        labels.append(label)
        p50.append(results[key]["p50_ms"])
        p99.append(results[key]["p99_ms"])
    x = np.arange(len(labels))
    left.bar(x - 0.2, p50, 0.4, label="p50")
    left.bar(x + 0.2, p99, 0.4, label="p99")
    left.set_yscale("log")
    left.set_xticks(x, labels, fontsize=7)
    left.set_ylabel("ms (log)")
    left.axhline(GOAL_P50_MS, color="grey", ls=":", lw=1)
    left.axhline(GOAL_P99_MS, color="grey", ls="--", lw=1)
    left.set_title(f"Top-10 search, {results['params']['memories']:,} memories")
    left.legend()
    efs = sorted(results["cross_scope"], key=int)
    recall = [results["cross_scope"][e]["recall_at_10"] for e in efs]
    knn = [results["cross_scope"][e]["knn_recall_at_10"] for e in efs]
    latency = [results["cross_scope"][e]["sql_1_client"]["p50_ms"] for e in efs]
    right.plot(latency, recall, marker="o", label="recall@10 by id")
    right.plot(latency, knn, marker="s", label="k-NN recall@10 (ann-benchmarks, eps 1e-3)")
    right.legend(fontsize=8)
    for e, xv, yv in zip(efs, latency, recall, strict=True):
        right.annotate(f"ef={e}", (xv, yv), textcoords="offset points", xytext=(4, -10), fontsize=8)
    right.axhline(GOAL_RECALL, color="grey", ls="--", lw=1)
    right.set_xlabel("p50 latency, ms (SQL, 1 client)")
    right.set_ylabel("recall@10 vs exact")
    p = results["params"]
    right.set_title(
        f"Cross-scope HNSW (m={p.get('hnsw_m', 16)}, ef_construction={p.get('hnsw_ef_construction', 64)})"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--replot":  # --replot FIGURES.json OUT.png
        plot(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--big-users", type=int, default=5)
    parser.add_argument("--big-user-size", type=int, default=50_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per latency measurement")
    parser.add_argument("--inserts", type=int, default=2000)
    parser.add_argument("--cross-queries", type=int, default=200)
    parser.add_argument("--ef-search", type=int, nargs="+", default=[40, 100, 200, 400, 800])
    parser.add_argument("--service-ef-search", type=int, default=200)
    parser.add_argument("--hnsw-m", type=int, default=32, help="as in migration 0002")
    parser.add_argument("--hnsw-ef-construction", type=int, default=128, help="as in migration 0002")
    parser.add_argument(
        "--service-processes", type=int, default=2, help="API-like processes sharing the clients"
    )
    parser.add_argument("--mem0-queries", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    figures = asyncio.run(main(args))
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    if args.plot:
        plot(figures, args.plot)
