"""Soak: the whole service under steady mixed traffic for N minutes — does anything leak, lag, reorder
or get lost while undos run, a user is purged and a worker is killed?

Runs `memstore up` (embedded Postgres + Redis, migrations, the API, `--workers` worker processes) as an
operator would, with the `openai` writer (the `simple` profile: one model call per chunk) pointed at
the fake model server in its own process, answering every call after `--latency` seconds, and the
`hashing` embedder by default (`--embedder onnx` for the packaged model: on two cores its CPU competes
with everything else, and a saturated machine measures the machine, not the service). Then, for
`--minutes`:

- `--users` users post chunks (`POST /v1/chunks`) at `--rate` chunks/s in all, in turn; each user's
  chunks one after another, numbered by the user (`metadata.soak_seq`, also in the text), retried with
  the same `Idempotency-Key` on a 5xx or a lost connection;
- searches (`POST /v1/memories/search`) of random users at `--search-rate` per second;
- every `--undo-every-s` seconds an undo with the admin key, by turns: revert a user's latest writer
  changeset (`POST /v1/admin/changesets/{id}/revert`) or restore a user's bank as it was a moment ago
  (`POST /v1/admin/users/{user_id}/restore`); a 409 (a conflict with a later write) is an answer;
- at `--purge-at` of the run, one user erased (`DELETE /v1/admin/users/{user_id}?purge=true`), one
  with a chunk waiting when there is one; it keeps posting afterwards (its numbering starts again);
- at `--kill-at` of the run, one worker process killed with SIGKILL. `memstore up`'s supervisor starts
  a dead child again; the script waits `--restart-wait-s` for a new worker and starts one itself if
  none came (the report says which happened).

Every `--sample-s` seconds it reads each process's resident memory by role (api, worker, supervisor,
postgres, redis, fake model: RSS, and USS — the pages a process alone holds, which shared buffers do
not inflate), the Postgres connections (`pg_stat_activity`, by application) and the queue. When the
traffic stops it waits (up to `--drain-timeout-s`) for the queue to drain and reports: chunks
acknowledged against applied / failed / lost (the purged user's chunks acknowledged before its purge
left out; they must be gone), chunks applied out of order within a user (by `applied_at` and by their
changesets' `created_at` against the user's numbering; chunks applied together tie), chunks applied
twice, the lag from acknowledgement to applied (p50 / p99) and the post latency per `--window-s` window,
HTTP answers by route (5xx and requests that got no answer counted apart), and memory and connections
after the warm-up against the end of the traffic, with each role's peak RSS and USS trend (MiB per
minute, fitted over the samples; the killed worker's replacement's first samples left out: after the
kill the worker's end figure is a younger process's). Postgres's RSS, summed over its processes, counts
the shared buffers once per backend that touched them; its USS is the figure to watch. The fake model server
keeps every request it was sent, so its own growth is the harness's, not the service's.

Prints a table, writes `--json` and, when matplotlib is installed (the `bench` extra), `--plot`.
Exits 1 if a chunk was lost, failed, applied out of order or twice, the purged user's chunks remained,
or a request got a 5xx or no answer: the script is itself a check.

Usage: python bench/soak.py [--minutes 30] [--users 300] [--rate 15] [--search-rate 2] [--latency 0.2]
                            [--workers 1] [--embedder hashing] [--undo-every-s R] [--purge-at 0.35]
                            [--kill-at 0.5] [--warmup-s W] [--sample-s S] [--window-s 60]
                            [--json out.json] [--plot out.png] [--env MEMSTORE_X=V ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import math
import os
import random
import signal
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
from _stack import (
    GONE,
    FakeModelServer,
    Stack,
    add_stack_options,
    bench_parser,
    conclude,
    role_of,
    running_stack,
    settings_of,
    write_figures,
)

FINISHED = ("applied", "failed")
POST_TRIES = 5
EXAMPLES = 5  # of each kind of problem, in the report
BENCH_APP = "bench-soak"  # application_name of this script's connections, left out of the counts

# Routes as the report names them (the API's route templates).
POST_CHUNK = "POST /v1/chunks"
SEARCH = "POST /v1/memories/search"
LIST_CHANGESETS = "GET /v1/admin/changesets"
REVERT = "POST /v1/admin/changesets/{id}/revert"
RESTORE = "POST /v1/admin/users/{user_id}/restore"
PURGE = "DELETE /v1/admin/users/{user_id}"


# --- the traffic -----------------------------------------------------------------------------------


@dataclass
class Ack:
    """One acknowledged chunk, as the client saw it."""

    user: str
    soak_seq: int
    acked_at: float  # epoch seconds, when the 202 arrived
    post_s: float  # the post's latency, retries included
    server_seq: int
    purged: bool = False  # acknowledged before its user was purged


@dataclass
class Traffic:
    """What the clients sent and what they got back."""

    users: list[str]
    acks: dict[str, Ack] = field(default_factory=dict)  # by chunk id
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)  # (route, status) -> n
    no_answer: Counter[str] = field(default_factory=Counter)  # route -> requests without a response
    examples: list[str] = field(default_factory=list)  # the first 5xx and transport errors
    events: list[dict[str, Any]] = field(default_factory=list)  # undo, purge, kill, as they happened
    unacknowledged: int = 0  # chunks given up after POST_TRIES
    purged: set[str] = field(default_factory=set)
    next_seq: Counter[str] = field(default_factory=Counter)
    locks: dict[str, asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))

    def some_user(self, rng: random.Random) -> str:
        """A user with an acknowledged chunk, never a purged one (any user before the first ack)."""
        posted = sorted({a.user for a in self.acks.values()} - self.purged)
        return rng.choice(posted or self.users)

    def note_problem(self, text: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(text)


async def call(
    client: httpx.AsyncClient, traffic: Traffic, route: str, method: str, url: str, **kwargs: Any
) -> httpx.Response | None:
    """One request, its answer counted under `route`; None when no answer came."""
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        traffic.no_answer[route] += 1
        traffic.note_problem(f"{route}: no answer ({exc!r})")
        return None
    traffic.answers[route, response.status_code] += 1
    if response.status_code >= 500:
        traffic.note_problem(f"{route}: {response.status_code} {response.text[:300]}")
    return response


def chunk_body(user: str, seq: int, rng: random.Random) -> dict[str, Any]:
    """A chunk the `simple` profile turns into one memory; the user's number in text and metadata."""
    box = rng.randrange(1000)
    return {
        "user_id": user,
        "messages": [
            {"role": "user", "content": f"Note {seq} of {user}: I keep item {box} in box {seq % 17}."},
            {"role": "assistant", "content": "Noted."},
        ],
        "metadata": {"soak_seq": seq},
    }


async def post_chunk(client: httpx.AsyncClient, traffic: Traffic, user: str, rng: random.Random) -> None:
    """Post the user's next chunk once its previous one is acknowledged; retry as a careful client
    would (same Idempotency-Key) on a 5xx, a 429 or no answer."""
    async with traffic.locks[user]:
        traffic.next_seq[user] += 1
        seq = traffic.next_seq[user]
        body = chunk_body(user, seq, rng)
        headers = {"Idempotency-Key": f"soak-{user}-{seq}"}
        started = time.time()
        for attempt in range(POST_TRIES):
            response = await call(
                client, traffic, POST_CHUNK, "POST", "/v1/chunks", json=body, headers=headers
            )
            if response is not None and response.status_code in (200, 202):
                answer = response.json()
                traffic.acks[answer["chunk_id"]] = Ack(
                    user, seq, time.time(), time.time() - started, int(answer["seq"])
                )
                return
            if response is not None and response.status_code < 500 and response.status_code != 429:
                traffic.note_problem(f"{POST_CHUNK}: {response.status_code} {response.text[:300]}")
                break
            await asyncio.sleep(0.5 * 2**attempt)
        traffic.unacknowledged += 1


async def search(client: httpx.AsyncClient, traffic: Traffic, user: str, rng: random.Random) -> None:
    query = {"user_id": user, "query": f"where is item {rng.randrange(1000)}", "top_k": 5}
    await call(client, traffic, SEARCH, "POST", "/v1/memories/search", json=query)


async def paced(rate: float, until: float, launch: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Start `launch()` `rate` times a second on a fixed schedule until `until` (monotonic), not
    waiting for the earlier ones: a slow answer does not slow the offered load."""
    if rate <= 0:
        return
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    for i in itertools.count():
        at = start + i / rate
        if at >= until:
            break
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        task = asyncio.create_task(launch())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)


# --- undo, purge, kill -----------------------------------------------------------------------------


async def revert_latest(
    client: httpx.AsyncClient, traffic: Traffic, admin: dict[str, str], rng: random.Random
) -> dict[str, Any]:
    """Revert a user's latest writer changeset still applied."""
    user = traffic.some_user(rng)
    listed = await call(
        client,
        traffic,
        LIST_CHANGESETS,
        "GET",
        "/v1/admin/changesets",
        params={"user_id": user, "kind": "writer", "limit": 5},
        headers=admin,
    )
    if listed is None or listed.status_code != 200:
        return {"kind": "revert", "user": user, "status": None if listed is None else listed.status_code}
    applied = [c for c in listed.json()["items"] if c["status"] == "applied"]
    if not applied:
        return {"kind": "revert", "user": user, "status": "nothing to revert"}
    changeset = applied[0]["id"]
    response = await call(
        client,
        traffic,
        REVERT,
        "POST",
        f"/v1/admin/changesets/{changeset}/revert",
        json={"reason": "soak: undo the latest write"},
        headers=admin,
    )
    return {
        "kind": "revert",
        "user": user,
        "changeset_id": changeset,
        **_outcome(response),
    }


async def restore_recent(
    client: httpx.AsyncClient, traffic: Traffic, admin: dict[str, str], rng: random.Random, back_s: float
) -> dict[str, Any]:
    """Restore a user's bank as it was `back_s` seconds ago."""
    user = traffic.some_user(rng)
    as_of = (datetime.now(UTC) - timedelta(seconds=back_s)).isoformat()
    response = await call(
        client,
        traffic,
        RESTORE,
        "POST",
        f"/v1/admin/users/{user}/restore",
        json={"as_of": as_of, "reason": "soak: restore a moment ago"},
        headers=admin,
    )
    return {"kind": "restore", "user": user, "as_of": as_of, **_outcome(response)}


def _outcome(response: httpx.Response | None) -> dict[str, Any]:
    if response is None:
        return {"status": None}
    outcome: dict[str, Any] = {"status": response.status_code}
    if response.status_code == 200:
        outcome["memories_changed"] = len(response.json().get("diff", []))
    else:
        with contextlib.suppress(ValueError):
            outcome["error"] = response.json().get("code")
    return outcome


async def purge_user(
    client: httpx.AsyncClient,
    traffic: Traffic,
    admin: dict[str, str],
    db: asyncpg.Pool,
    rng: random.Random,
) -> dict[str, Any]:
    """Erase a user, one with a chunk waiting if there is one (a worker may be applying it); its chunks
    acknowledged so far are marked purged. The user's lock is held so no post of it is in flight: each
    of its chunks is plainly before or after the purge."""
    waiting = [
        r["user_id"]
        for r in await db.fetch(
            "SELECT DISTINCT user_id FROM chunks"
            " WHERE status IN ('queued', 'processing') AND user_id = ANY($1)",
            traffic.users,
        )
    ]
    user = rng.choice(sorted(waiting)) if waiting else traffic.some_user(rng)
    traffic.purged.add(user)
    async with traffic.locks[user]:
        before = [a for a in traffic.acks.values() if a.user == user]
        unfinished = await db.fetchval(
            "SELECT count(*) FROM chunks WHERE user_id = $1 AND status IN ('queued', 'processing')", user
        )
        response = await call(
            client,
            traffic,
            PURGE,
            "DELETE",
            f"/v1/admin/users/{user}",
            params={"purge": "true"},
            headers=admin,
        )
        if response is not None and response.status_code == 200:
            for ack in before:
                ack.purged = True
        return {
            "kind": "purge",
            "user": user,
            "acknowledged_before": len(before),
            "unfinished_before": int(unfinished),
            "status": None if response is None else response.status_code,
            "deleted": response.json().get("deleted") if response is not None and response.content else None,
        }


async def kill_worker(stack: Stack, db: asyncpg.Pool, wait_s: float) -> dict[str, Any]:
    """SIGKILL one worker; wait for the supervisor to start another, else start one ourselves."""
    workers = stack.processes("worker")
    if not workers:
        return {"kind": "kill", "status": "no worker found"}
    victim = workers[0]
    processing = [str(r["id"]) for r in await db.fetch("SELECT id FROM chunks WHERE status = 'processing'")]
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    others = {p.pid for p in workers[1:]}
    restarted_by = "nobody"
    new_pid = None
    while time.monotonic() - killed_at < wait_s:
        fresh = [p.pid for p in stack.processes("worker") if p.pid != victim.pid and p.pid not in others]
        if fresh:
            restarted_by, new_pid = "supervisor", fresh[0]
            break
        await asyncio.sleep(0.1)
    if new_pid is None:
        restarted_by, new_pid = "bench", stack.start_worker().pid
    return {
        "kind": "kill",
        "killed_pid": victim.pid,
        "processing_at_kill": processing,
        "restarted_by": restarted_by,
        "new_pid": new_pid,
        "restart_after_s": round(time.monotonic() - killed_at, 2),
    }


async def run_events(
    schedule: list[tuple[float, Callable[[], Awaitable[dict[str, Any]]]]], traffic: Traffic, t0: float
) -> None:
    """Run each event at its time (seconds after `t0`, monotonic), one after another."""
    for at, event in sorted(schedule, key=lambda e: e[0]):
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        began = time.monotonic()
        outcome = await event()
        outcome |= {"at_s": round(began - t0, 1), "took_s": round(time.monotonic() - began, 2)}
        traffic.events.append(outcome)
        shown = {k: v for k, v in outcome.items() if k != "processing_at_kill"}
        print(f"  {outcome['at_s']:7.1f} s  -- {json.dumps(shown, default=str)}", flush=True)


# --- looking at the machine ------------------------------------------------------------------------


def memory_by_role(stack: Stack, fake_pid: int | None) -> dict[str, dict[str, float]]:
    """Processes, RSS and USS (MiB) summed by role; the fake model server as "fake model"."""
    procs = [(role_of(p), p) for p in stack.family()]
    if fake_pid is not None:
        with contextlib.suppress(psutil.Error):
            procs.append(("fake model", psutil.Process(fake_pid)))
    roles: dict[str, dict[str, float]] = {}
    for role, proc in procs:
        if role == GONE:
            continue
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        entry = roles.setdefault(role, {"processes": 0, "rss_mb": 0.0, "uss_mb": 0.0})
        entry["processes"] += 1
        entry["rss_mb"] += info.rss / 2**20
        entry["uss_mb"] += info.uss / 2**20
    return roles


async def pg_connections(db: asyncpg.Pool) -> dict[str, int]:
    """Client connections to Postgres by application_name, this script's own left out."""
    rows = await db.fetch(
        "SELECT coalesce(nullif(application_name, ''), '(unnamed)') AS app, count(*) AS n"
        " FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name <> $1"
        " GROUP BY 1 ORDER BY 1",
        BENCH_APP,
    )
    return {r["app"]: int(r["n"]) for r in rows}


async def snapshot(stack: Stack, fake_pid: int | None, db: asyncpg.Pool, t0: float) -> dict[str, Any]:
    """Memory by role, Postgres connections and the queue, now."""
    memory = await asyncio.to_thread(memory_by_role, stack, fake_pid)
    queue = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE status = 'queued') AS queued,"
        " count(*) FILTER (WHERE status = 'processing') AS processing FROM chunks"
        " WHERE status IN ('queued', 'processing')"
    )
    connections = await pg_connections(db)
    return {
        "t_s": round(time.monotonic() - t0, 1),
        "memory": memory,
        "pg_connections": connections,
        "pg_connections_total": sum(connections.values()),
        "queued": int(queue["queued"]),
        "processing": int(queue["processing"]),
    }


async def sample_every(
    seconds: float, take: Callable[[], Awaitable[dict[str, Any]]], samples: list[dict[str, Any]]
) -> None:
    while True:
        s = await take()
        samples.append(s)
        mem = ", ".join(f"{role} {m['rss_mb']:.0f}" for role, m in sorted(s["memory"].items()))
        print(
            f"  {s['t_s']:7.1f} s  queue {s['queued']:>4} queued {s['processing']:>3} processing;"
            f" pg conns {s['pg_connections_total']}; RSS MiB: {mem}",
            flush=True,
        )
        await asyncio.sleep(seconds)


async def drain(db: asyncpg.Pool, timeout_s: float) -> float | None:
    """Seconds until no chunk is queued or processing; None if some still are after `timeout_s`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if not await db.fetchval("SELECT count(*) FROM chunks WHERE status IN ('queued', 'processing')"):
            return time.monotonic() - start
        await asyncio.sleep(0.5)
    return None


def log_levels(stack: Stack) -> dict[str, dict[str, int]]:
    """Lines the service logged at warning and at error or above (JSON lines), by event name."""
    found: dict[str, Counter[str]] = {"warning": Counter(), "error+": Counter()}
    with contextlib.suppress(OSError), stack.log_file.open(errors="replace") as log:
        for line in log:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            level = record.get("level") if isinstance(record, dict) else None
            bucket = "warning" if level == "warning" else "error+" if level in ("error", "critical") else None
            if bucket:
                found[bucket][str(record.get("event"))] += 1
    return {k: dict(v.most_common()) for k, v in found.items()}


# --- the figures -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def out_of_order(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Chunks whose `key` time is earlier than that of an earlier-numbered chunk of the same user."""
    by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r[key] is not None:
            by_user[r["user"]].append(r)
    late, examples = 0, list[dict[str, Any]]()
    for user, chunks in by_user.items():
        latest = -math.inf
        for r in sorted(chunks, key=lambda c: c["soak_seq"]):
            if r[key] < latest:
                late += 1
                if len(examples) < EXAMPLES:
                    examples.append({"user": user, "soak_seq": r["soak_seq"], "behind_s": latest - r[key]})
            latest = max(latest, r[key])
    return {"chunks": late, "examples": examples}


def misnumbered(rows: list[dict[str, Any]]) -> int:
    """Chunks whose server `seq` is not above that of the user's previous chunk (client numbering)."""
    by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_user[r["user"]].append(r)
    count = 0
    for chunks in by_user.values():
        ordered = sorted(chunks, key=lambda c: c["soak_seq"])
        count += sum(1 for a, b in itertools.pairwise(ordered) if b["server_seq"] <= a["server_seq"])
    return count


def windows(rows: list[dict[str, Any]], width_s: float, started: float) -> list[dict[str, Any]]:
    """Per window of acknowledgement time: chunks, post latency and ack-to-applied lag (p50, p99)."""
    buckets: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        buckets[int((r["acked_at"] - started) // width_s)].append(r)
    table = []
    for i in sorted(buckets):
        chunks = buckets[i]
        lags = [r["applied_at"] - r["acked_at"] for r in chunks if r["applied_at"] is not None]
        posts = [r["post_s"] for r in chunks]
        table.append(
            {
                "from_s": i * width_s,
                "to_s": (i + 1) * width_s,
                "acknowledged": len(chunks),
                "applied": len(lags),
                "post_p50_ms": 1000 * percentile(posts, 0.5),
                "post_p99_ms": 1000 * percentile(posts, 0.99),
                "lag_p50_s": percentile(lags, 0.5),
                "lag_p99_s": percentile(lags, 0.99),
                "lag_max_s": max(lags, default=math.nan),
            }
        )
    return table


async def chunk_rows(db: asyncpg.Pool, traffic: Traffic) -> dict[str, dict[str, Any]]:
    """What the database holds of every acknowledged chunk, by id (missing: not stored any more)."""
    ids = list(traffic.acks)
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), 5000):
        part = ids[start : start + 5000]
        for r in await db.fetch(
            "SELECT c.id, c.status, c.attempts, c.seq, (c.metadata->>'soak_seq')::int AS soak_seq,"
            " extract(epoch FROM c.applied_at)::float8 AS applied_at,"
            " extract(epoch FROM cs.created_at)::float8 AS changeset_at"
            " FROM chunks c LEFT JOIN changesets cs ON cs.id = c.changeset_id"
            " WHERE c.id = ANY($1::uuid[])",
            part,
        ):
            found[str(r["id"])] = dict(r)
    return found


async def analyse(db: asyncpg.Pool, traffic: Traffic, started: float, width_s: float) -> dict[str, Any]:
    stored = await chunk_rows(db, traffic)
    rows: list[dict[str, Any]] = []
    statuses: Counter[str] = Counter()
    purged_left = 0
    for chunk_id, ack in traffic.acks.items():
        row = stored.get(chunk_id)
        if ack.purged:
            purged_left += row is not None
            continue
        statuses[row["status"] if row else "missing"] += 1
        rows.append(
            {
                "chunk_id": chunk_id,
                "user": ack.user,
                "soak_seq": ack.soak_seq,
                "server_seq": ack.server_seq,
                "acked_at": ack.acked_at,
                "post_s": ack.post_s,
                "status": row["status"] if row else "missing",
                "attempts": row["attempts"] if row else None,
                "applied_at": row["applied_at"] if row and row["status"] == "applied" else None,
                "changeset_at": row["changeset_at"] if row else None,
                "stored_soak_seq": row["soak_seq"] if row else None,
            }
        )
    applied = [r for r in rows if r["status"] == "applied"]
    twice = await db.fetchval(
        "SELECT count(*) FROM (SELECT chunk_id FROM changesets WHERE kind = 'writer'"
        " AND chunk_id = ANY($1::uuid[]) GROUP BY chunk_id HAVING count(*) > 1) AS t",
        [r["chunk_id"] for r in applied],
    )
    lags = [r["applied_at"] - r["acked_at"] for r in applied]
    return {
        "acknowledged": len(traffic.acks),
        "acknowledged_then_purged": sum(a.purged for a in traffic.acks.values()),
        "purged_still_stored": purged_left,
        "counted": len(rows),
        "statuses": dict(statuses),
        "applied": statuses["applied"],
        "failed": statuses["failed"],
        "lost": len(rows) - statuses["applied"] - statuses["failed"],
        "lost_examples": [r for r in rows if r["status"] not in FINISHED][:EXAMPLES],
        "failed_examples": [r for r in rows if r["status"] == "failed"][:EXAMPLES],
        "seq_mismatch": sum(1 for r in rows if r["stored_soak_seq"] not in (None, r["soak_seq"])),
        "out_of_order_by_applied_at": out_of_order(applied, "applied_at"),
        "out_of_order_by_changeset": out_of_order(applied, "changeset_at"),
        "numbered_out_of_order": misnumbered(rows),
        "applied_twice": int(twice or 0),
        "most_attempts": max((r["attempts"] or 0 for r in rows), default=0),
        "lag_p50_s": percentile(lags, 0.5),
        "lag_p99_s": percentile(lags, 0.99),
        "lag_max_s": max(lags, default=math.nan),
        "windows": windows(rows, width_s, started),
    }


async def killed_chunks(db: asyncpg.Pool, traffic: Traffic) -> dict[str, Any] | None:
    """How the chunks a worker was processing when it was killed ended."""
    kill = next((e for e in traffic.events if e["kind"] == "kill"), None)
    if kill is None or not kill.get("processing_at_kill"):
        return None
    rows = await db.fetch(
        "SELECT status, attempts, count(*) AS n FROM chunks WHERE id = ANY($1::uuid[]) GROUP BY 1, 2",
        kill["processing_at_kill"],
    )
    return {
        "processing_at_kill": len(kill["processing_at_kill"]),
        "now (status, attempts: n)": {f"{r['status']}, {r['attempts']}": int(r["n"]) for r in rows},
    }


def uss_trend(samples: list[dict[str, Any]], role: str, since_s: float, skip: tuple[float, float]) -> float:
    """MiB per minute of the role's USS, fitted over the samples from `since_s` on, those within
    `skip` (the killed worker's replacement warming up) left out; NaN with fewer than 3 samples."""
    points = [
        (s["t_s"] / 60, s["memory"][role]["uss_mb"])
        for s in samples
        if s["t_s"] >= since_s and not skip[0] <= s["t_s"] < skip[1] and role in s["memory"]
    ]
    if len(points) < 3:
        return math.nan
    return statistics.linear_regression(*zip(*points, strict=True)).slope


def growth(
    start: dict[str, Any], end: dict[str, Any], samples: list[dict[str, Any]], skip: tuple[float, float]
) -> dict[str, Any]:
    """Memory by role and connections, after the warm-up against the end of the traffic, and the
    trend of each role's USS in between."""
    roles = sorted(set(start["memory"]) | set(end["memory"]))
    empty = {"processes": 0, "rss_mb": 0.0, "uss_mb": 0.0}
    during = [s for s in samples if s["t_s"] <= end["t_s"]]
    return {
        "memory": {
            role: {
                "start": start["memory"].get(role, empty),
                "end": end["memory"].get(role, empty),
                "uss_mb_per_min": uss_trend(during, role, start["t_s"], skip),
                "rss_mb_peak": max((s["memory"].get(role, empty)["rss_mb"] for s in during), default=0.0),
            }
            for role in roles
        },
        "pg_connections": {"start": start["pg_connections"], "end": end["pg_connections"]},
    }


def restarting(traffic: Traffic, sample_s: float) -> tuple[float, float]:
    """From the kill until two samples later: the replacement worker is still starting."""
    kill = next((e for e in traffic.events if e["kind"] == "kill"), None)
    return (kill["at_s"], kill["at_s"] + 2 * sample_s) if kill else (math.inf, math.inf)


# --- the run ---------------------------------------------------------------------------------------


def service_env(args: argparse.Namespace, model: FakeModelServer) -> dict[str, str]:
    return {
        "MEMSTORE_WRITER": "openai",
        "MEMSTORE_WRITER_PROFILE": "simple",
        "MEMSTORE_WRITER_BASE_URL": model.base_url,
        "MEMSTORE_WRITER_MODEL": "hy-memory",
        "MEMSTORE_EMBEDDER": args.embedder,
        **settings_of(args.env),
    }


def schedule(
    args: argparse.Namespace,
    client: httpx.AsyncClient,
    traffic: Traffic,
    stack: Stack,
    db: asyncpg.Pool,
    rng: random.Random,
) -> list[tuple[float, Callable[[], Awaitable[dict[str, Any]]]]]:
    """The undos, the purge and the kill, at their times (seconds after the traffic began)."""
    duration = 60 * args.minutes
    admin = stack.admin_headers
    revert = functools.partial(revert_latest, client, traffic, admin, rng)
    restore = functools.partial(restore_recent, client, traffic, admin, rng, args.undo_every_s / 2)
    undos = itertools.takewhile(lambda t: t < duration, itertools.count(args.undo_every_s, args.undo_every_s))
    events: list[tuple[float, Callable[[], Awaitable[dict[str, Any]]]]] = [
        (at, restore if n % 2 else revert) for n, at in enumerate(undos)
    ]
    events.append((args.purge_at * duration, functools.partial(purge_user, client, traffic, admin, db, rng)))
    events.append((args.kill_at * duration, lambda: kill_worker(stack, db, args.restart_wait_s)))
    return events


async def drive(args: argparse.Namespace, stack: Stack, model: FakeModelServer) -> dict[str, Any]:
    """The traffic, the events and the samples; then the drain and the figures."""
    rng = random.Random(args.seed)
    traffic = Traffic([f"soak-{i:04d}" for i in range(args.users)])
    key = stack.create_key("bench-soak", ("ingest", "read"))
    # A pool: the sampler, the events and the end read the database at the same time.
    db = await asyncpg.create_pool(
        stack.dsn, min_size=1, max_size=3, server_settings={"application_name": BENCH_APP}
    )
    fake_pid = model.process.pid if model.process else None
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=stack.base_url, headers=headers, timeout=60, limits=limits
    ) as client:
        t0 = time.monotonic()
        started = time.time()
        until = t0 + 60 * args.minutes
        samples: list[dict[str, Any]] = []
        sampler = asyncio.create_task(
            sample_every(args.sample_s, lambda: snapshot(stack, fake_pid, db, t0), samples)
        )
        events = asyncio.create_task(run_events(schedule(args, client, traffic, stack, db, rng), traffic, t0))
        turn = itertools.cycle(rng.sample(traffic.users, len(traffic.users)))
        posting = paced(args.rate, until, lambda: post_chunk(client, traffic, next(turn), rng))
        searching = paced(
            args.search_rate, until, lambda: search(client, traffic, rng.choice(traffic.users), rng)
        )

        async def after_warmup() -> dict[str, Any]:
            await asyncio.sleep(args.warmup_s)
            return await snapshot(stack, fake_pid, db, t0)

        start_snapshot, *_ = await asyncio.gather(after_warmup(), posting, searching, events)
        end_snapshot = await snapshot(stack, fake_pid, db, t0)
        traffic_s = time.monotonic() - t0
        print(f"  {traffic_s:7.1f} s  -- traffic stopped; waiting for the queue to drain", flush=True)
        drained_s = await drain(db, args.drain_timeout_s)
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        after_drain = await snapshot(stack, fake_pid, db, t0)
        figures = await analyse(db, traffic, started, args.window_s)
        killed = await killed_chunks(db, traffic)
    await db.close()
    return {
        "traffic_s": traffic_s,
        "drained_after_s": drained_s,
        "chunks": figures,
        "killed_chunks": killed,
        "unacknowledged": traffic.unacknowledged,
        "answers": {f"{route} {status}": n for (route, status), n in sorted(traffic.answers.items())},
        "server_errors": {
            route: n for (route, status), n in sorted(traffic.answers.items()) if status >= 500
        },
        "no_answer": dict(traffic.no_answer),
        "problem_examples": traffic.examples,
        "events": traffic.events,
        "growth": growth(start_snapshot, end_snapshot, samples, restarting(traffic, args.sample_s)),
        "after_drain": after_drain,
        "samples": samples,
        "log": log_levels(stack),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with FakeModelServer(latency_s=args.latency) as model:
        env = service_env(args, model)
        with running_stack(workers=args.workers, log_level=args.log_level, env_overrides=env) as stack:
            result = await drive(args, stack, model)
    settings = {
        k: getattr(args, k)
        for k in (
            "minutes",
            "users",
            "rate",
            "search_rate",
            "latency",
            "workers",
            "embedder",
            "undo_every_s",
            "purge_at",
            "kill_at",
            "warmup_s",
            "sample_s",
            "window_s",
            "seed",
        )
    }
    settings |= {"env": env | {"MEMSTORE_WRITER_BASE_URL": "<fake model server>"}, "cpus": os.cpu_count()}
    return {"settings": settings, **result}


# --- the report ------------------------------------------------------------------------------------


def verdict(r: dict[str, Any]) -> list[str]:
    """What went wrong, if anything (empty: the service held up)."""
    c = r["chunks"]
    checks = [
        (c["lost"], "chunk(s) acknowledged and lost (missing or unfinished after the drain)"),
        (c["failed"], "chunk(s) failed"),
        (c["out_of_order_by_applied_at"]["chunks"], "chunk(s) applied out of order (applied_at)"),
        (c["out_of_order_by_changeset"]["chunks"], "chunk(s) applied out of order (changeset created_at)"),
        (c["numbered_out_of_order"], "chunk(s) numbered out of order by the server"),
        (c["applied_twice"], "chunk(s) applied twice"),
        (c["purged_still_stored"], "chunk(s) of the purged user still stored"),
        (sum(r["server_errors"].values()), "5xx answer(s)"),
        (sum(r["no_answer"].values()), "request(s) without an answer"),
    ]
    return [f"{n} {what}" for n, what in checks if n]


def _mb(entry: dict[str, float], key: str) -> str:
    return f"{entry[key]:7.0f}"


def print_report(r: dict[str, Any]) -> None:
    c, s = r["chunks"], r["settings"]

    def secs(v: float | None) -> str:
        return "-" if v is None or math.isnan(v) else f"{v:.2f} s"

    rows = [
        (
            "traffic",
            f"{r['traffic_s']:.0f} s, {s['users']} users, {s['rate']:g} chunks/s,"
            f" {s['search_rate']:g} searches/s",
        ),
        (
            "service",
            f"{s['workers']} worker(s), openai writer at {s['latency']:g} s/call,"
            f" {s['embedder']} embedder, {s['cpus']} CPUs",
        ),
        ("chunks acknowledged", f"{c['acknowledged']:,} (+{r['unacknowledged']} given up by the client)"),
        (
            "  of the purged user, before its purge",
            f"{c['acknowledged_then_purged']:,} (still stored: {c['purged_still_stored']})",
        ),
        (
            "  counted",
            f"{c['counted']:,}: applied {c['applied']:,}, failed {c['failed']:,}, lost {c['lost']:,}",
        ),
        ("  by status", ", ".join(f"{k} {n:,}" for k, n in sorted(c["statuses"].items()))),
        ("queue drained after the traffic", secs(r["drained_after_s"])),
        ("applied out of order (applied_at)", f"{c['out_of_order_by_applied_at']['chunks']}"),
        ("applied out of order (changesets)", f"{c['out_of_order_by_changeset']['chunks']}"),
        ("numbered out of order / seq mismatch", f"{c['numbered_out_of_order']} / {c['seq_mismatch']}"),
        ("applied twice", f"{c['applied_twice']}"),
        ("most attempts of a chunk", f"{c['most_attempts']}"),
        (
            "lag ack -> applied, whole run",
            f"p50 {secs(c['lag_p50_s'])}, p99 {secs(c['lag_p99_s'])}, max {secs(c['lag_max_s'])}",
        ),
        ("5xx by route", ", ".join(f"{k} {n}" for k, n in r["server_errors"].items()) or "none"),
        ("no answer by route", ", ".join(f"{k} {n}" for k, n in r["no_answer"].items()) or "none"),
        ("answers (route status: n)", "; ".join(f"{k}: {n:,}" for k, n in r["answers"].items())),
        (
            "killed worker's chunks",
            json.dumps(r["killed_chunks"]) if r["killed_chunks"] else "none processing",
        ),
        ("log lines, error+ by event", json.dumps(r["log"]["error+"]) or "{}"),
        ("log lines, warning by event", json.dumps(r["log"]["warning"]) or "{}"),
    ]
    print()
    for label, value in rows:
        print(f"    {label:<40} {value}")
    print("\n    events")
    for e in r["events"]:
        shown = {k: v for k, v in e.items() if k not in ("processing_at_kill", "at_s", "took_s")}
        print(f"      {e['at_s']:7.1f} s ({e['took_s']:.2f} s)  {json.dumps(shown, default=str)}")
    print("\n    per window of acknowledgement   chunks  applied   post p50/p99 ms   lag p50/p99/max s")
    for w in c["windows"]:
        print(
            f"      {w['from_s']:6.0f} - {w['to_s']:6.0f} s"
            f"          {w['acknowledged']:>7,} {w['applied']:>8,}"
            f"   {w['post_p50_ms']:7.1f} {w['post_p99_ms']:7.1f}"
            f"   {w['lag_p50_s']:6.2f} {w['lag_p99_s']:6.2f} {w['lag_max_s']:6.2f}"
        )
    g = r["growth"]
    print(
        "\n    memory by role (MiB)   procs start/end   RSS start    end  growth   peak"
        "   USS start    end  growth  USS trend /min"
    )
    for role, m in g["memory"].items():
        a, b = m["start"], m["end"]
        print(
            f"      {role:<20} {a['processes']:>5.0f} / {b['processes']:<5.0f}"
            f"  {_mb(a, 'rss_mb')} {_mb(b, 'rss_mb')} {b['rss_mb'] - a['rss_mb']:+7.1f}"
            f" {m['rss_mb_peak']:6.0f}"
            f"   {_mb(a, 'uss_mb')} {_mb(b, 'uss_mb')} {b['uss_mb'] - a['uss_mb']:+7.1f}"
            f"  {m['uss_mb_per_min']:+10.2f}"
        )
    pg = g["pg_connections"]
    print(
        f"\n    Postgres connections: start {sum(pg['start'].values())} {json.dumps(pg['start'])},"
        f" end {sum(pg['end'].values())} {json.dumps(pg['end'])},"
        f" after the drain {r['after_drain']['pg_connections_total']}"
    )
    if r["problem_examples"]:
        print("\n    first problems seen by the clients:")
        for text in r["problem_examples"][:EXAMPLES]:
            print(f"      {text}")


def plot(r: dict[str, Any], path: Path) -> bool:
    """Lag per window, memory by role and the queue over time; False when matplotlib is missing."""
    try:
        import matplotlib as mpl

        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (lag, mem, queue) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    w = r["chunks"]["windows"]
    middle = [(x["from_s"] + x["to_s"]) / 2 for x in w]
    lag.plot(middle, [x["lag_p50_s"] for x in w], marker="o", label="p50")
    lag.plot(middle, [x["lag_p99_s"] for x in w], marker="s", label="p99")
    lag.set_ylabel("ack -> applied (s)")
    lag.legend()
    samples = r["samples"]
    t = [s["t_s"] for s in samples]
    for role in sorted({role for s in samples for role in s["memory"]}):
        mem.plot(t, [s["memory"].get(role, {}).get("uss_mb", math.nan) for s in samples], label=role)
    mem.set_ylabel("USS (MiB)")
    mem.legend(fontsize="small")
    queue.plot(t, [s["queued"] + s["processing"] for s in samples], label="chunks waiting")
    queue.plot(t, [s["pg_connections_total"] for s in samples], label="Postgres connections")
    queue.set_xlabel("seconds since the traffic began")
    queue.legend()
    for e in r["events"]:
        if e["kind"] in ("kill", "purge"):
            for ax in (lag, mem, queue):
                ax.axvline(e["at_s"], color="grey", linestyle=":")
            queue.annotate(e["kind"], (e["at_s"], 0), fontsize="small")
    fig.suptitle(f"soak: {r['settings']['minutes']:g} min, {r['settings']['rate']:g} chunks/s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of traffic")
    parser.add_argument("--users", type=int, default=300, help="users posting, each in order")
    parser.add_argument("--rate", type=float, default=15.0, help="chunks per second, all users together")
    parser.add_argument("--search-rate", type=float, default=2.0, help="searches per second")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the fake model takes per call")
    parser.add_argument("--embedder", default="hashing", help="MEMSTORE_EMBEDDER (hashing: cheap on 2 cores)")
    parser.add_argument(
        "--undo-every-s", type=float, help="seconds between undos (default: a tenth of the run)"
    )
    parser.add_argument(
        "--purge-at", type=float, default=0.35, help="when to purge a user, as a share of the run"
    )
    parser.add_argument(
        "--kill-at", type=float, default=0.5, help="when to SIGKILL a worker, as a share of the run"
    )
    parser.add_argument(
        "--restart-wait-s", type=float, default=15.0, help="how long to wait for the supervisor"
    )
    parser.add_argument(
        "--warmup-s", type=float, help="seconds before the start snapshot (default: min(60, a tenth))"
    )
    parser.add_argument(
        "--sample-s", type=float, help="seconds between samples (default: a sixtieth, at least 5)"
    )
    parser.add_argument(
        "--window-s", type=float, help="width of the lag windows (default: 60, or 300 past 10 min)"
    )
    parser.add_argument(
        "--drain-timeout-s", type=float, default=300.0, help="most seconds to wait for the queue"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the users' turns and choices")
    parser.add_argument(
        "--plot", type=Path, help="also draw lag, memory and queue over time (needs matplotlib)"
    )
    add_stack_options(parser, workers=1, log_level="WARNING")
    args = parser.parse_args()
    duration = 60 * args.minutes
    args.undo_every_s = args.undo_every_s or duration / 10
    args.warmup_s = args.warmup_s if args.warmup_s is not None else min(60.0, duration / 10)
    args.sample_s = args.sample_s or max(5.0, duration / 60)
    args.window_s = args.window_s or (60.0 if args.minutes <= 10 else 300.0)
    print(
        f"soak: {args.minutes:g} min, {args.users} users at {args.rate:g} chunks/s, {args.search_rate:g}"
        f" searches/s; undo every {args.undo_every_s:g} s, purge at {args.purge_at * duration:.0f} s, kill"
        f" at {args.kill_at * duration:.0f} s; openai writer at {args.latency:g} s/call, {args.embedder}"
        f" embedder, {args.workers} worker(s); {os.cpu_count()} CPUs",
        flush=True,
    )
    result = asyncio.run(run(args))
    print_report(result)
    problems = verdict(result)
    result["problems"] = problems
    write_figures(result, args.json)
    if args.plot:
        drawn = plot(result, args.plot)
        print(f"  plot written to {args.plot}" if drawn else "  no plot: matplotlib is not installed")
    conclude(problems, "nothing lost, failed, reordered or applied twice; no 5xx")


if __name__ == "__main__":
    main()
