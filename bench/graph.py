"""What a row of the vector graph costs the indexer, and what the graph finds, by kind of graph.

The cross-scope HNSW graph is filled by the workers' indexer (`memstore_index_graph`, migrations 0011
and 0012), so its insert cost is CPU the write path pays a little later, for every memory the graph
takes. This compares graphs on one synthetic bank (`bench/search.py`'s: 384-dim vectors around facets
of topics, users of skewed sizes, rows in random arrival order), each built afresh over the same rows:

- build time over the bank (`CREATE INDEX`, one parallel worker);
- the indexer's cost per row: `--inserts` held-out rows added through `memstore_index_graph` in its
  batches of 64, as CPU seconds of that Postgres backend (from /proc), not wall time;
- cross-scope recall@10 against numpy brute force (by id, and ann-benchmarks' k-NN recall: a result
  counts if within 1e-3 of the true 10th's distance), the worst query, and latency, by ef_search;
- the index's size.

A graph is `kind:m:ef_construction`: `vector` indexes the stored float32 vectors, `halfvec` the
expression `embedding::halfvec(384)` (half the bytes per element; queries cast alike); `none` is no
graph at all, the cost of the indexer's mark itself (its cross-scope "search" is an exact scan).

Usage: python bench/graph.py [--memories 100000] [--users 1000] [--big-users 2] [--big-user-size 10000]
                             [--graphs none,vector:32:128,vector:32:64,vector:24:128,halfvec:32:128]
                             [--inserts 1000] [--cross-queries 200] [--ef-search 100 200] [--json out]
Needs the `bench` extra (numpy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import psutil
from pgvector.asyncpg import register_vector
from search import DIM, for_bulk_loads, log, recall_at_10, synthetic_bank

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.db.migrate import upgrade
from app.lib.embedded import EmbeddedPostgres

BATCH = 64  # the indexer's batch (`graph_index_batch`)


def graph_sql(kind: str, m: int, ef_construction: int) -> tuple[str, str]:
    """(CREATE INDEX, cross-scope query) for a graph of this kind."""
    column, ops, query = "embedding", "vector_cosine_ops", "embedding <=> $1"
    if kind == "none":  # no graph: what the indexer's mark costs a row without it (an exact scan)
        scan = f"SELECT id, {query} AS distance FROM memories WHERE tenant_id = $2 ORDER BY 2 LIMIT 10"
        return "SELECT 1", scan
    if kind == "halfvec":
        column, ops = f"(embedding::halfvec({DIM}))", "halfvec_cosine_ops"
        query = f"embedding::halfvec({DIM}) <=> $1::vector::halfvec({DIM})"
    elif kind != "vector":
        msg = f"unknown graph kind {kind!r} (vector or halfvec)"
        raise SystemExit(msg)
    create = (
        f"CREATE INDEX bench_graph ON memories USING hnsw ({column} {ops}) "
        f"WITH (m = {m}, ef_construction = {ef_construction}) WHERE status = 'active' AND in_graph"
    )
    select = (
        f"SELECT id, {query} AS distance FROM memories WHERE tenant_id = $2 AND status = 'active' "
        f"AND in_graph AND embedding IS NOT NULL ORDER BY {query} LIMIT 10"
    )
    return create, select


async def measure_graph(
    conn: asyncpg.Connection,
    spec: str,
    args: argparse.Namespace,
    tenant_id: uuid.UUID,
    held_out: list[uuid.UUID],
    cross: list[tuple[np.ndarray, set[uuid.UUID], float]],
) -> dict[str, Any]:
    kind, _, sizes = spec.partition(":")
    m, _, efc = sizes.partition(":")
    create, select = graph_sql(kind, int(m or 0), int(efc or 0))
    log(f"{spec}: building")
    started = time.perf_counter()
    await conn.execute(create)
    result: dict[str, Any] = {"graph": spec, "build_s": round(time.perf_counter() - started, 1)}
    log(f"  built in {result['build_s']} s; the indexer adds {len(held_out)} rows")

    backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))
    cpu_before, wall_before = sum(backend.cpu_times()[:2]), time.perf_counter()
    added = 0
    while added < len(held_out):
        count = await conn.fetchval("SELECT memstore_index_graph($1, '', $2)", tenant_id, BATCH)
        if not count:
            break
        added += count
    cpu = sum(backend.cpu_times()[:2]) - cpu_before
    result["indexer_rows"] = added
    result["indexer_cpu_ms_per_row"] = round(1000 * cpu / max(1, added), 3)
    result["indexer_wall_ms_per_row"] = round(1000 * (time.perf_counter() - wall_before) / max(1, added), 3)
    size = await conn.fetchval("SELECT pg_relation_size(to_regclass('bench_graph'))")
    result["index_mb"] = round((size or 0) / 2**20)
    log(f"  {result['indexer_cpu_ms_per_row']} ms of CPU a row; {result['index_mb']} MB")

    result["cross_scope"] = {}
    for ef in args.ef_search:
        result["cross_scope"][ef] = await recall_at_10(conn, select, tenant_id, ef, cross)
        log(f"  ef_search {ef}: {result['cross_scope'][ef]}")

    await conn.execute("DROP INDEX IF EXISTS bench_graph")
    await conn.execute("UPDATE memories SET in_graph = false WHERE id = ANY($1::uuid[])", held_out)
    await conn.execute("VACUUM memories")
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(42)
    data_dir = Path(tempfile.mkdtemp(prefix="memstore-bench-graph-"))
    pg = EmbeddedPostgres(data_dir / "pg")
    pg.start()
    results: dict[str, Any] = {"params": vars(args).copy(), "graphs": []}
    try:
        await asyncio.to_thread(upgrade, pg.url())
        conn = await asyncpg.connect(pg.dsn())
        await register_vector(conn)
        results["pgvector"] = await for_bulk_loads(conn, maintenance_work_mem="2GB")
        await conn.execute("DROP INDEX ix_memories_embedding_hnsw")
        tenant_id = uuid.uuid4()
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 'bench')", tenant_id)

        log(f"generating {args.memories:,} memories over {args.users:,} users")
        bank = synthetic_bank(rng, args.memories, args.users, args.big_users, args.big_user_size)
        ids = [uuid.uuid4() for _ in range(args.memories)]
        # The last rows to arrive are held out of each build: the indexer adds them.
        held = set(bank.order[-args.inserts :].tolist())
        held_out = [ids[i] for i in sorted(held)]
        records = (
            (ids[i], tenant_id, f"user-{bank.owner[i]:05d}", f"note {i}", bank.vectors[i], i not in held)
            for i in bank.order
        )
        columns = ["id", "tenant_id", "user_id", "content", "embedding", "in_graph"]
        await conn.copy_records_to_table("memories", records=records, columns=columns)
        await conn.execute("VACUUM ANALYZE memories")

        cross = []
        for u in rng.integers(0, args.users, size=args.cross_queries):
            q = bank.query_for(rng, int(u))
            scores = bank.vectors @ q
            top = np.argpartition(-scores, 10)[:10]
            cross.append((q, {ids[j] for j in top}, 1.0 - float(scores[top].min())))

        for spec in args.graphs.split(","):
            results["graphs"].append(await measure_graph(conn, spec, args, tenant_id, held_out, cross))
        await conn.close()
    finally:
        pg.stop()
    return results


def print_table(results: dict[str, Any]) -> None:
    efs = results["params"]["ef_search"]
    print(f"\npgvector {results['pgvector']}, {results['params']['memories']:,} memories")
    header = "| graph | build | indexer CPU / row | size |"
    header += "".join(f" recall@10 (k-NN, min) ef {ef} | p50 ef {ef} |" for ef in efs)
    print(header)
    print("|" + " --- |" * (4 + 2 * len(efs)))
    for g in results["graphs"]:
        line = f"| {g['graph']} | {g['build_s']} s | {g['indexer_cpu_ms_per_row']} ms | {g['index_mb']} MB |"
        for ef in efs:
            c = g["cross_scope"][ef]
            line += (
                f" {c['recall_at_10']} ({c['knn_recall_at_10']}, {c['min_recall']}) |"
                f" {c['sql_1_client']['p50_ms']} ms |"
            )
        print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--big-users", type=int, default=2)
    parser.add_argument("--big-user-size", type=int, default=10_000)
    parser.add_argument("--graphs", default="none,vector:32:128,vector:32:64,vector:24:128,halfvec:32:128")
    parser.add_argument("--inserts", type=int, default=1_000)
    parser.add_argument("--cross-queries", type=int, default=200)
    parser.add_argument("--ef-search", type=int, nargs="+", default=[100, 200])
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    figures = asyncio.run(main(arguments))
    print_table(figures)
    if arguments.json:
        arguments.json.write_text(json.dumps(figures, indent=2, default=str))
