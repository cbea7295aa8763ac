"""LLM-writer throughput: applied chunks/s as the writer calls in flight grow, against the ideal.

A GPU writer (vLLM) answers a call in about a second however many it batches, so the service's job
is to keep enough calls in flight. This runs `memstore up --workers W` with the `openai` writer (the
`simple` profile: one model call per chunk) pointed at the fake model server in its own process,
answering every call after `--latency` seconds. For each in-flight level c (1, 2, 4 ... 256) it posts
`--chunks-per-user` (m) chunks for each of c fresh users (a user's chunks are written one after
another, users in parallel). A user's span runs from its first chunk received to its last applied
(database timestamps); ideally it is m x latency, so c users keep c calls in flight and the service
applies c / latency chunks/s. The figure is m x latency / mean span, the achieved fraction of that
ideal. (Posting c x m chunks takes the API a moment too; the wall-clock window from the level's first
chunk received to its last applied is shown beside it.) Beside it: the calls the fake server held at
once (mean over the level, sampled every 0.1 s, and peak), and how busy the whole machine's CPU was
during the level — the model costs no CPU on a real deployment, but here the service, Postgres, the
fake server and anything else running share the same cores, and a level that saturates them
measures the machine, not the concurrency.

Goal: >= 90 % of ideal up to 256 in flight.

Usage: python bench/writer.py [--latency 1.0] [--levels 1,2,4,...,256] [--chunks-per-user 5]
                              [--workers 2] [--json out.json] [--env MEMSTORE_X=V ...]
                              [--without-ann-index]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
from _stack import CpuByRole, Stack, add_settings_option, cpu_seconds, running_stack, settings_of

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.90
DEFAULT_LEVELS = "1,2,4,8,16,32,64,128,256"


def start_fake_model(latency: float) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_llm", "--latency", str(latency)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("PORT "):
        proc.kill()
        msg = f"the fake model server did not start (said {line!r})"
        raise RuntimeError(msg)
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def chunks_for(level: int, users: int, per_user: int) -> list[dict[str, Any]]:
    """Round-robin over users, so each user's chunks stay in order within and across batches."""
    return [
        {
            "user_id": f"l{level}-u{u}",
            "messages": [
                {"role": "user", "content": f"I keep item {i} of set {u} in drawer {level}-{u}-{i}."},
                {"role": "assistant", "content": "Noted."},
            ],
        }
        for i in range(per_user)
        for u in range(users)
    ]


def machine_cpu() -> tuple[int, int] | None:
    """(idle, total) jiffies of the whole machine, from /proc/stat; None where there is none."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields)


def machine_busy(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    """Share of all cores busy between two readings (anything running here counts, not only us)."""
    if before is None or after is None or after[1] == before[1]:
        return math.nan
    return 1 - (after[0] - before[0]) / (after[1] - before[1])


def cpu_by_role(stack: Stack, fake: subprocess.Popen[bytes]) -> CpuByRole:
    """CPU seconds so far of the stack's processes by role, and of the fake model server."""
    snapshot = CpuByRole.snapshot(stack.family())
    with contextlib.suppress(psutil.Error):
        snapshot.seconds["model"] = cpu_seconds([psutil.Process(fake.pid)])
    return snapshot


async def run_level(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    fake_url: str,
    c: int,
    per_user: int,
    latency: float,
    cpu_now: Callable[[], CpuByRole],
) -> dict[str, Any]:
    await client.post(f"{fake_url}/fake/stats")  # reset the peak
    cpu_before = machine_cpu()
    by_role_before = cpu_now()
    body = chunks_for(c, c, per_user)
    for start in range(0, len(body), 100):
        response = await client.post("/v1/chunks/batch", json={"chunks": body[start : start + 100]})
        response.raise_for_status()
    deadline = time.monotonic() + 120 + 4 * per_user * latency
    prefix = f"l{c}-u%"
    in_flight: list[int] = []  # calls the model server holds, sampled every 0.1 s once the first arrived
    # The poll counts the level's unfinished chunks through the service's own partial index, so that
    # the benchmark's watching costs Postgres next to nothing; its figures are read once, at the end.
    # (Aggregating the level's spans on every poll cost 3 ms a time: at 128 chunks/s, 0.2 ms of the
    # Postgres CPU per chunk reported below.)
    while True:
        now = (await client.get(f"{fake_url}/fake/stats")).json()["in_flight"]
        if in_flight or now:
            in_flight.append(now)
        unfinished = await conn.fetchval(
            "SELECT count(*) FROM chunks WHERE status IN ('queued', 'processing') AND user_id LIKE $1", prefix
        )
        if unfinished == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    cpu_busy = machine_busy(cpu_before, machine_cpu())
    by_role = (cpu_now() - by_role_before).seconds
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE status IN ('applied','failed')) AS done,"
        " count(*) FILTER (WHERE status = 'failed') AS failed,"
        " extract(epoch FROM max(applied_at) - min(received_at)) AS window_s,"
        " (SELECT avg(span) FROM (SELECT extract(epoch FROM max(applied_at) - min(received_at)) AS span"
        "   FROM chunks WHERE user_id LIKE $1 GROUP BY user_id) AS spans) AS mean_span_s"
        " FROM chunks WHERE user_id LIKE $1",
        prefix,
    )
    stats = (await client.post(f"{fake_url}/fake/stats")).json()
    window = float(row["window_s"] or math.nan)
    mean_span = float(row["mean_span_s"] or math.nan)
    ideal = c / latency
    fraction = per_user * latency / mean_span
    return {
        "in_flight": c,
        "chunks": len(body),
        "finished": row["done"],
        "failed": row["failed"],
        "mean_user_span_s": mean_span,
        "applied_per_s": ideal * fraction,
        "ideal_per_s": ideal,
        "fraction_of_ideal": fraction,
        "window_s": window,
        "applied_per_s_in_window": row["done"] / window if window else math.nan,
        "peak_calls_in_flight": stats["max_in_flight"],
        "machine_cpu_busy": cpu_busy,
        "mean_calls_in_flight": sum(in_flight) / len(in_flight) if in_flight else 0.0,
        "model_calls": stats["requests"],
        # CPU milliseconds per finished chunk, by process role ("supervisor": `memstore up` itself).
        "cpu_ms_per_chunk": {
            role: 1000 * seconds / max(1, row["done"]) for role, seconds in sorted(by_role.items())
        },
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(x) for x in args.levels.split(",")]
    top = max(levels)
    jobs_per_worker = math.ceil(top / args.workers) + 8
    fake, fake_url = start_fake_model(args.latency)
    env = {
        "MEMSTORE_WRITER": "openai",
        "MEMSTORE_WRITER_PROFILE": "simple",
        "MEMSTORE_WRITER_BASE_URL": f"{fake_url}/v1",
        "MEMSTORE_WRITER_MODEL": "hy-memory",
        "MEMSTORE_WRITER_MAX_CONCURRENCY": str(jobs_per_worker),
        "MEMSTORE_WORKER_MAX_JOBS": str(jobs_per_worker),
        "MEMSTORE_LOG_LEVEL": args.log_level,
        **settings_of(args.env),
    }
    rows = []
    try:
        with running_stack(workers=args.workers, log_level=args.log_level, env_overrides=env) as stack:
            key = stack.create_key("bench-writer", ("ingest", "read"))
            conn = await asyncpg.connect(stack.dsn)
            if args.without_ann_index:  # an experiment: what the write path costs without the graph insert
                await conn.execute("DROP INDEX ix_memories_embedding_hnsw")
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=60) as client:
                for c in levels:
                    row = await run_level(
                        client,
                        conn,
                        fake_url,
                        c,
                        args.chunks_per_user,
                        args.latency,
                        lambda: cpu_by_role(stack, fake),
                    )
                    rows.append(row)
                    print_row(row)
            await conn.close()
    finally:
        fake.terminate()
        fake.wait(10)
    return {
        "without_ann_index": args.without_ann_index,
        "latency_s": args.latency,
        "workers": args.workers,
        "jobs_per_worker": jobs_per_worker,
        "chunks_per_user": args.chunks_per_user,
        "levels": rows,
    }


def print_row(row: dict[str, Any]) -> None:
    print(
        f"  {row['in_flight']:>4} in flight: {row['applied_per_s']:7.1f} applied/s of"
        f" {row['ideal_per_s']:6.1f} ideal = {100 * row['fraction_of_ideal']:5.1f} %"
        f"  (calls at once: mean {row['mean_calls_in_flight']:.0f}, peak {row['peak_calls_in_flight']};"
        " window incl. posting"
        f" {row['window_s']:.2f} s = {row['applied_per_s_in_window']:.1f}/s; {row['failed']} failed;"
        f" machine CPU {100 * row['machine_cpu_busy']:.0f} % busy)",
        flush=True,
    )
    cpu = row["cpu_ms_per_chunk"]
    print(
        "        CPU ms per chunk: "
        + ", ".join(f"{role} {ms:.1f}" for role, ms in cpu.items())
        + f" (all {sum(cpu.values()):.1f})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latency", type=float, default=1.0, help="seconds the fake model takes per call")
    parser.add_argument("--levels", default=DEFAULT_LEVELS, help="in-flight levels, comma-separated")
    parser.add_argument("--chunks-per-user", type=int, default=5, help="chunks each user writes in sequence")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--log-level", default="WARNING", help="MEMSTORE_LOG_LEVEL of the service")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--without-ann-index",
        action="store_true",
        help="experiment: drop the HNSW index over memories first (search across users then scans)",
    )
    add_settings_option(parser)
    args = parser.parse_args()
    print(
        f"LLM writer: fake model at {args.latency:g} s/call, {args.workers} worker process(es), "
        f"{args.chunks_per_user} chunks per user",
        flush=True,
    )
    result = asyncio.run(measure(args))
    worst = min(r["fraction_of_ideal"] for r in result["levels"])
    verdict = "met" if worst >= GOAL else "NOT met"
    print(f"\n  lowest fraction of ideal: {100 * worst:.1f} % (goal >= {100 * GOAL:.0f} %: {verdict})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
