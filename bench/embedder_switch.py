"""A tenant's own embedder: one tenant's bank moved to `e5` while another tenant goes on beside it.

Runs `memstore up --workers 2` with the default `onnx` embedder and the `verbatim` writer (one memory a
message, no model call), `MEMSTORE_EMBEDDER_SWITCH_SETTLE_S` short (`--settle`, 2 s; the default 35 s
covers the 30 s for which each process keeps a copy of a tenant's options — no process holds one of
A's here: A makes no request in the minute before its move). Two tenants are made with `memstore
tenants create`: A holds `--memories` memories (10,000) over 100 users, B `--b-memories` (1,000) over
20, both seeded through `apply_ops` (the workers' code path) with the deployment's `onnx` embedder.

1. before: for `--phase-s` seconds, B searches (one client, hybrid, a query every 0.2 s over its users)
   and B writes (a chunk every 0.5 s, one message, each to a fresh user): B's search p50/p99 and its
   chunks' latency from received to applied (the database's timestamps), p50/p99;
2. during: A asks for `e5` (`PATCH /v1/admin/settings`); until the move is over, B goes on as before
   while A searches every 0.5 s (the answers' status and error code are counted) and posts
   `--a-chunks` chunks (20), one every 2 s (they wait, queued); the move's time from the request to its
   end (the audit events' times) and its walk's (from the settle's end), memories re-embedded per
   second, CPU by process, and the claims of A's waiting chunks that were refused (`chunk.outage`);
3. after: B for `--phase-s` again; A's first search answered (200) and when; A's waiting chunks
   applied, and how long after the move's end the last one was.

Checked (exit 1 naming what failed): every chunk acknowledged is applied, once (its message is one
memory of its fresh user); no chunk of A was applied before its move ended; every search of A during
the move answered 409 `embedder_mismatch`, and one after it 200; every one of A's seeded memories has
a new vector, and a sample of them, with every memory its waiting chunks wrote, has the vector `e5`
gives its text; B's seeded vectors are untouched and B's new memories have `onnx`'s.

Usage: python bench/embedder_switch.py [--memories 10000] [--b-memories 1000] [--phase-s 30]
                                       [--a-chunks 20] [--settle 2] [--quick] [--json out.json]
                                       [--env MEMSTORE_X=V ...]
`--quick`: 1,000 memories for A, 200 for B, phases of 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import httpx
import numpy as np
from _stack import (
    CpuByRole,
    add_stack_options,
    bench_parser,
    conclude,
    running_stack,
    settings_of,
    write_figures,
)
from fairness import create_tenant, percentile
from pgvector.asyncpg import register_vector
from sqlalchemy import text

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.domain.memories.services import ApplyLimits, Provenance, apply_ops
from app.embeddings import embedder_from_settings
from app.writers.base import Op, OpKind

A_USERS, B_USERS = 100, 20
SEED_BATCH = 500
# Seeded texts are all different but alike in shape: no near-duplicate check while seeding.
SEED_LIMITS = ApplyLimits(max_ops=SEED_BATCH, duplicate_threshold=1.01)
B_SEARCH_EVERY_S, B_CHUNK_EVERY_S = 0.2, 0.5
A_SEARCH_EVERY_S, A_CHUNK_EVERY_S = 0.5, 2.0
E5_SAMPLE = 64  # of A's seeded memories whose stored vector is compared with e5's for its text
SAME = 0.999  # cosine at or above which two vectors are one model's for one text

WHO = ["My sister", "My manager", "Our neighbour", "My dentist", "My friend Ana", "The landlord"]
WHO += ["My brother", "Our coach", "My grandmother", "My colleague Sam", "The baker", "My cousin"]
DOES = ["is learning", "gave up", "talks a lot about", "recommended", "keeps forgetting", "started"]
DOES += ["is very good at", "dislikes", "spent the summer on", "wants to try", "teaches", "booked"]
WHAT = ["Spanish lessons", "the piano", "rock climbing", "sourdough baking", "chess", "kayaking"]
WHAT += ["a trip to Lisbon", "watercolour painting", "running a marathon", "jazz records", "gardening"]
WHAT += ["a cooking class"]
WHEN = ["since March", "every Tuesday", "last winter", "before the wedding", "after work", "on weekends"]
WHEN += ["this year", "in the evenings", "twice a month", "since the move", "during lunch", "again"]
QUERIES = ["What is my sister learning?", "Who likes chess?", "What did I book?", "hobbies on weekends"]
QUERIES += ["Who teaches the piano?", "What does my manager dislike?", "travel plans", "cooking"]


def statement(i: int) -> str:
    """The i-th seeded memory: a sentence of a chat app's kind, each one different."""
    r = random.Random(i)
    return f"{r.choice(WHO)} {r.choice(DOES)} {r.choice(WHAT)} {r.choice(WHEN)} (note {i})."


def summary_ms(values_s: list[float]) -> dict[str, float]:
    return {
        "n": len(values_s),
        "p50_ms": round(1000 * percentile(values_s, 0.5), 1),
        "p99_ms": round(1000 * percentile(values_s, 0.99), 1),
    }


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@dataclass
class Traffic:
    """What the clients sent and saw, each request labelled with the phase it was sent in."""

    phase: str = "warm-up"
    searches: list[dict[str, Any]] = field(default_factory=list)  # tenant, phase, at, s, status, code
    chunks: list[dict[str, Any]] = field(default_factory=list)  # tenant, phase, at, id, user, text
    stop: dict[str, bool] = field(default_factory=dict)

    async def search_loop(
        self, client: httpx.AsyncClient, tenant: str, headers: dict[str, str], users: int, every_s: float
    ) -> None:
        n = 0
        while not self.stop.get(tenant + "-search"):
            body = {"user_id": f"{tenant}-u{n % users}", "query": QUERIES[n % len(QUERIES)]}
            phase, at = self.phase, time.time()
            started = time.perf_counter()
            response = await client.post("/v1/memories/search", json=body, headers=headers)
            took = time.perf_counter() - started
            code = response.json().get("error", {}).get("code") if response.status_code >= 400 else None
            self.searches.append(
                {"tenant": tenant, "phase": phase, "at": at, "s": took, "status": response.status_code}
                | {"code": code}
            )
            n += 1
            await asyncio.sleep(every_s)  # a client's pace: time itself must pass

    async def chunk_loop(
        self, client: httpx.AsyncClient, tenant: str, headers: dict[str, str], every_s: float, most: int = -1
    ) -> None:
        n = 0
        while not self.stop.get(tenant + "-chunk") and n != most:
            user, content = f"{tenant}-w{n}", f"{statement(1_000_000 + n)} Written by {tenant}."
            phase, at = self.phase, time.time()
            body = {"user_id": user, "messages": [{"role": "user", "content": content}]}
            response = await client.post("/v1/chunks", json=body, headers=headers)
            response.raise_for_status()
            self.chunks.append(
                {"tenant": tenant, "phase": phase, "at": at, "id": uuid.UUID(response.json()["chunk_id"])}
                | {"user": user, "text": content}
            )
            n += 1
            await asyncio.sleep(every_s)


async def seed(settings: Settings, tenants: dict[str, uuid.UUID], sizes: dict[str, tuple[int, int]]) -> float:
    """Each tenant's bank through `apply_ops` with the deployment's embedder; seconds taken."""
    engine = create_engine(settings, application_name="memstore-bench")
    sessionmaker = create_sessionmaker(engine)
    embedder = embedder_from_settings(settings, "onnx")
    provenance = Provenance(actor="worker:bench", writer="bench", model="bench-model")
    started = time.perf_counter()
    offset = 0
    try:
        for tenant, (memories, users) in sizes.items():
            per_user = math.ceil(memories / users)
            for u in range(users):
                count = min(per_user, memories - u * per_user)
                for start in range(0, count, SEED_BATCH):
                    texts = [statement(offset + i) for i in range(start, min(count, start + SEED_BATCH))]
                    async with sessionmaker() as session, session.begin():
                        outcome = await apply_ops(
                            session,
                            tenant_id=tenants[tenant],
                            user_id=f"{tenant}-u{u}",
                            ops=[Op(OpKind.ADD, t) for t in texts],
                            shown={},
                            provenance=provenance,
                            embedder=embedder,
                            limits=SEED_LIMITS,
                        )
                    assert outcome.applied == len(texts), outcome.guards[:3]
                offset += count
        async with engine.connect() as conn:
            autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.execute(text("VACUUM ANALYZE"))
    finally:
        await embedder.aclose()
        await engine.dispose()
    return time.perf_counter() - started


async def vectors_of(
    conn: asyncpg.Connection, tenant_id: uuid.UUID
) -> dict[uuid.UUID, tuple[str, np.ndarray]]:
    rows = await conn.fetch("SELECT id, content, embedding FROM memories WHERE tenant_id = $1", tenant_id)
    return {r["id"]: (r["content"], np.asarray(r["embedding"].to_numpy(), dtype=np.float32)) for r in rows}


async def wait_move(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    conn: asyncpg.Connection,
    tenant_id: uuid.UUID,
    timeout_s: float,
) -> tuple[float, list[dict[str, Any]]]:
    """Poll the tenant's settings until its move is over: when it was seen over, and at each poll the
    memories re-embedded so far (those up to the move's cursor) and the tenant's chunks in a writer's
    hands (which hold the walk's start off)."""
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        now = (await client.get("/v1/admin/settings", headers=headers)).json()
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM memories WHERE tenant_id = $1"
            "   AND id <= (t.settings->'embedder_switch'->>'cursor')::uuid) AS done,"
            " (SELECT count(*) FROM chunks WHERE tenant_id = $1 AND status = 'processing') AS processing,"
            " (SELECT count(*) FROM chunks WHERE tenant_id = $1 AND status = 'queued') AS queued"
            " FROM tenants t WHERE t.id = $1",
            tenant_id,
        )
        seen.append({"at": time.time(), "to": now["embedder_switching_to"]} | dict(row))
        if now["embedder_switching_to"] is None:
            return time.time(), seen
        await asyncio.sleep(0.5)
    msg = f"the move was not over after {timeout_s:.0f} s"
    raise TimeoutError(msg)


async def wait_applied(conn: asyncpg.Connection, ids: list[uuid.UUID], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = await conn.fetchval(
            "SELECT count(*) FROM chunks WHERE id = ANY($1) AND status IN ('queued', 'processing')", ids
        )
        if left == 0:
            return
        await asyncio.sleep(0.5)
    msg = f"chunks still waiting after {timeout_s:.0f} s"
    raise TimeoutError(msg)


def epoch(value: datetime) -> float:
    return value.timestamp()


async def measure(args: argparse.Namespace, problems: list[str]) -> dict[str, Any]:
    env = {
        "MEMSTORE_EMBEDDER": "onnx",
        "MEMSTORE_WRITER": "verbatim",
        "MEMSTORE_EMBEDDER_SWITCH_SETTLE_S": str(args.settle),
        **settings_of(args.env),
    }
    result: dict[str, Any] = {"memories_a": args.memories, "memories_b": args.b_memories}
    result |= {
        "settle_s": args.settle,
        "workers": args.workers,
        "phase_s": args.phase_s,
        "a_chunks": args.a_chunks,
    }
    with running_stack(workers=args.workers, log_level=args.log_level, env_overrides=env) as stack:
        heads = {name: create_tenant(stack, name) for name in ("a", "b")}
        conn = await asyncpg.connect(stack.dsn)
        await register_vector(conn)
        ids = {r["name"]: r["id"] for r in await conn.fetch("SELECT id, name FROM tenants")}
        tenants = {name: ids[name] for name in ("a", "b")}
        settings = Settings(database_url=stack.database_url, embedder="onnx")
        took = await seed(settings, tenants, {"a": (args.memories, A_USERS), "b": (args.b_memories, B_USERS)})
        result["seed_s"] = round(took, 1)
        print(
            f"  seeded {args.memories:,} memories for A, {args.b_memories:,} for B in {took:.0f} s",
            flush=True,
        )
        seeded = {name: await vectors_of(conn, tid) for name, tid in tenants.items()}

        traffic = Traffic()
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
            loops = [
                asyncio.create_task(traffic.search_loop(client, "b", heads["b"], B_USERS, B_SEARCH_EVERY_S)),
                asyncio.create_task(traffic.chunk_loop(client, "b", heads["b"], B_CHUNK_EVERY_S)),
            ]
            await asyncio.sleep(3)  # warm-up: the first requests load what each process loads lazily
            traffic.phase = "before"
            await asyncio.sleep(args.phase_s)

            cpu_before = CpuByRole.snapshot(stack.family())
            asked = await client.patch("/v1/admin/settings", json={"embedder": "e5"}, headers=heads["a"])
            asked.raise_for_status()
            if asked.json()["embedder_switching_to"] != "e5":
                problems.append(f"the PATCH did not start a move: {asked.json()}")
            traffic.phase = "during"
            loops += [
                asyncio.create_task(traffic.search_loop(client, "a", heads["a"], A_USERS, A_SEARCH_EVERY_S)),
                asyncio.create_task(
                    traffic.chunk_loop(client, "a", heads["a"], A_CHUNK_EVERY_S, args.a_chunks)
                ),
            ]
            over_at, seen = await wait_move(client, heads["a"], conn, tenants["a"], args.timeout)
            cpu_move = (CpuByRole.snapshot(stack.family()) - cpu_before).seconds
            traffic.stop["a-chunk"] = True
            traffic.phase = "after"
            await asyncio.sleep(args.phase_s)
            # A's searches go on until one answers.
            deadline = time.monotonic() + 60
            while not any(
                s["tenant"] == "a" and s["phase"] == "after" and s["status"] == 200 for s in traffic.searches
            ):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            traffic.stop |= {"a-search": True, "b-search": True, "b-chunk": True}
            await asyncio.gather(*loops)
            final = (await client.get("/v1/admin/settings", headers=heads["a"])).json()
        ack = [c["id"] for c in traffic.chunks]
        await wait_applied(conn, ack, 180)

        # The move's times, the database's: when it was asked for and when it ended.
        events = {
            r["action"]: epoch(r["created_at"])
            for r in await conn.fetch(
                "SELECT action, created_at FROM audit_events"
                " WHERE tenant_id = $1 AND action LIKE 'tenant.embedder%'",
                tenants["a"],
            )
        }
        asked_at, ended_at = events["tenant.embedder_set"], events["tenant.embedder_switched"]
        walk_s = ended_at - (asked_at + args.settle)
        # The first poll that saw a batch committed, and the memories re-embedded by then: the walk's
        # rate from there to the end is the embedder's, whatever held its start off.
        first = next((p for p in seen if p["done"]), None)
        after_first = (args.memories - first["done"]) / (ended_at - first["at"]) if first else math.nan
        refusals = sum(
            '"chunk.outage"' in line for line in stack.log_file.read_text(errors="replace").splitlines()
        )
        move = {
            "total_s": round(ended_at - asked_at, 1),
            "walk_s": round(walk_s, 1),
            "memories_per_s": round(args.memories / walk_s, 1),
            "first_batch_seen_after_ask_s": round(first["at"] - asked_at, 1) if first else None,
            "memories_per_s_after_first_batch": round(after_first, 1),
            "a_chunk_claims_refused": refusals,
            "a_chunks_processing_seen": sum(1 for p in seen if p["processing"]),
            "a_chunks_queued_at_end": seen[-1]["queued"],
            "seen_over_after_s": round(over_at - ended_at, 2),
            "cpu_s_by_process": {k: round(v, 1) for k, v in sorted(cpu_move.items())},
            "worker_cpu_ms_per_memory": round(1000 * cpu_move.get("worker", 0.0) / args.memories, 1),
            "settings_after": {"embedder": final["embedder"], "switching_to": final["embedder_switching_to"]},
            "polls": len(seen),
        }
        result["move"] = move
        if (final["embedder"], final["embedder_switching_to"]) != ("e5", None):
            problems.append(f"A's settings after the move: {final}")

        rows = await conn.fetch(
            "SELECT c.id, c.status, c.attempts, extract(epoch FROM c.received_at) AS received,"
            " extract(epoch FROM c.applied_at) AS applied,"
            " (SELECT count(*) FROM memories m WHERE m.tenant_id = c.tenant_id AND m.user_id = c.user_id"
            "   AND m.content = c.messages->0->>'content') AS memories"
            " FROM chunks c WHERE c.id = ANY($1)",
            ack,
        )
        by_id = {r["id"]: r for r in rows}
        for chunk in traffic.chunks:
            row = by_id.get(chunk["id"])
            if row is None or row["status"] != "applied" or row["memories"] != 1:
                problems.append(
                    f"chunk {chunk['id']} of {chunk['tenant']}: {dict(row) if row else 'missing'}"
                )
                continue
            chunk["latency_s"] = float(row["applied"]) - float(row["received"])
            chunk["applied_at"] = float(row["applied"])
        early = [c for c in traffic.chunks if c["tenant"] == "a" and c.get("applied_at", math.inf) < ended_at]
        if early:
            problems.append(f"{len(early)} of A's chunks were applied before its move ended")

        result["b"] = {}
        for phase in ("before", "during", "after"):
            searches = [s for s in traffic.searches if s["tenant"] == "b" and s["phase"] == phase]
            bad = [s for s in searches if s["status"] != 200]
            if bad:
                problems.append(f"{len(bad)} of B's searches {phase} did not answer 200: {bad[:3]}")
            chunks = [
                c for c in traffic.chunks if c["tenant"] == "b" and c["phase"] == phase and "latency_s" in c
            ]
            result["b"][phase] = {
                "search": summary_ms([s["s"] for s in searches if s["status"] == 200]),
                "chunk": summary_ms([c["latency_s"] for c in chunks]),
            }

        a_during = [s for s in traffic.searches if s["tenant"] == "a" and s["phase"] == "during"]
        codes: dict[str, int] = {}
        for s in a_during:
            key = f"{s['status']} {s['code']}" if s["code"] else str(s["status"])
            codes[key] = codes.get(key, 0) + 1
        # A search sent before the move ended but answered after it may answer 200: only those sent
        # while the move was seen under way by the settings' poll before them count.
        refused_during = [s for s in a_during if s["at"] + s["s"] < ended_at]
        wrong = [s for s in refused_during if (s["status"], s["code"]) != (409, "embedder_mismatch")]
        if wrong:
            problems.append(f"{len(wrong)} of A's searches during the move were not 409 embedder_mismatch")
        a_after = [s for s in traffic.searches if s["tenant"] == "a" and s["phase"] == "after"]
        first_ok = next((s for s in traffic.searches if s["tenant"] == "a" and s["status"] == 200), None)
        if first_ok is None:
            problems.append("no search of A answered 200 after its move")
        a_chunks = [c for c in traffic.chunks if c["tenant"] == "a" and "applied_at" in c]
        result["a"] = {
            "searches_during": codes,
            "searches_during_move_all_refused": not wrong,
            "searches_after": len(a_after),
            "first_200_after_end_s": round(first_ok["at"] + first_ok["s"] - ended_at, 2)
            if first_ok
            else None,
            "first_200_latency_ms": round(1000 * first_ok["s"], 1) if first_ok else None,
            "search_after": summary_ms([s["s"] for s in a_after if s["status"] == 200]),
            "chunks_posted_during": len([c for c in traffic.chunks if c["tenant"] == "a"]),
            "chunks_applied": len(a_chunks),
            "last_chunk_applied_after_end_s": (
                round(max(c["applied_at"] for c in a_chunks) - ended_at, 1) if a_chunks else None
            ),
            "chunk_attempts": sorted({int(by_id[c["id"]]["attempts"]) for c in a_chunks}),
        }

        # The vectors: A's all new, a sample of them and its chunks' memories e5's; B's untouched.
        now = {name: await vectors_of(conn, tid) for name, tid in tenants.items()}
        await conn.close()
        unchanged_a = [i for i, (_, v) in seeded["a"].items() if cosine(now["a"][i][1], v) >= SAME]
        if unchanged_a:
            problems.append(f"{len(unchanged_a)} of A's memories kept their onnx vector")
        moved_b = [i for i, (_, v) in seeded["b"].items() if cosine(now["b"][i][1], v) < SAME]
        if moved_b:
            problems.append(f"{len(moved_b)} of B's seeded memories changed their vector")
        written = {c["text"] for c in traffic.chunks if c["tenant"] == "a"}
        sample = random.Random(0).sample(sorted(seeded["a"]), min(E5_SAMPLE, len(seeded["a"])))
        sample += [i for i, (content, _) in now["a"].items() if content in written]
        b_written = {c["text"] for c in traffic.chunks if c["tenant"] == "b"}
        b_sample = [i for i, (content, _) in now["b"].items() if content in b_written][:E5_SAMPLE]
        agreement = {}
        for name, model, picked in (("a", "e5", sample), ("b", "onnx", b_sample)):
            embedder = embedder_from_settings(settings, model)
            try:
                want = await embedder.embed([now[name][i][0] for i in picked])
            finally:
                await embedder.aclose()
            cos = [
                cosine(now[name][i][1], np.asarray(w, dtype=np.float32))
                for i, w in zip(picked, want, strict=True)
            ]
            agreement[name] = {"model": model, "compared": len(cos), "min_cosine": round(min(cos), 6)}
            if min(cos) < SAME:
                problems.append(
                    f"{name}: {sum(c < SAME for c in cos)} of {len(cos)} vectors are not {model}'s"
                )
        result["vectors"] = agreement | {"a_unchanged": len(unchanged_a), "b_changed": len(moved_b)}
    return result


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(result: dict[str, Any]) -> None:
    b, a, move = result["b"], result["a"], result["move"]
    print(f"\n  B ({result['memories_b']:,} memories): search and write path, p50 / p99 in ms (n)")
    print("  | phase | search | chunk received → applied |")
    print("  | --- | --- | --- |")
    for phase in ("before", "during", "after"):
        s, c = b[phase]["search"], b[phase]["chunk"]
        search, chunk = (
            f"{s['p50_ms']} / {s['p99_ms']} ({s['n']})",
            f"{c['p50_ms']} / {c['p99_ms']} ({c['n']})",
        )
        print(f"  | {phase} | {search} | {chunk} |")
    p50 = {phase: (b[phase]["search"]["p50_ms"], b[phase]["chunk"]["p50_ms"]) for phase in b}
    print(
        f"  during / before, p50: search {ratio(p50['during'][0], p50['before'][0])},"
        f" chunk {ratio(p50['during'][1], p50['before'][1])}"
    )
    print(f"\n  A ({result['memories_a']:,} memories) moved onnx → e5, settle {result['settle_s']:g} s")
    print("  | figure | value |")
    print("  | --- | --- |")
    rows = [
        ("the move, asked → over (audit events)", f"{move['total_s']} s"),
        ("its walk, settle's end → over", f"{move['walk_s']} s = {move['memories_per_s']} memories/s"),
        (
            "CPU s during the move, by process",
            ", ".join(f"{k} {v}" for k, v in move["cpu_s_by_process"].items()),
        ),
        ("first batch committed, seen after the ask", f"{move['first_batch_seen_after_ask_s']} s"),
        ("rate from the first batch to the end", f"{move['memories_per_s_after_first_batch']} memories/s"),
        ("workers' CPU per memory re-embedded", f"{move['worker_cpu_ms_per_memory']} ms"),
        ("A's chunk claims refused meanwhile (chunk.outage)", str(move["a_chunk_claims_refused"])),
        (
            "polls that saw a chunk of A in a writer's hands",
            f"{move['a_chunks_processing_seen']} of {move['polls']}",
        ),
        ("A's searches during the move", ", ".join(f"{k}: {v}" for k, v in a["searches_during"].items())),
        (
            "A's first 200 after the move's end",
            f"{a['first_200_after_end_s']} s (it took {a['first_200_latency_ms']} ms)",
        ),
        (
            "A's searches after, p50 / p99",
            f"{a['search_after']['p50_ms']} / {a['search_after']['p99_ms']} ms ({a['search_after']['n']})",
        ),
        (
            "A's chunks posted during the move / applied",
            f"{a['chunks_posted_during']} / {a['chunks_applied']}",
        ),
        ("A's last waiting chunk applied after the move's end", f"{a['last_chunk_applied_after_end_s']} s"),
        ("attempts counted on A's waiting chunks", str(a["chunk_attempts"])),
    ]
    for name, value in rows:
        print(f"  | {name} | {value} |")
    v = result["vectors"]
    print(
        f"\n  vectors: A {v['a']['compared']} compared with e5's (min cosine {v['a']['min_cosine']}),"
        f" {v['a_unchanged']} of {result['memories_a']:,} left as seeded; B {v['b']['compared']} new ones"
        f" compared with onnx's (min cosine {v['b']['min_cosine']}), {v['b_changed']} seeded ones changed"
    )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--memories", type=int, default=10_000, help="tenant A's memories (moved)")
    parser.add_argument("--b-memories", type=int, default=1_000, help="tenant B's memories")
    parser.add_argument("--phase-s", type=float, default=30.0, help="seconds of B's traffic before and after")
    parser.add_argument(
        "--a-chunks",
        type=int,
        default=20,
        help="chunks A posts during its move, one every 2 s (-1: until the move is over)",
    )
    parser.add_argument("--settle", type=float, default=2.0, help="MEMSTORE_EMBEDDER_SWITCH_SETTLE_S")
    parser.add_argument("--timeout", type=float, default=1800.0, help="longest the move may take")
    parser.add_argument(
        "--quick", action="store_true", help="1,000 memories for A, 200 for B, phases of 10 s"
    )
    add_stack_options(parser, workers=2, log_level="WARNING")
    args = parser.parse_args()
    if args.quick:
        args.memories, args.b_memories, args.phase_s = 1_000, 200, 10.0
    print(
        f"A tenant's move to e5: A {args.memories:,} memories, B {args.b_memories:,}; {args.workers} workers,"
        f" settle {args.settle:g} s",
        flush=True,
    )
    problems: list[str] = []
    result = asyncio.run(measure(args, problems))
    report(result)
    write_figures(result, args.json)
    conclude(problems, "every chunk applied once, A's searches refused during its move only, vectors checked")


if __name__ == "__main__":
    main()
