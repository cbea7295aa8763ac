"""Fair shares of the writer fleet: does one tenant's flood hold the others back?

Runs `memstore up --workers 2` with the `openai` writer (`simple` profile: one model call a chunk) at the
fake model server answering every call after `--latency` s (0.2), the `hashing` embedder, and no rate
limits, so every chunk is accepted. Tenants are made with `memstore tenants create`. Latencies are the
database's (a chunk's `applied_at - received_at`); throughputs a tenant's chunks over the window from
its first received to its last applied.

1. idle: tenants B and C post `--small` chunks each (one user a chunk), spread over a few seconds;
2. A alone: tenant A floods `--flood` chunks over `--users` users (`/v1/chunks/batch`, 100 a batch);
3. flood: A floods again while B and C post their chunks again, spread over the flood;
4. weights: A at `write_weight` 3 and B at 1, both backlogged (`--flood` / 2 chunks each): the chunks
   each has applied while both still wait (skipped where the service has no `write_weight`);
5. one tenant: a user's `--import` chunks posted as a backfill (`priority: backfill` where the service
   has it), while the same tenant's other users post `--small` chunks.

Goals: B's and C's p99 in the flood <= 2 x their idle p99 + one model call; A's throughput in the flood
>= 90 % of A alone; applied A:B within 10 % of 3:1; phase 5's users as phase 3's bound.

Usage: python bench/fairness.py [--latency 0.2] [--flood 3000] [--users 300] [--small 10]
                                [--import 2000] [--workers 2] [--json out.json] [--env MEMSTORE_X=V ...]
Run it against another checkout of the service with PYTHONPATH=<that checkout> (what is measured is the
code `python -m app` finds).
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from typing import Any

import asyncpg
import httpx
from _stack import (
    ROOT,
    Stack,
    add_stack_options,
    bench_parser,
    conclude,
    running_stack,
    settings_of,
    write_figures,
)
from writer import start_fake_model

WEIGHTS = (3.0, 1.0)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (of 10 values, p99 is the largest)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def create_tenant(stack: Stack, name: str) -> dict[str, str]:
    """`memstore tenants create NAME` against the stack's database: its admin key's headers."""
    env = {
        **stack.env,
        "MEMSTORE_DATABASE_URL": stack.database_url,
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    out = subprocess.run(
        [sys.executable, "-m", "app", "tenants", "create", name],
        env=env,
        cwd=stack.data_dir.parent,
        capture_output=True,
        check=True,
        text=True,
    )
    return {"Authorization": f"Bearer {out.stdout.strip().splitlines()[-1]}"}


def chunk(user: str, n: int) -> dict[str, Any]:
    return {
        "user_id": user,
        "messages": [{"role": "user", "content": f"My note {n}: I like item {user}-{n}."}],
    }


async def post_flood(
    client: httpx.AsyncClient, headers: dict[str, str], prefix: str, total: int, users: int, **batch: Any
) -> bool:
    """`total` chunks over `users` users in batches of 100, each user's in order. Whether the service took
    the batch's extra fields (`batch`), else they were left out."""
    body = [chunk(f"{prefix}{i % users}", i // users) for i in range(total)]
    taken = True
    for start in range(0, total, 100):
        payload = {"chunks": body[start : start + 100], **(batch if taken else {})}
        response = await client.post("/v1/chunks/batch", json=payload, headers=headers)
        if response.status_code == 422 and batch and taken:
            taken = False  # a service without the field
            response = await client.post(
                "/v1/chunks/batch", json={"chunks": payload["chunks"]}, headers=headers
            )
        response.raise_for_status()
    return taken


async def post_spread(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    prefix: str,
    n: int,
    over_s: float,
    start_s: float = 0.0,
) -> None:
    """`n` chunks of `n` users, one every `over_s / n` seconds after `start_s`."""
    await asyncio.sleep(start_s)  # when they arrive, as a chat app's users do: time itself must pass
    for i in range(n):
        response = await client.post("/v1/chunks", json=chunk(f"{prefix}{i}", 0), headers=headers)
        response.raise_for_status()
        await asyncio.sleep(over_s / n)


async def wait_done(conn: asyncpg.Connection, prefix: str, total: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = await conn.fetchval(
            "SELECT count(*) FROM chunks WHERE user_id LIKE $1 AND status IN ('applied', 'failed')",
            prefix + "%",
        )
        if done >= total:
            return
        await asyncio.sleep(0.2)
    msg = f"{prefix}: not all {total} chunks finished in {timeout_s:.0f} s"
    raise TimeoutError(msg)


async def latencies(conn: asyncpg.Connection, prefix: str) -> list[float]:
    rows = await conn.fetch(
        "SELECT extract(epoch FROM applied_at - received_at) AS s FROM chunks WHERE user_id LIKE $1"
        " AND status = 'applied'",
        prefix + "%",
    )
    return [float(r["s"]) for r in rows]


async def throughput(conn: asyncpg.Connection, prefix: str) -> float:
    row = await conn.fetchrow(
        "SELECT count(*) AS n, extract(epoch FROM max(applied_at) - min(received_at)) AS s FROM chunks"
        " WHERE user_id LIKE $1 AND status = 'applied'",
        prefix + "%",
    )
    return float(row["n"]) / float(row["s"] or math.nan)


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_s": percentile(values, 0.5), "p99_s": percentile(values, 0.99)}


async def phase_weights(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    a: dict[str, str],
    b: dict[str, str],
    per: int,
    users: int,
) -> dict[str, Any] | None:
    """A at weight 3, B at 1, both flooding: the chunks each applied while both still had a third left."""
    for headers, weight in zip((a, b), WEIGHTS, strict=True):
        response = await client.patch("/v1/admin/settings", json={"write_weight": weight}, headers=headers)
        if response.status_code != 200:
            return None  # a service without weights
    await asyncio.gather(
        post_flood(client, a, "wa", per, users // 2), post_flood(client, b, "wb", per, users // 2)
    )
    best: tuple[int, int] | None = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        rows = await conn.fetch(
            "SELECT left(user_id, 2) AS t, count(*) FILTER (WHERE status = 'applied') AS n FROM chunks"
            " WHERE user_id LIKE 'w%' GROUP BY 1"
        )
        applied = {r["t"]: int(r["n"]) for r in rows}
        wa, wb = applied.get("wa", 0), applied.get("wb", 0)
        if max(wa, wb) > per * 2 // 3:  # one has less than a third left: no longer both backlogged
            break
        best = (wa, wb)
        await asyncio.sleep(0.5)
    await wait_done(conn, "w", 2 * per, 900)
    if best is None or best[1] == 0:
        return {"applied_a": best[0] if best else 0, "applied_b": 0, "ratio": math.nan}
    return {"applied_a": best[0], "applied_b": best[1], "ratio": best[0] / best[1]}


async def measure(args: Any) -> dict[str, Any]:
    fake, fake_url = start_fake_model(args.latency)
    env = {
        "MEMSTORE_WRITER": "openai",
        "MEMSTORE_WRITER_PROFILE": "simple",
        "MEMSTORE_WRITER_BASE_URL": f"{fake_url}/v1",
        "MEMSTORE_WRITER_MODEL": "hy-memory",
        "MEMSTORE_EMBEDDER": "hashing",
        "MEMSTORE_TENANT_WRITE_WEIGHT_MAX": str(max(WEIGHTS)),
        **settings_of(args.env),
    }
    result: dict[str, Any] = {
        "latency_s": args.latency,
        "workers": args.workers,
        "code": os.environ.get("PYTHONPATH") or str(ROOT),
    }
    try:
        with running_stack(workers=args.workers, log_level=args.log_level, env_overrides=env) as stack:
            tenants = {name: create_tenant(stack, name) for name in ("a", "b", "c", "d")}
            conn = await asyncpg.connect(stack.dsn)
            async with httpx.AsyncClient(base_url=stack.base_url, timeout=120) as client:
                spread_s = 4.0
                await asyncio.gather(
                    post_spread(client, tenants["b"], "ib", args.small, spread_s),
                    post_spread(client, tenants["c"], "ic", args.small, spread_s),
                )
                await wait_done(conn, "i", 2 * args.small, 120)
                idle = {"b": summary(await latencies(conn, "ib")), "c": summary(await latencies(conn, "ic"))}
                print(
                    f"  idle: B p50 {idle['b']['p50_s']:.2f} s p99 {idle['b']['p99_s']:.2f} s;"
                    f" C p50 {idle['c']['p50_s']:.2f} s p99 {idle['c']['p99_s']:.2f} s",
                    flush=True,
                )

                started = time.monotonic()
                await post_flood(client, tenants["a"], "aa", args.flood, args.users)
                await wait_done(conn, "aa", args.flood, 1800)
                alone_s = time.monotonic() - started
                alone = await throughput(conn, "aa")
                print(f"  A alone: {alone:.1f} chunks/s ({args.flood} in {alone_s:.1f} s)", flush=True)

                await asyncio.gather(
                    post_flood(client, tenants["a"], "fa", args.flood, args.users),
                    post_spread(client, tenants["b"], "fb", args.small, 0.8 * alone_s, 0.1 * alone_s),
                    post_spread(client, tenants["c"], "fc", args.small, 0.8 * alone_s, 0.1 * alone_s),
                )
                await wait_done(conn, "f", args.flood + 2 * args.small, 1800)
                flood = {
                    "b": summary(await latencies(conn, "fb")),
                    "c": summary(await latencies(conn, "fc")),
                    "a_per_s": await throughput(conn, "fa"),
                }
                print(
                    f"  flood: B p50 {flood['b']['p50_s']:.2f} s p99 {flood['b']['p99_s']:.2f} s;"
                    f" C p50 {flood['c']['p50_s']:.2f} s p99 {flood['c']['p99_s']:.2f} s;"
                    f" A {flood['a_per_s']:.1f} chunks/s = {100 * flood['a_per_s'] / alone:.0f} % of alone",
                    flush=True,
                )

                weights = await phase_weights(
                    client, conn, tenants["a"], tenants["b"], args.flood // 2, args.users
                )
                if weights is None:
                    print("  weights: the service has no write_weight", flush=True)
                else:
                    print(
                        f"  weights 3:1: applied A {weights['applied_a']}, B {weights['applied_b']}"
                        f" = {weights['ratio']:.2f} : 1 while both waited",
                        flush=True,
                    )

                # One tenant: a user's import (a backfill) and the same tenant's live users.
                importing = asyncio.create_task(
                    post_flood(client, tenants["d"], "di", args.imports, 1, priority="backfill")
                )
                await asyncio.sleep(2.0)  # the import under way: time itself must pass
                await post_spread(client, tenants["d"], "dl", args.small, spread_s)
                backfill_taken = await importing
                await wait_done(conn, "dl", args.small, 300)
                inside = summary(await latencies(conn, "dl"))
                print(
                    f"  one tenant, a {args.imports}-chunk import under way: its other users p50"
                    f" {inside['p50_s']:.2f} s p99 {inside['p99_s']:.2f} s"
                    f" (backfill priority {'taken' if backfill_taken else 'not known'})",
                    flush=True,
                )
            await conn.close()
    finally:
        fake.terminate()
        fake.wait(10)
    result |= {
        "idle": idle,
        "a_alone_per_s": alone,
        "flood": flood,
        "weights": weights,
        "one_tenant": inside,
        "backfill_priority": backfill_taken,
    }
    return result


def verdict(result: dict[str, Any], latency: float) -> list[str]:
    problems = []
    for name in ("b", "c"):
        bound = 2 * result["idle"][name]["p99_s"] + latency
        if not result["flood"][name]["p99_s"] <= bound:
            problems.append(f"{name.upper()}'s p99 {result['flood'][name]['p99_s']:.2f} s > {bound:.2f} s")
    share = result["flood"]["a_per_s"] / result["a_alone_per_s"]
    if share < 0.9:
        problems.append(f"A's throughput in the flood {100 * share:.0f} % of alone")
    weights = result["weights"]
    if weights is None or not abs(weights["ratio"] / 3 - 1) <= 0.1:
        problems.append(f"weights: {weights}")
    bound = 2 * max(result["idle"][n]["p99_s"] for n in "bc") + latency
    if not result["one_tenant"]["p99_s"] <= bound:
        problems.append(f"one tenant's live users p99 {result['one_tenant']['p99_s']:.2f} s > {bound:.2f} s")
    return problems


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the fake model takes a call")
    parser.add_argument("--flood", type=int, default=3000, help="tenant A's chunks")
    parser.add_argument("--users", type=int, default=300, help="tenant A's users")
    parser.add_argument("--small", type=int, default=10, help="B's and C's chunks (one user each)")
    parser.add_argument("--import", dest="imports", type=int, default=2000, help="one user's import, phase 5")
    add_stack_options(parser, workers=2, log_level="WARNING")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    write_figures(result, args.json)
    conclude(verdict(result, args.latency), "every goal met")


if __name__ == "__main__":
    main()
