"""One Postgres beside a local Citus cluster (a coordinator and two workers), back to back in one run.

Each side is a fresh `memstore up --workers 0` (`--citus-workers 2` for the cluster) with the offline
writer and the `hashing` embedder, so the CPU goes to the database path, and `--tenants` tenants (20:
their rows spread over both workers). On each, in this order:

- counts, the apply: each tenant's users post fact-stating chunks (each one an ADD or a SUPERSEDE, the
  whole apply path), applied by a worker's code in this process (`workers.settings.startup`, the fair
  scheduler's turns, 32 slots, so the group commit batches several tenants as a busy worker's does).
  Counted at the client (`tests/support/round_trips.PostgresLedger`): SQL statements and asyncpg round
  trips per applied chunk; on the cluster also the commands the coordinator sent to the workers for
  those sessions (`citus.log_remote_commands`), by kind, among them the two-phase commit's;
- counts, ingestion: the same for `POST /v1/chunks`, the app in this process (`create_app`), 64
  requests at once over the tenants, so the group commit batches several tenants;
- write path: a backlog of such chunks, then 2 worker processes started: applied chunks/s from the
  first apply on (as `bench/pipeline.py`'s drain; for at most `--window` seconds), and CPU ms per chunk
  by process, each Postgres server apart (coordinator, worker-1, worker-2);
- scoped search: p50 / p99 of `POST /v1/memories/search`, hybrid and vector, one client, over the
  users the counts wrote (every chunk of theirs applied; the workers stopped first), and CPU ms per
  search by process: a search is routed to one shard, so on the cluster this is the cost of a hop;
- ingestion: wrk at 64 connections on `POST /v1/chunks` (`bench/ingest.py`'s script), a key drawn per
  request from the tenants': acknowledged chunks/s, p50 / p99, CPU ms per acknowledged chunk.

Sides alternate (single, cluster, single, cluster for `--rounds 2`), and each figure is given with the
ratio cluster / single of the same round: the machine is shared, so only ratios within a run count. A
cluster on one machine measures the cluster's overhead (hops from the coordinator to a worker, two-phase
commit when a transaction spans nodes), not its scale.

Usage: python bench/cluster.py [--quick] [--rounds 2] [--tenants 20] [--workers 2] [--users 1000]
                               [--window 20] [--json out.json]
Needs the Citus build (`make citus`) and wrk. 20 minutes on 2 busy cores, most of it the cluster's apply
while its statements reach every shard (`--quick --rounds 1`: 6).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
from _stack import GONE, Stack, bench_parser, cpu_seconds, role_of, running_stack, write_figures
from ingest import count_chunks, parse_wrk, run_wrk, write_lua
from pipeline import Chunk, post_all, progress, synthetic_chunks, wait_for
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_
from writer import machine_busy, machine_cpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.domain.accounts.services import create_tenant
from app.domain.pipeline.jobs import WorkerContext, run_turn
from app.lib.embedded import citus_bin_dir
from app.lib.queue import create_redis
from app.server.asgi import create_app
from tests.support.round_trips import PostgresLedger, statement_label
from workers.settings import shutdown, startup

SIDES = (("single", 0), ("cluster", 2))
SLOTS = 32  # a worker process's concurrent jobs (MEMSTORE_WORKER_MAX_JOBS' default)
QUESTIONS = [
    "where does the user live?",
    "what is the user allergic to?",
    "which instrument is the user learning?",
    "what is the user's dog called?",
    "which airline does the user fly with?",
    "when is the sister's wedding?",
]


@dataclass(frozen=True)
class Size:
    """How much each side does: `--quick` or the full run."""

    count_users: int  # per tenant, for the counts
    count_chunks: int  # per user
    drain_users: int  # per tenant, for the write path
    drain_chunks: int  # per user
    searches: int  # per mode
    wrk_s: float

    @classmethod
    def of(cls, quick: bool) -> Size:
        if quick:
            return cls(count_users=1, count_chunks=5, drain_users=2, drain_chunks=15, searches=100, wrk_s=5)
        return cls(count_users=2, count_chunks=5, drain_users=4, drain_chunks=30, searches=300, wrk_s=10)


INGEST_CONCURRENCY = 64  # requests in flight when ingestion is counted (wrk's connections)


@dataclass(frozen=True)
class TenantKey:
    tenant_id: str
    key: str


# --- the coordinator's remote commands ------------------------------------------------------------

_SHARD = re.compile(r"\b([a-z_]+)_[0-9]{6,}\b")
_LEADING = (
    "PREPARE TRANSACTION",
    "COMMIT PREPARED",
    "ROLLBACK PREPARED",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SET",
    "SAVEPOINT",
    "RELEASE SAVEPOINT",
)


def remote_label(message: str) -> str:
    """A remote command by kind: the transaction's own (BEGIN, PREPARE TRANSACTION …), a COPY of rows
    the coordinator moves (an intermediate result, or an INSERT … SELECT it could not push down), or a
    statement's verb and tables with the shard suffixes taken off (`INSERT INTO chunks`)."""
    text = " ".join(message.removeprefix("issuing ").split())
    upper = text.upper()
    for kind in _LEADING:
        if upper.startswith(kind):
            return kind
    if upper.startswith("COPY"):
        if "insert_select_" in text:
            return "COPY (an INSERT … SELECT's rows, through the coordinator)"
        if "format result" in text:
            return "COPY (an intermediate result, to a worker)"
    return statement_label(_SHARD.sub(r"\1", text.replace("public.", "")))


class RemoteCommands:
    """What a Citus coordinator sends to its workers for one engine's sessions, as it reports each
    command (`citus.log_remote_commands`) to the session that caused it. Each is one command sent to a
    worker (several statements of one message count once)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine.sync_engine
        self.commands: list[tuple[str, str]] = []  # (label, node)
        # The coordinator's connections to workers these commands went over: (session, Citus's id).
        self.connections: set[tuple[int, str]] = set()
        # Made before the ledger, so that on a connection's first checkout the SET goes out before the
        # ledger counts anything on it.
        event.listen(self.engine, "checkout", self._on_checkout)

    def close(self) -> None:
        event.remove(self.engine, "checkout", self._on_checkout)

    def reset(self) -> None:
        self.commands.clear()
        self.connections.clear()

    def _on_checkout(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.get("remote_commands"):
            return
        record.info["remote_commands"] = True
        connection = dbapi_connection._connection  # asyncpg's, under SQLAlchemy's adapter
        connection.add_log_listener(self._on_message)
        await_(connection.execute("SET citus.log_remote_commands = on; SET client_min_messages = log"))

    def _on_message(self, connection: Any, message: Any) -> None:
        text = str(message.message)
        if text.startswith("issuing"):
            detail = str(message.detail or "")
            if "connectionId: " in detail:
                self.connections.add((id(connection), detail.rsplit("connectionId: ", 1)[1]))
            server = detail.split("on server ", 1)[1].split(" ", 1)[0] if "on server " in detail else "?"
            node = Path(server.split("@", 1)[-1].rsplit(":", 1)[0]).name
            self.commands.append((remote_label(text), node))


# --- one side ------------------------------------------------------------------------------------


def facts(prefix: str, users: int, per_user: int, seed: int) -> dict[str, list[Chunk]]:
    """`users` users each stating `per_user` facts (`bench/pipeline.py`'s synthetic turns)."""
    base = synthetic_chunks(users=users, per_user=per_user, seed=seed)
    return {
        f"{prefix}-{i}": [{**chunk, "user_id": f"{prefix}-{i}"} for chunk in chunks]
        for i, chunks in enumerate(base.values())
    }


async def post_facts(
    stack: Stack, tenants: list[TenantKey], prefix: str, users: int, per_user: int
) -> tuple[int, float]:
    """Each tenant's users post their facts (batches, one lane a tenant, all tenants at once)."""
    started = time.perf_counter()
    posted = await asyncio.gather(
        *(
            post_all(stack, t.key, facts(prefix, users, per_user, seed=i), concurrency=1, batch_size=100)
            for i, t in enumerate(tenants)
        )
    )
    errors = [p.first_error for p in posted if p.failed_batches]
    if errors:
        msg = f"posting {prefix} chunks failed: {errors[0]}"
        raise RuntimeError(msg)
    return sum(p.accepted for p in posted), time.perf_counter() - started


def settings_for(stack: Stack) -> Settings:
    return Settings(
        database_url=stack.service_url,
        admin_database_url=stack.database_url,
        redis_url=stack.redis_url,
        embedder="hashing",
        writer="offline",
        graph_index_budget_s=0.0,  # the graph's indexer: a task beside the jobs, not their path
        log_level="WARNING",
        log_format="console",
    )


async def make_tenants(stack: Stack, n: int) -> tuple[list[TenantKey], dict[str, int]]:
    """`n` tenants with their admin keys; on a cluster, how many tenants each worker holds."""
    engine = create_engine(settings_for(stack).as_owner(), application_name="memstore-bench")
    try:
        sessionmaker = create_sessionmaker(engine)
        tenants = []
        for i in range(n):
            async with sessionmaker() as session, session.begin():
                tenant, key = await create_tenant(session, f"bench-{i:02d}")
            tenants.append(TenantKey(str(tenant.id), key))
    finally:
        await engine.dispose()
    placement: dict[str, int] = {}
    if stack.citus_workers:
        conn = await asyncpg.connect(stack.dsn)
        try:
            rows = await conn.fetch(
                "SELECT n.nodename, count(*) AS tenants FROM unnest($1::uuid[]) AS t(id)"
                " JOIN pg_dist_placement p"
                "   ON p.shardid = get_shard_id_for_distribution_column('chunks', t.id)"
                " JOIN pg_dist_node n USING (groupid) GROUP BY n.nodename ORDER BY n.nodename",
                [t.tenant_id for t in tenants],
            )
        finally:
            await conn.close()
        placement = {Path(r["nodename"]).name: int(r["tenants"]) for r in rows}
    return tenants, placement


async def apply_in_process(ctx: WorkerContext, conn: asyncpg.Connection, timeout_s: float = 300) -> int:
    """Turns on the scopes the fair scheduler gives, up to `SLOTS` at once, until nothing is queued."""
    running: set[asyncio.Task[dict[str, Any]]] = set()
    applied = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for turn in await ctx["scheduler"].take(SLOTS - len(running)):
            running.add(asyncio.create_task(run_turn(ctx, turn)))
        if running:
            done, running = await asyncio.wait(running, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
            applied += sum(int(task.result().get("applied", 0)) for task in done)
            continue
        if (await progress(conn)).pending == 0:
            return applied
        await asyncio.sleep(0.05)  # the API makes a scope ready after its commit
    msg = f"chunks still queued after {timeout_s:.0f} s"
    raise TimeoutError(msg)


def ledger_figures(ledger: PostgresLedger, remote: RemoteCommands | None, done: int) -> dict[str, Any]:
    """Statements, round trips and (on a cluster) remote commands per chunk, of `done` chunks."""
    per = max(1, done)
    result: dict[str, Any] = {
        "chunks": done,
        "statements_per_chunk": len(ledger.statements) / per,
        "round_trips_per_chunk": len(ledger.wire) / per,
        "transactions_per_chunk": ledger.transactions() / per,
        "round_trips": dict(Counter(ledger.wire).most_common()),
    }
    if remote is not None:
        kinds = Counter(label for label, _ in remote.commands)
        nodes = Counter(node for _, node in remote.commands)
        result |= {
            "remote_commands_per_chunk": len(remote.commands) / per,
            "two_phase_commits_per_chunk": kinds["PREPARE TRANSACTION"] / per,
            # Citus numbers a session's connections to the workers as it opens them: each id seen is
            # a connection used (opened, unless the session had it from before the count began).
            "worker_connections_per_chunk": len(remote.connections) / per,
            "remote_commands": dict(kinds.most_common()),
            "remote_commands_by_node": dict(sorted(nodes.items())),
        }
    return result


async def count_ingest(stack: Stack, tenants: list[TenantKey], size: Size) -> dict[str, Any]:
    """Statements, round trips and (on a cluster) remote commands per acknowledged `POST /v1/chunks`,
    the app in this process and event loop, `INGEST_CONCURRENCY` requests at once over every tenant's
    users (so the group commit batches several tenants, as under wrk)."""
    settings = settings_for(stack).model_copy(update={"rate_limit_per_s": 0.0, "user_rate_limit_per_s": 0.0})
    app = create_app(settings, configure_logs=False)
    async with (
        app.lifespan(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://memstore") as api,
    ):
        engine = app.state.services.engine
        remote = RemoteCommands(engine) if stack.citus_workers else None
        ledger = PostgresLedger(engine)
        try:
            await post_one_by_one(api, tenants, "ingest-warm", 1, 1)
            ledger.reset()
            if remote is not None:
                remote.reset()
            acknowledged = await post_one_by_one(api, tenants, "ingest", size.count_users, size.count_chunks)
            return ledger_figures(ledger, remote, acknowledged)
        finally:
            ledger.close()
            if remote is not None:
                remote.close()


async def post_one_by_one(
    api: httpx.AsyncClient, tenants: list[TenantKey], prefix: str, users: int, per_user: int
) -> int:
    """Every tenant's facts, a request a chunk, `INGEST_CONCURRENCY` in flight; acknowledged count."""
    slots = asyncio.Semaphore(INGEST_CONCURRENCY)

    async def post(tenant: TenantKey, chunk: Chunk) -> bool:
        async with slots:
            headers = {"Authorization": f"Bearer {tenant.key}"}
            return (await api.post("/v1/chunks", json=chunk, headers=headers)).status_code == 202

    posts = [
        post(t, chunk)
        for i, t in enumerate(tenants)
        for chunks in facts(prefix, users, per_user, seed=i).values()
        for chunk in chunks
    ]
    return sum(await asyncio.gather(*posts))


async def count_apply(stack: Stack, tenants: list[TenantKey], size: Size) -> dict[str, Any]:
    """Statements, round trips and (on a cluster) remote commands per applied chunk."""
    settings = settings_for(stack)
    ctx: WorkerContext = {"settings": settings, "redis": create_redis(str(settings.redis_url))}
    await startup(ctx)
    remote = RemoteCommands(ctx["engine"]) if stack.citus_workers else None
    ledger = PostgresLedger(ctx["engine"])
    conn = await asyncpg.connect(stack.dsn)
    try:
        # A warm-up (a chunk per tenant), so statements are prepared and the tenants' options cached.
        await post_facts(stack, tenants, "warm", 1, 1)
        await apply_in_process(ctx, conn)
        ledger.reset()
        if remote is not None:
            remote.reset()
        posted, _ = await post_facts(stack, tenants, "count", size.count_users, size.count_chunks)
        applied = await apply_in_process(ctx, conn)
    finally:
        await conn.close()
        ledger.close()
        if remote is not None:
            remote.close()
        await shutdown(ctx)
        await ctx["redis"].aclose()
    return {"posted": posted} | ledger_figures(ledger, remote, applied)


def postgres_node(proc: psutil.Process) -> str:
    """The Postgres server a process belongs to, by its postmaster's data directory (`pg`,
    `coordinator`, `worker-1` …)."""
    with contextlib.suppress(psutil.Error):
        for candidate in (proc, proc.parent()):
            cmd = candidate.cmdline() if candidate else []
            if "-D" in cmd:
                return Path(cmd[cmd.index("-D") + 1]).name
    return "postgres"


def cpu_by_place(stack: Stack) -> dict[str, float]:
    """CPU seconds so far by kind of process, each Postgres server apart (`postgres:<node>`)."""
    procs = stack.family()
    for worker in stack.extra:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(worker.pid))
    seconds: dict[str, float] = {}
    for proc in procs:
        role = role_of(proc)
        if role == GONE:
            continue
        place = f"postgres:{postgres_node(proc)}" if role == "postgres" else role
        seconds[place] = seconds.get(place, 0.0) + cpu_seconds([proc])
    return seconds


async def drain(
    stack: Stack, tenants: list[TenantKey], size: Size, workers: int, window_s: float
) -> dict[str, Any]:
    """A backlog of facts, then `workers` worker processes: applied/s from the first apply until the
    backlog is drained or `window_s` has passed, and CPU per chunk over the same span."""
    posted, post_s = await post_facts(stack, tenants, "drain", size.drain_users, size.drain_chunks)
    conn = await asyncpg.connect(stack.dsn)

    async def finished() -> int:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM chunks WHERE status IN ('applied', 'failed') AND user_id LIKE 'drain-%'"
            )
        )

    try:
        await wait_for(conn, posted, done="queued", timeout_s=120)
        for _ in range(workers):
            stack.start_worker()
        # From the first apply on: a worker's start-up (imports, connections) is not the path.
        while (first := await finished()) == 0:
            await asyncio.sleep(0.05)
        cpu_before, machine_before, started = cpu_by_place(stack), machine_cpu(), time.monotonic()
        done = first
        while done < posted and time.monotonic() - started < window_s:
            await asyncio.sleep(0.1)
            done = await finished()
        seconds = time.monotonic() - started
        cpu_after, machine_after = cpu_by_place(stack), machine_cpu()
        failed = await conn.fetchval(
            "SELECT count(*) FROM chunks WHERE status = 'failed' AND user_id LIKE 'drain-%'"
        )
    finally:
        await conn.close()
    chunks = done - first
    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in sorted(cpu_after.items())}
    return {
        "posted": posted,
        "posted_per_s": posted / post_s,
        "drained": done == posted,
        "chunks": chunks,
        "failed": int(failed),
        "seconds": seconds,
        "applied_per_s": chunks / seconds if seconds else float("nan"),
        "cpu_ms_per_chunk": {k: 1e3 * v / max(1, chunks) for k, v in cpu.items()},
        "machine_cpu_busy": machine_busy(machine_before, machine_after),
    }


async def search(stack: Stack, tenants: list[TenantKey], size: Size) -> dict[str, Any]:
    """Scoped search over HTTP, one client, hybrid and vector taking turns, over the users whose chunks
    the counts applied (each has its memories on both sides)."""
    scopes = [(t, f"count-{u}") for t in tenants for u in range(size.count_users)]
    latencies: dict[str, list[float]] = {"hybrid": [], "vector": []}
    empty = 0
    cpu_before: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as client:
        for i in range(size.searches + 20):
            if i == 20:
                cpu_before = cpu_by_place(stack)
            tenant, user = scopes[i % len(scopes)]
            for mode, times in latencies.items():
                body = {"user_id": user, "query": QUESTIONS[i % len(QUESTIONS)], "mode": mode}
                started = time.perf_counter()
                response = await client.post(
                    "/v1/memories/search", json=body, headers={"Authorization": f"Bearer {tenant.key}"}
                )
                elapsed = 1e3 * (time.perf_counter() - started)
                response.raise_for_status()
                if i >= 20:  # the first 20 warm the connections and caches
                    times.append(elapsed)
                    empty += not response.json()["results"]
    cpu = cpu_by_place(stack)
    searches = sum(len(t) for t in latencies.values())
    return {
        mode: {"n": len(t), "p50_ms": statistics.median(t), "p99_ms": sorted(t)[int(0.99 * (len(t) - 1))]}
        for mode, t in latencies.items()
    } | {
        "empty_results": empty,
        # Both modes together: each search one transaction, its statements routed to one shard.
        "cpu_ms_per_search": {
            k: 1e3 * (v - cpu_before.get(k, 0.0)) / searches for k, v in sorted(cpu.items())
        },
    }


def ingestion(stack: Stack, tenants: list[TenantKey], size: Size, users: int) -> dict[str, Any]:
    """wrk on `POST /v1/chunks` with the tenants' keys: acknowledged chunks/s, latency, rows durable."""
    script = stack.data_dir.parent / "post_chunk.lua"
    write_lua(script, key=[t.key for t in tenants], users=users)
    url = f"{stack.base_url}/v1/chunks"
    wrk = {"threads": 2, "connections": 64, "script": script}
    run_wrk(url, duration_s=2, **wrk)  # warm-up
    time.sleep(0.5)
    rows_before = asyncio.run(count_chunks(stack.dsn))
    machine_before, cpu_before = machine_cpu(), cpu_by_place(stack)
    result = parse_wrk("POST /v1/chunks", run_wrk(url, duration_s=size.wrk_s, **wrk))
    busy, cpu_after = machine_busy(machine_before, machine_cpu()), cpu_by_place(stack)
    time.sleep(1.0)
    rows = asyncio.run(count_chunks(stack.dsn)) - rows_before
    return {
        "accepted_per_s": result.ok_per_s,
        "p50_ms": result.p50_ms,
        "p90_ms": result.p90_ms,
        "p99_ms": result.p99_ms,
        "errors": result.non_2xx + result.socket_errors,
        "acknowledged": result.ok,
        "acknowledged_not_durable": max(0, result.ok - rows),
        "machine_cpu_busy": busy,
        "cpu_ms_per_chunk": {
            k: 1e3 * (v - cpu_before.get(k, 0.0)) / max(1, result.ok) for k, v in sorted(cpu_after.items())
        },
    }


def one_side(name: str, citus_workers: int, args: argparse.Namespace, size: Size) -> dict[str, Any]:
    print(f"\n[{time.strftime('%H:%M:%S')}] {name}: starting ...", flush=True)
    started = time.monotonic()
    env = {"MEMSTORE_EMBEDDER": "hashing", "MEMSTORE_WRITER": "offline"}
    with running_stack(
        workers=0, log_level="WARNING", env_overrides=env, citus_workers=citus_workers
    ) as stack:
        ready_s = time.monotonic() - started
        tenants, placement = asyncio.run(make_tenants(stack, args.tenants))
        counts = asyncio.run(count_apply(stack, tenants, size))
        print(f"  counts, apply: {_counts_line(counts)}", flush=True)
        ingest_counts = asyncio.run(count_ingest(stack, tenants, size))
        print(f"  counts, ingestion: {_counts_line(ingest_counts)}", flush=True)
        written = asyncio.run(drain(stack, tenants, size, args.workers, args.window))
        print(
            f"  write path: {written['applied_per_s']:.1f} applied/s ({written['chunks']} chunks"
            f" in {written['seconds']:.1f} s{'' if written['drained'] else ', backlog left'})",
            flush=True,
        )
        stack.stop_workers()
        searched = asyncio.run(search(stack, tenants, size))
        print(
            f"  search p50: hybrid {searched['hybrid']['p50_ms']:.2f} ms,"
            f" vector {searched['vector']['p50_ms']:.2f} ms",
            flush=True,
        )
        ingested = ingestion(stack, tenants, size, args.users)
        print(
            f"  ingestion: {ingested['accepted_per_s']:.0f} chunks/s, p99 {ingested['p99_ms']:.1f} ms",
            flush=True,
        )
    return {
        "side": name,
        "citus_workers": citus_workers,
        "ready_s": ready_s,
        "tenants_by_worker": placement,
        "counts": counts,
        "ingest_counts": ingest_counts,
        "write_path": written,
        "search": searched,
        "ingestion": ingested,
    }


def _counts_line(counts: dict[str, Any]) -> str:
    line = (
        f"{counts['statements_per_chunk']:.2f} statements, {counts['round_trips_per_chunk']:.2f} round trips"
        f" per chunk ({counts['chunks']} chunks)"
    )
    if "remote_commands_per_chunk" in counts:
        line += (
            f"; {counts['remote_commands_per_chunk']:.2f} remote commands,"
            f" {counts['two_phase_commits_per_chunk']:.2f} PREPARE TRANSACTION"
        )
    return line


# --- report --------------------------------------------------------------------------------------

FIGURES: list[tuple[str, str, int]] = [
    # (label, path into a side's result, digits)
    ("ingestion: acknowledged chunks/s", "ingestion.accepted_per_s", 0),
    ("ingestion: p50 ms", "ingestion.p50_ms", 1),
    ("ingestion: p99 ms", "ingestion.p99_ms", 1),
    ("ingestion: Postgres CPU ms/chunk, all servers", "ingestion.postgres_cpu_ms", 2),
    ("write path: applied chunks/s", "write_path.applied_per_s", 1),
    ("write path: Postgres CPU ms/chunk, all servers", "write_path.postgres_cpu_ms", 2),
    ("write path: worker CPU ms/chunk", "write_path.cpu_ms_per_chunk.worker", 2),
    ("search hybrid: p50 ms", "search.hybrid.p50_ms", 2),
    ("search vector: p50 ms", "search.vector.p50_ms", 2),
    ("search hybrid: p99 ms", "search.hybrid.p99_ms", 2),
    ("search vector: p99 ms", "search.vector.p99_ms", 2),
    ("search: Postgres CPU ms/search, all servers", "search.postgres_cpu_ms", 2),
    ("apply: statements / chunk", "counts.statements_per_chunk", 2),
    ("apply: round trips / chunk", "counts.round_trips_per_chunk", 2),
    ("apply: remote commands / chunk", "counts.remote_commands_per_chunk", 2),
    ("apply: PREPARE TRANSACTION / chunk", "counts.two_phase_commits_per_chunk", 3),
    ("apply: connections to workers used / chunk", "counts.worker_connections_per_chunk", 2),
    ("ingestion: statements / chunk", "ingest_counts.statements_per_chunk", 2),
    ("ingestion: round trips / chunk", "ingest_counts.round_trips_per_chunk", 2),
    ("ingestion: remote commands / chunk", "ingest_counts.remote_commands_per_chunk", 2),
    ("ingestion: PREPARE TRANSACTION / chunk", "ingest_counts.two_phase_commits_per_chunk", 3),
    ("ingestion: connections to workers used / chunk", "ingest_counts.worker_connections_per_chunk", 2),
]


def lookup(result: dict[str, Any], path: str) -> float:
    value: Any = result
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return float("nan")
        value = value[part]
    return float(value)


def fmt(value: float, digits: int) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"


def report(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table: each figure per round on each side, and the ratio cluster / single of each round."""
    cpu_figures = (
        ("write_path", "cpu_ms_per_chunk"),
        ("ingestion", "cpu_ms_per_chunk"),
        ("search", "cpu_ms_per_search"),
    )
    for run in runs:
        for phase, key in cpu_figures:
            cpu = run[phase][key]
            run[phase]["postgres_cpu_ms"] = sum(v for k, v in cpu.items() if k.startswith("postgres"))
    singles = [r for r in runs if not r["citus_workers"]]
    clusters = [r for r in runs if r["citus_workers"]]
    rows = []
    print(f"\n  {'figure':<48} {'single':>20} {'cluster':>20} {'cluster/single':>18}")
    for label, path, digits in FIGURES:
        a = [lookup(r, path) for r in singles]
        b = [lookup(r, path) for r in clusters]
        ratios = [y / x if x else float("nan") for x, y in zip(a, b, strict=False)]
        rows.append({"figure": label, "single": a, "cluster": b, "ratios": ratios})
        print(
            f"  {label:<48} {' / '.join(fmt(v, digits) for v in a):>20}"
            f" {' / '.join(fmt(v, digits) for v in b):>20} {' / '.join(fmt(v, 2) for v in ratios):>18}"
        )
    for title, phase, key in (
        ("ingestion, CPU ms per acknowledged chunk", "ingestion", "cpu_ms_per_chunk"),
        ("write path, CPU ms per applied chunk", "write_path", "cpu_ms_per_chunk"),
        ("search, CPU ms per search", "search", "cpu_ms_per_search"),
    ):
        print(f"\n  {title} by process (each round):")
        for run in runs:
            cpu = run[phase][key]
            print(f"    {run['side']:<8} " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if v >= 0.005))
    for run in clusters[:1]:
        print(f"\n  cluster: tenants by worker {run['tenants_by_worker']}")
        for what, key in (("applied", "counts"), ("acknowledged", "ingest_counts")):
            counts = run[key]
            per = max(1, counts["chunks"])
            print(
                f"  remote commands per {what} chunk by node {counts['remote_commands_by_node']}"
                f" ({counts['chunks']} chunks), by kind:"
            )
            for label, n in counts["remote_commands"].items():
                print(f"    {n / per:7.2f}  {label}")
    return rows


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run: fewer chunks, searches, seconds")
    parser.add_argument("--rounds", type=int, default=2, help="times each side runs, alternating")
    parser.add_argument(
        "--tenants", type=int, default=20, help="tenants (their rows spread over the workers)"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes for the write path")
    parser.add_argument("--users", type=int, default=1000, help="users per tenant the ingestion posts for")
    parser.add_argument(
        "--window", type=float, help="most seconds the write path is timed (default 20; 10 with --quick)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if citus_bin_dir() is None:
        print(
            "no Citus build: `make citus CITUS_SRC=<Citus source tree>` (docs/operations.md)", file=sys.stderr
        )
        sys.exit(2)
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install wrk", file=sys.stderr)
        sys.exit(2)
    size = Size.of(args.quick)
    args.window = args.window or (10.0 if args.quick else 20.0)
    load_before = os.getloadavg()
    print(
        f"single Postgres against Citus (coordinator + 2 workers): {args.tenants} tenants, "
        f"{args.rounds} round(s), {'quick' if args.quick else 'full'}; {os.cpu_count()} CPUs, "
        f"load {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}",
        flush=True,
    )
    started = time.monotonic()
    runs = [one_side(name, n, args, size) for _ in range(args.rounds) for name, n in SIDES]
    rows = report(runs)
    load_after = os.getloadavg()
    print(
        f"\n  {time.monotonic() - started:.0f} s in all; load before {load_before[0]:.2f}, "
        f"after {load_after[0]:.2f} (1 min)"
    )
    write_figures(
        {
            "settings": vars(args) | {"size": size.__dict__, "cpus": os.cpu_count()},
            "load_before": load_before,
            "load_after": load_after,
            "table": rows,
            "runs": runs,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
