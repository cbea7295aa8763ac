"""History and undo: restore a 10,000-memory bank, revert one changeset, list 1,000 memories as of a time.

On a fresh `memstore up --workers 0`, banks are seeded through `apply_ops` (the code path workers
write with, hashing embedder, writer changesets of 500 ops), then measured over HTTP with the admin key:

- restore: user `big` has `--memories` memories, all added before a time T0 and all rewritten after
  it. `POST /v1/admin/users/big/restore {"as_of": T0}` changes every memory (a new RESTORE version
  each); the next run restores to the time before the previous restore, so every run writes
  `--memories` versions. Wall time of the request, `--restore-runs` runs.
- revert: user `mid` has 1,000 memories and `--reverts` later writer changesets, each updating one
  memory; each is reverted with `POST /v1/admin/changesets/{id}/revert`. Request latency p50/p90/p99.
- as_of list: `GET /v1/memories?user_id=mid&as_of=T&limit=1000` (1,000 memories as they stood before
  the updates), `--list-runs` times. Request latency p50/p90/p99.

The seeded database is vacuumed and analysed before measuring, and the reverts and listings run
before the restores, so no figure pays for the autovacuum and checkpoints that writing tens of
thousands of versions sets off.

No write above inserts into the vector graph (and no worker runs the indexer here); last, the indexer's
work they left is timed: every head written, added to the graph in its default batches.

Goals: restore of 10,000 <= 1 s; revert p50 <= 20 ms; as_of list of 1,000 <= 50 ms.

Usage: python bench/history.py [--memories 10000] [--restore-runs 5] [--reverts 200] [--list-runs 50]
                               [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from _stack import running_stack
from sqlalchemy import text

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.domain.accounts.repositories import TenantRepository
from app.domain.memories.services import ApplyLimits, Provenance, Shown, apply_ops
from app.domain.search.graph import index_graph
from app.embeddings import HashingEmbedder
from app.writers.base import Op, OpKind

BATCH = 500
LIMITS = ApplyLimits(max_ops=BATCH, duplicate_threshold=1.01)  # synthetic texts: no near-duplicate check
WORDS = [
    "tea",
    "jazz",
    "chess",
    "hiking",
    "python",
    "lyon",
    "seattle",
    "mia",
    "sushi",
    "piano",
    "rust",
    "tennis",
    "opera",
    "kayak",
]


def fact(i: int, round_: int) -> str:
    first, second = WORDS[i % len(WORDS)], WORDS[(i // 7) % len(WORDS)]
    return f"Fact {i}: the user likes {first} and {second} (round {round_})."


class Seeder:
    def __init__(self, database_url: str) -> None:
        self.engine = create_engine(Settings(database_url=database_url), application_name="memstore-bench")
        self.sessionmaker = create_sessionmaker(self.engine)
        self.embedder = HashingEmbedder(384)
        self.tenant_id: uuid.UUID | None = None

    async def start(self) -> None:
        async with self.sessionmaker() as session:
            tenant = await TenantRepository(session).get_by_name("default")
        assert tenant is not None
        self.tenant_id = tenant.id

    async def now(self) -> datetime:
        async with self.sessionmaker() as session:
            value = await session.scalar(text("SELECT clock_timestamp()"))
        assert isinstance(value, datetime)
        return value

    async def apply(self, user: str, ops: list[Op], shown: dict[int, Shown]) -> uuid.UUID:
        assert self.tenant_id is not None
        async with self.sessionmaker() as session, session.begin():
            outcome = await apply_ops(
                session,
                tenant_id=self.tenant_id,
                user_id=user,
                ops=ops,
                shown=shown,
                provenance=Provenance(actor="worker:bench", writer="bench", model="bench-model"),
                embedder=self.embedder,
                limits=LIMITS,
            )
        assert outcome.applied == len(ops), outcome.guards[:3]
        return outcome.changeset_id

    async def heads(self, user: str) -> list[tuple[uuid.UUID, int]]:
        async with self.sessionmaker() as session:
            rows = await session.execute(
                text("SELECT id, version FROM memories WHERE user_id = :u ORDER BY created_at, id"),
                {"u": user},
            )
            return [(r[0], r[1]) for r in rows]

    async def add(self, user: str, count: int) -> None:
        for start in range(0, count, BATCH):
            await self.apply(
                user, [Op(OpKind.ADD, fact(i, 0)) for i in range(start, min(count, start + BATCH))], {}
            )

    async def rewrite(self, user: str, memories: list[tuple[uuid.UUID, int]], round_: int) -> list[uuid.UUID]:
        """Rewrite each memory once, `BATCH` per changeset; returns the changesets."""
        changesets = []
        for start in range(0, len(memories), BATCH):
            part = memories[start : start + BATCH]
            ops = [Op(OpKind.UPDATE, fact(start + j, round_), (j,)) for j in range(len(part))]
            changesets.append(await self.apply(user, ops, {j: Shown(m, v) for j, (m, v) in enumerate(part)}))
        return changesets

    async def vacuum(self) -> None:
        """What autovacuum would get to soon after seeding; done now so it runs during no measurement."""
        async with self.engine.connect() as conn:
            autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.execute(text("VACUUM ANALYZE"))

    async def close(self) -> None:
        await self.engine.dispose()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "runs": len(values),
        "p50_ms": round(statistics.median(values) * 1000, 1),
        "p90_ms": round(pct(values, 0.9) * 1000, 1),
        "p99_ms": round(pct(values, 0.99) * 1000, 1),
        "min_ms": round(min(values) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


async def measure(
    args: argparse.Namespace, base_url: str, headers: dict[str, str], seeder: Seeder
) -> dict[str, Any]:
    await seeder.start()
    started = time.perf_counter()
    await seeder.add("big", args.memories)
    t0 = await seeder.now()
    await seeder.rewrite("big", await seeder.heads("big"), 1)
    await seeder.add("mid", 1000)
    t_mid = await seeder.now()
    mid = await seeder.heads("mid")
    reverts: list[uuid.UUID] = []
    for i in range(args.reverts):
        memory_id, version = mid[i % len(mid)]
        reverts.append(
            await seeder.apply(
                "mid", [Op(OpKind.UPDATE, fact(i, 2 + i), (0,))], {0: Shown(memory_id, version)}
            )
        )
        mid[i % len(mid)] = (memory_id, version + 1)
    await seeder.vacuum()
    print(f"seeded in {time.perf_counter() - started:.1f} s", flush=True)

    results: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as client:
        times = []
        for changeset_id in reversed(reverts):  # newest first: no conflicts
            t = time.perf_counter()
            response = await client.post(f"/v1/admin/changesets/{changeset_id}/revert", json={})
            times.append(time.perf_counter() - t)
            response.raise_for_status()
        results["revert"] = summary(times)

        times, count = [], 0
        params = {"user_id": "mid", "as_of": t_mid.isoformat(), "limit": "1000"}
        for _ in range(args.list_runs):
            t = time.perf_counter()
            response = await client.get("/v1/memories", params=params)
            times.append(time.perf_counter() - t)
            response.raise_for_status()
            count = len(response.json()["items"])
        results["as_of_list"] = summary(times) | {"items": count}
        # Restore: alternate between T0 and the moment before the previous restore.
        times, changed, target = [], [], t0
        for _ in range(args.restore_runs):
            before = await seeder.now()
            t = time.perf_counter()
            response = await client.post("/v1/admin/users/big/restore", json={"as_of": target.isoformat()})
            times.append(time.perf_counter() - t)
            response.raise_for_status()
            changed.append(len(response.json()["diff"]))
            target = before
        results["restore"] = summary(times) | {"memories_changed": changed}

    # What the graph pays later for what the writes above did not, where the tenant's searches go through
    # it (or with `graph_index_all`): the workers' indexer adding every head written since
    # (`search.graph`, its default batch), timed here in one go.
    started = time.perf_counter()
    batch = Settings().graph_index_batch
    indexed = await index_graph(seeder.engine, batch=batch, budget_s=3600, everything=True)
    took = time.perf_counter() - started
    results["graph_catch_up"] = {
        "rows": indexed,
        "s": round(took, 2),
        "ms_per_row": round(1000 * took / max(1, indexed), 2),
    }
    return results


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with running_stack(workers=0, log_level=args.log_level) as stack:
        seeder = Seeder(stack.database_url)
        try:
            return await measure(args, stack.base_url, stack.admin_headers, seeder)
        finally:
            await seeder.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--memories", type=int, default=10_000, help="memories in the restored bank")
    parser.add_argument("--restore-runs", type=int, default=5)
    parser.add_argument("--reverts", type=int, default=200, help="single-changeset reverts to time")
    parser.add_argument("--list-runs", type=int, default=50)
    parser.add_argument("--log-level", default="WARNING", help="MEMSTORE_LOG_LEVEL of the service")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    r, v, a = results["restore"], results["revert"], results["as_of_list"]
    print(f"\nrestore of {args.memories:,} memories (each run changes {r['memories_changed']}):")
    print(f"  p50 {r['p50_ms']} ms  min {r['min_ms']} ms  max {r['max_ms']} ms   goal <= 1000 ms")
    print(f"revert of one changeset, {v['runs']} runs:")
    print(f"  p50 {v['p50_ms']} ms  p90 {v['p90_ms']} ms  p99 {v['p99_ms']} ms   goal p50 <= 20 ms")
    print(f"as_of list of {a['items']:,} memories, {a['runs']} runs:")
    print(f"  p50 {a['p50_ms']} ms  p90 {a['p90_ms']} ms  p99 {a['p99_ms']} ms   goal <= 50 ms")
    g = results["graph_catch_up"]
    print(
        f"then the indexer added {g['rows']:,} heads to the vector graph in {g['s']} s "
        f"({g['ms_per_row']} ms each)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
