"""Pickup: how soon an idle worker starts a new chunk, with the API's wake-ups and without them.

`memstore up --workers 1` (offline writer, hashing embedder), twice in one run: with
`MEMSTORE_WORKER_WAKE=true` (the default) and `false` (the worker finds work only at its next poll,
`MEMSTORE_WORKER_POLL_DELAY_S`, 0.5 s by default). For each: the worker's CPU over a stretch of idle
seconds, then chunks of new users posted one at a time, each after the worker has been idle a random
0.2-0.8 s, and from the database, each chunk's time from its commit (`received_at`, when the post is
acknowledged) to its apply (`applied_at`). Offline writer: the apply itself is a few milliseconds.
Each post is followed at once by `GET /v1/chunks/{id}?wait=5` (read-your-writes): how long after the
acknowledgement the client reads the chunk applied, and how much of that is past the apply.

Usage: python bench/pickup.py [--chunks 40] [--idle-s 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._stack import cpu_seconds, running_stack


async def ack_to_applied_ms(dsn: str, chunk_ids: list[str]) -> list[float]:
    conn = await asyncpg.connect(dsn)
    try:
        for _ in range(600):
            rows = await conn.fetch(
                "SELECT status, extract(epoch FROM applied_at - received_at) * 1000 AS ms FROM chunks"
                " WHERE id = ANY($1::uuid[])",
                chunk_ids,
            )
            if len(rows) == len(chunk_ids) and all(r["status"] == "applied" for r in rows):
                return sorted(float(r["ms"]) for r in rows)
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    msg = "chunks were not all applied within a minute"
    raise SystemExit(msg)


def measure(wake: bool, args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "MEMSTORE_WORKER_WAKE": "true" if wake else "false",
        "MEMSTORE_WRITER": "offline",
        "MEMSTORE_EMBEDDER": "hashing",
    }
    rng = random.Random(7)
    with running_stack(workers=1, log_level="WARNING", env_overrides=env) as stack:
        key = stack.create_key()
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=stack.base_url, headers=headers, timeout=30) as client:

            def post(user: str) -> str:
                response = client.post(
                    "/v1/chunks",
                    json={"user_id": user, "messages": [{"role": "user", "content": "I live in Oslo."}]},
                )
                response.raise_for_status()
                return str(response.json()["chunk_id"])

            asyncio.run(ack_to_applied_ms(stack.dsn, [post(f"warm-{i}") for i in range(3)]))
            time.sleep(2)
            workers = stack.processes("worker")
            before = cpu_seconds(workers)
            time.sleep(args.idle_s)
            idle_cpu = (cpu_seconds(workers) - before) / args.idle_s
            ids, reads = [], []
            for i in range(args.chunks):
                time.sleep(rng.uniform(0.2, 0.8))
                ids.append(post(f"user-{i}"))
                acknowledged = time.monotonic()
                read = client.get(f"/v1/chunks/{ids[-1]}", params={"wait": 5}).json()
                reads.append(
                    (time.monotonic() - acknowledged) * 1000 if read["status"] == "applied" else None
                )
        waits = asyncio.run(ack_to_applied_ms(stack.dsn, ids))
    read_ms = sorted(r for r in reads if r is not None)
    return {
        "wake": wake,
        "chunks": len(waits),
        "p50_ms": statistics.median(waits),
        "p90_ms": waits[int(0.9 * (len(waits) - 1))],
        "max_ms": waits[-1],
        "idle_worker_cpu_pct": 100 * idle_cpu,
        "read_applied_p50_ms": statistics.median(read_ms) if read_ms else None,
        "read_applied_p90_ms": read_ms[int(0.9 * (len(read_ms) - 1))] if read_ms else None,
        "reads_applied": len(read_ms),
        "workers": len(workers),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--idle-s", type=float, default=15.0, help="seconds of idle worker CPU measured")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [measure(wake, args) for wake in (True, False)]
    for r in results:
        print(
            f"wake-ups {'on ' if r['wake'] else 'off'}: ack -> applied p50 {r['p50_ms']:.1f} ms,"
            f" p90 {r['p90_ms']:.1f} ms, max {r['max_ms']:.1f} ms ({r['chunks']} chunks);"
            f" idle worker CPU {r['idle_worker_cpu_pct']:.2f} % of a core"
        )
        if r["read_applied_p50_ms"] is not None:
            print(
                f"    ack -> read applied (GET ?wait=5): p50 {r['read_applied_p50_ms']:.1f} ms,"
                f" p90 {r['read_applied_p90_ms']:.1f} ms ({r['reads_applied']} of {r['chunks']} read applied)"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
