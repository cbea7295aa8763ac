"""The pipeline end to end: applied chunks/s with the offline writer, fed real conversations.

Input: the LoCoMo conversations (`--locomo`, default ../shared/data/locomo10.json; a synthetic set when
the file is absent). Each speaker of each conversation is one user; each of their turns is one chunk
(their turn as the user message, the other speaker's reply as the assistant message), in conversation
order. `--copies K` repeats the set under other user ids; `--limit N` keeps the first N chunks
(round-robin over users, so every user keeps a prefix of their conversation).

Two measurements, each on a fresh `memstore up` with the default (offline) writer:

- drain: `memstore up --workers 0`, post everything, wait until it is all queued, then start
  `--workers` worker processes and time until every chunk is applied or failed. Reports applied/s
  (from starting the workers, and from the first to the last apply), failures, memories created, and
  the workers' CPU seconds per chunk.
- e2e: `memstore up --workers W`, post everything as fast as ingestion takes it, and time from the
  first post to the last apply. Reports applied/s, the lag (applied_at - received_at) p50/p90/p99, and
  CPU seconds per chunk of each kind of process.

Chunks are posted with `POST /v1/chunks/batch`, `--concurrency` requests at a time; concurrent
requests always carry disjoint sets of users, so each user's chunks arrive in order.

Goal: >= 300 applied chunks/s end to end.

Usage: python bench/pipeline.py [--workers 2] [--copies 1] [--limit N] [--only drain|e2e]
                                [--concurrency 4] [--batch-size 100] [--log-level INFO] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
from _stack import CpuByRole, Stack, add_settings_option, cpu_seconds, running_stack, settings_of

GOAL_APPLIED_PER_S = 300
DEFAULT_LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json"
POLL_S = 0.25

Chunk = dict[str, Any]
"""One `POST /v1/chunks` body."""


# --- input -----------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _session_time(text: str | None) -> str | None:
    """LoCoMo's "1:56 pm on 8 May, 2023" as RFC 3339, or None."""
    if not text:
        return None
    try:
        return datetime.strptime(text, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).isoformat()
    except ValueError:
        return None


def _turn_text(turn: dict[str, Any]) -> str:
    text = str(turn.get("text", ""))
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def locomo_chunks(path: Path) -> dict[str, list[Chunk]]:
    """User id -> that user's chunks in conversation order, from LoCoMo's `locomo10.json`."""
    by_user: dict[str, list[Chunk]] = {}
    for sample in json.loads(path.read_text()):
        conversation = sample["conversation"]
        sessions = sorted(
            (int(m.group(1)), key)
            for key, value in conversation.items()
            if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(value, list)
        )
        for _, key in sessions:
            when = _session_time(conversation.get(f"{key}_date_time"))
            turns = conversation[key]
            for i, turn in enumerate(turns):
                speaker = turn["speaker"]
                user_id = f"locomo-{_slug(sample['sample_id'])}-{_slug(speaker)}"
                user_message: dict[str, Any] = {"role": "user", "content": _turn_text(turn), "name": speaker}
                if when:
                    user_message["created_at"] = when
                messages = [user_message]
                reply = next((t for t in turns[i + 1 :] if t["speaker"] != speaker), None)
                if reply is not None:
                    messages.append(
                        {"role": "assistant", "content": _turn_text(reply), "name": reply["speaker"]}
                    )
                by_user.setdefault(user_id, []).append({"user_id": user_id, "messages": messages})
    return by_user


_SYNTHETIC_FACTS = [
    "I moved to {city} last month and I am still unpacking boxes.",
    "My sister {name} is getting married in {month}; I am giving a speech.",
    "I started learning the {instrument} and practise every morning.",
    "We adopted a dog called {pet}; he is afraid of the vacuum cleaner.",
    "I am allergic to {food}, so please keep that in mind for recipes.",
    "Work has been busy: the {project} launch slipped to {month}.",
    "I ran my first 10k in {city} this weekend, it took me 58 minutes.",
    "I prefer window seats and I always fly with {airline} when I can.",
]
_SYNTHETIC_WORDS = {
    "city": ["Seattle", "Lisbon", "Osaka", "Denver", "Glasgow", "Austin"],
    "name": ["Ana", "Mira", "Jonas", "Priya", "Tom"],
    "month": ["March", "June", "September", "December"],
    "instrument": ["cello", "piano", "banjo", "violin"],
    "pet": ["Miso", "Pepper", "Biscuit", "Rocket"],
    "food": ["peanuts", "shellfish", "gluten", "sesame"],
    "project": ["mobile app", "billing", "search", "onboarding"],
    "airline": ["KLM", "Alaska", "ANA", "Iberia"],
}
_SYNTHETIC_REPLIES = ["Noted, thanks for telling me.", "Got it, I will remember that.", "That sounds great!"]


def synthetic_chunks(users: int = 20, per_user: int = 300, seed: int = 7) -> dict[str, list[Chunk]]:
    """A LoCoMo-sized stand-in: `users` users with `per_user` short chat turns each."""
    rng = random.Random(seed)
    by_user: dict[str, list[Chunk]] = {}
    for u in range(users):
        user_id = f"synthetic-{u:03d}"
        by_user[user_id] = [
            {
                "user_id": user_id,
                "messages": [
                    {
                        "role": "user",
                        "content": rng.choice(_SYNTHETIC_FACTS).format(
                            **{k: rng.choice(v) for k, v in _SYNTHETIC_WORDS.items()}
                        ),
                    },
                    {"role": "assistant", "content": rng.choice(_SYNTHETIC_REPLIES)},
                ],
            }
            for _ in range(per_user)
        ]
    return by_user


def interleave(by_user: dict[str, list[Chunk]]) -> Iterator[Chunk]:
    """Round-robin over users, each user's chunks in order."""
    queues = [iter(chunks) for chunks in by_user.values()]
    while queues:
        alive = []
        for queue in queues:
            chunk = next(queue, None)
            if chunk is not None:
                alive.append(queue)
                yield chunk
        queues = alive


def build_input(path: Path, copies: int, limit: int | None) -> tuple[str, dict[str, list[Chunk]]]:
    if path.is_file():
        source, base = f"LoCoMo ({path})", locomo_chunks(path)
    else:
        source, base = f"synthetic ({path} not found)", synthetic_chunks()
    by_user: dict[str, list[Chunk]] = {}
    for copy in range(copies):
        for user_id, chunks in base.items():
            uid = user_id if copy == 0 else f"{user_id}-copy{copy}"
            by_user[uid] = [{**chunk, "user_id": uid} for chunk in chunks]
    if limit is not None:
        kept: dict[str, list[Chunk]] = {}
        for i, chunk in enumerate(interleave(by_user)):
            if i >= limit:
                break
            kept.setdefault(chunk["user_id"], []).append(chunk)
        by_user = kept
    return source, by_user


# --- posting ---------------------------------------------------------------------------------------


@dataclass
class Posted:
    accepted: int = 0
    failed_batches: int = 0
    first_error: str | None = None
    seconds: float = 0.0


async def post_all(
    stack: Stack, key: str, by_user: dict[str, list[Chunk]], concurrency: int, batch_size: int
) -> Posted:
    """Post every chunk with the batch endpoint; concurrent requests never share a user."""
    lanes: list[dict[str, list[Chunk]]] = [{} for _ in range(max(1, concurrency))]
    for i, (user_id, chunks) in enumerate(by_user.items()):
        lanes[i % len(lanes)][user_id] = chunks
    posted = Posted()
    started = time.perf_counter()
    async with httpx.AsyncClient(
        base_url=stack.base_url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
        limits=httpx.Limits(max_connections=len(lanes)),
    ) as client:

        async def run_lane(lane: dict[str, list[Chunk]]) -> None:
            sequence = list(interleave(lane))
            for start in range(0, len(sequence), batch_size):
                batch = sequence[start : start + batch_size]
                response = await client.post("/v1/chunks/batch", json={"chunks": batch})
                if response.status_code == 202:
                    posted.accepted += len(response.json()["results"])
                else:
                    posted.failed_batches += 1
                    posted.first_error = posted.first_error or f"{response.status_code} {response.text[:300]}"

        await asyncio.gather(*(run_lane(lane) for lane in lanes if lane))
    posted.seconds = time.perf_counter() - started
    return posted


# --- the database's view ---------------------------------------------------------------------------


@dataclass
class Progress:
    applied: int
    failed: int
    pending: int

    @property
    def total(self) -> int:
        return self.applied + self.failed + self.pending


async def progress(conn: asyncpg.Connection) -> Progress:
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE status = 'applied') AS applied,"
        " count(*) FILTER (WHERE status = 'failed') AS failed,"
        " count(*) FILTER (WHERE status IN ('queued', 'processing')) AS pending FROM chunks"
    )
    return Progress(int(row["applied"]), int(row["failed"]), int(row["pending"]))


async def wait_for(
    conn: asyncpg.Connection,
    expected: int,
    *,
    done: str,
    timeout_s: float,
    on_poll: Callable[[Progress], None] | None = None,
) -> tuple[Progress, bool]:
    """Poll until `expected` chunks exist and, per `done`, all are queued or none is pending any more."""
    deadline = time.monotonic() + timeout_s
    last_print = time.monotonic()
    while True:
        now = await progress(conn)
        if on_poll is not None:
            on_poll(now)
        finished = now.pending == 0 if done == "finished" else now.pending >= expected
        if now.total >= expected and finished:
            return now, True
        if time.monotonic() > deadline:
            return now, False
        if time.monotonic() - last_print > 10:
            print(
                f"    ... applied {now.applied:,}, failed {now.failed:,}, pending {now.pending:,}", flush=True
            )
            last_print = time.monotonic()
        await asyncio.sleep(POLL_S)


async def finish_times(conn: asyncpg.Connection) -> dict[str, float | None]:
    """Epoch seconds of the first/last receipt and the first/last apply (or failure)."""
    row = await conn.fetchrow(
        "SELECT extract(epoch FROM min(received_at)) AS first_received,"
        " extract(epoch FROM min(applied_at)) AS first_applied,"
        " extract(epoch FROM max(applied_at)) AS last_applied,"
        " extract(epoch FROM max(CASE WHEN status = 'applied' THEN applied_at ELSE updated_at END)"
        "   FILTER (WHERE status IN ('applied', 'failed'))) AS last_finished"
        " FROM chunks"
    )
    return {k: (float(v) if v is not None else None) for k, v in row.items()}


async def lag_percentiles(conn: asyncpg.Connection) -> dict[str, float]:
    row = await conn.fetchrow(
        "SELECT percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP"
        "   (ORDER BY extract(epoch FROM applied_at - received_at)) AS p,"
        " max(extract(epoch FROM applied_at - received_at)) AS max"
        " FROM chunks WHERE status = 'applied'"
    )
    p = row["p"] or [float("nan")] * 3
    return {"p50_s": p[0], "p90_s": p[1], "p99_s": p[2], "max_s": float(row["max"] or float("nan"))}


async def memory_counts(conn: asyncpg.Connection) -> dict[str, int]:
    row = await conn.fetchrow(
        "SELECT count(*) AS total, count(*) FILTER (WHERE status = 'active') AS active FROM memories"
    )
    return {"memories": int(row["total"]), "active_memories": int(row["active"])}


def _rate(count: int, seconds: float | None) -> float:
    return count / seconds if seconds and seconds > 0 else float("nan")


# --- the two measurements --------------------------------------------------------------------------


def settings_env(args: argparse.Namespace) -> dict[str, str]:
    """The `--env MEMSTORE_X=V` settings given on the command line."""
    return settings_of(args.env)


async def drain(args: argparse.Namespace, by_user: dict[str, list[Chunk]]) -> dict[str, Any]:
    total = sum(len(c) for c in by_user.values())
    print(f"\n  drain: posting {total:,} chunks to memstore up --workers 0 ...", flush=True)
    with running_stack(
        workers=0,
        log_level=args.log_level,
        api_processes=args.api_processes,
        env_overrides=settings_env(args),
    ) as stack:
        key = stack.create_key("bench-pipeline", ("ingest", "read"))
        posted = await post_all(stack, key, by_user, args.concurrency, args.batch_size)
        conn = await asyncpg.connect(stack.dsn)
        try:
            queued, ok = await wait_for(conn, posted.accepted, done="queued", timeout_s=60)
            if not ok:
                print(f"  ! only {queued.pending:,} of {posted.accepted:,} chunks queued", file=sys.stderr)
            print(
                f"  drain: {queued.pending:,} chunks queued; starting {args.workers} worker process(es) ...",
                flush=True,
            )
            started = time.time()
            workers = [psutil.Process(stack.start_worker().pid) for _ in range(args.workers)]
            at_first: dict[str, float] = {}

            def note_first_apply(now: Progress) -> None:
                # CPU spent before the first chunk is applied is mostly start-up (imports, connections).
                if "cpu" not in at_first and now.applied + now.failed > 0:
                    at_first.update(cpu=cpu_seconds(workers), chunks=now.applied + now.failed)

            final, ok = await wait_for(
                conn, posted.accepted, done="finished", timeout_s=args.timeout, on_poll=note_first_apply
            )
            cpu_total = cpu_seconds(workers)
            times = await finish_times(conn)
            memories = await memory_counts(conn)
        finally:
            await conn.close()
    finished = times["last_finished"]
    wall_s = finished - started if finished else None
    steady_s = (
        times["last_applied"] - times["first_applied"]
        if times["last_applied"] and times["first_applied"]
        else None
    )
    steady_chunks = final.applied + final.failed - at_first.get("chunks", 0)
    return {
        "posted": posted.accepted,
        "post_errors": posted.failed_batches,
        "post_first_error": posted.first_error,
        "complete": ok,
        "applied": final.applied,
        "failed": final.failed,
        "pending": final.pending,
        "seconds_from_worker_start": wall_s,
        "applied_per_s": _rate(final.applied, wall_s),
        "seconds_first_to_last_apply": steady_s,
        "applied_per_s_steady": _rate(final.applied, steady_s),
        **memories,
        "worker_cpu_s": cpu_total,
        "worker_cpu_ms_per_chunk": 1e3 * cpu_total / max(1, final.applied + final.failed),
        "worker_cpu_s_before_first_apply": at_first.get("cpu"),
        "worker_cpu_ms_per_chunk_steady": (
            1e3 * (cpu_total - at_first["cpu"]) / steady_chunks if at_first and steady_chunks > 0 else None
        ),
    }


async def end_to_end(args: argparse.Namespace, by_user: dict[str, list[Chunk]]) -> dict[str, Any]:
    total = sum(len(c) for c in by_user.values())
    print(f"\n  e2e: posting {total:,} chunks to memstore up --workers {args.workers} ...", flush=True)
    with running_stack(
        workers=args.workers,
        log_level=args.log_level,
        api_processes=args.api_processes,
        env_overrides=settings_env(args),
    ) as stack:
        key = stack.create_key("bench-pipeline", ("ingest", "read"))
        time.sleep(1.0)  # let the workers finish starting, so their start-up is not counted as work
        cpu_before = CpuByRole.snapshot(stack.family())
        started = time.time()
        posted = await post_all(stack, key, by_user, args.concurrency, args.batch_size)
        print(
            f"  e2e: {posted.accepted:,} chunks accepted in {posted.seconds:.1f} s; waiting for workers ...",
            flush=True,
        )
        conn = await asyncpg.connect(stack.dsn)
        try:
            final, ok = await wait_for(conn, posted.accepted, done="finished", timeout_s=args.timeout)
            cpu = CpuByRole.snapshot(stack.family()) - cpu_before
            times = await finish_times(conn)
            lag = await lag_percentiles(conn)
            memories = await memory_counts(conn)
        finally:
            await conn.close()
    finished = times["last_finished"]
    span_s = finished - started if finished else None
    done = max(1, final.applied + final.failed)
    return {
        "posted": posted.accepted,
        "post_errors": posted.failed_batches,
        "post_first_error": posted.first_error,
        "post_seconds": posted.seconds,
        "accepted_per_s": _rate(posted.accepted, posted.seconds),
        "complete": ok,
        "applied": final.applied,
        "failed": final.failed,
        "pending": final.pending,
        "seconds_first_post_to_last_apply": span_s,
        "applied_per_s": _rate(final.applied, span_s),
        "lag": lag,
        **memories,
        "cpu_ms_per_chunk": {role: 1e3 * s / done for role, s in sorted(cpu.seconds.items())},
    }


# --- report ----------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None or value != value:  # None or NaN
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def print_drain(r: dict[str, Any], workers: int) -> None:
    print(f"\n  backlog drain, {workers} worker process(es), offline writer")
    rows = [
        ("chunks posted / applied / failed", f"{r['posted']:,} / {r['applied']:,} / {r['failed']:,}"),
        (
            "applied/s from starting workers",
            f"{fmt(r['applied_per_s'])}   ({fmt(r['seconds_from_worker_start'], 1, ' s')})",
        ),
        (
            "applied/s first to last apply",
            f"{fmt(r['applied_per_s_steady'])}   ({fmt(r['seconds_first_to_last_apply'], 1, ' s')})",
        ),
        ("memories created (active)", f"{r['memories']:,} ({r['active_memories']:,})"),
        (
            "worker CPU per chunk",
            f"{fmt(r['worker_cpu_ms_per_chunk'], 2, ' ms')} all-in, "
            f"{fmt(r['worker_cpu_ms_per_chunk_steady'], 2, ' ms')} after the first apply "
            f"(start-up {fmt(r['worker_cpu_s_before_first_apply'], 1, ' s')})",
        ),
    ]
    _print_rows(rows, r)


def print_e2e(r: dict[str, Any], workers: int) -> None:
    print(f"\n  end to end, memstore up --workers {workers}, offline writer")
    lag = r["lag"]
    cpu = ", ".join(f"{role} {fmt(ms, 2)}" for role, ms in r["cpu_ms_per_chunk"].items())
    rows = [
        ("chunks posted / applied / failed", f"{r['posted']:,} / {r['applied']:,} / {r['failed']:,}"),
        (
            "accepted/s while posting",
            f"{fmt(r['accepted_per_s'])}   ({fmt(r['post_seconds'], 1, ' s')})",
        ),
        (
            "applied/s first post to last apply",
            f"{fmt(r['applied_per_s'])}   ({fmt(r['seconds_first_post_to_last_apply'], 1, ' s')})"
            f"   goal >= {GOAL_APPLIED_PER_S}",
        ),
        (
            "lag applied_at - received_at",
            f"p50 {fmt(lag['p50_s'], 2, ' s')}, p90 {fmt(lag['p90_s'], 2, ' s')}, "
            f"p99 {fmt(lag['p99_s'], 2, ' s')}, max {fmt(lag['max_s'], 2, ' s')}",
        ),
        ("memories created (active)", f"{r['memories']:,} ({r['active_memories']:,})"),
        ("CPU ms per chunk", cpu),
    ]
    _print_rows(rows, r)


def _print_rows(rows: list[tuple[str, str]], r: dict[str, Any]) -> None:
    for label, value in rows:
        print(f"    {label:<36} {value}")
    if r["post_errors"]:
        print(f"    ! {r['post_errors']} batch(es) refused, first: {r['post_first_error']}")
    if not r["complete"]:
        print(f"    ! stopped waiting with {r['pending']:,} chunks still pending (--timeout)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO, help="LoCoMo's locomo10.json")
    parser.add_argument("--copies", type=int, default=1, help="repeat the input under other user ids")
    parser.add_argument("--limit", type=int, help="keep only the first N chunks")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--api-processes", type=int, default=1, help="API processes of `memstore up`")
    parser.add_argument("--only", choices=["drain", "e2e"], help="run one of the two measurements")
    parser.add_argument("--concurrency", type=int, default=4, help="batch requests in flight")
    parser.add_argument("--batch-size", type=int, default=100, help="chunks per batch request (<= 100)")
    parser.add_argument("--timeout", type=float, default=900, help="most seconds to wait for the workers")
    parser.add_argument("--log-level", default="INFO", help="MEMSTORE_LOG_LEVEL of the service")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    add_settings_option(parser)
    args = parser.parse_args()

    source, by_user = build_input(args.locomo.resolve(), args.copies, args.limit)
    total = sum(len(c) for c in by_user.values())
    body_bytes = sum(len(json.dumps(c)) for chunks in by_user.values() for c in chunks) / max(1, total)
    print(
        f"pipeline: {source}, x{args.copies}: {len(by_user):,} users, {total:,} chunks "
        f"(~{body_bytes:.0f} B each); {args.workers} worker process(es), offline writer; "
        f"{os.cpu_count()} CPUs"
    )
    result: dict[str, Any] = {
        "settings": {
            "source": source,
            "users": len(by_user),
            "chunks": total,
            "cpus": os.cpu_count(),
            "env": args.env,
        }
        | {
            k: getattr(args, k)
            for k in ("copies", "limit", "workers", "api_processes", "concurrency", "batch_size", "log_level")
        },
        "goal_applied_per_s": GOAL_APPLIED_PER_S,
    }
    if args.only in (None, "drain"):
        result["drain"] = asyncio.run(drain(args, by_user))
    if args.only in (None, "e2e"):
        result["e2e"] = asyncio.run(end_to_end(args, by_user))
    if "drain" in result:
        print_drain(result["drain"], args.workers)
    if "e2e" in result:
        print_e2e(result["e2e"], args.workers)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\n  figures written to {args.json}")


if __name__ == "__main__":
    main()
