"""The admin console's reads on a user with 10,000 memories against one with 100, back to back.

On a fresh `memstore up --workers 0`, user `small` gets `--small` memories and user `big` `--big`,
each added and then rewritten once (two versions each, so a time T0 between the two rounds has an
older bank), through `apply_ops` as workers write; 200 more users have one memory each. Then, over
HTTP with the admin key, each call the console makes to show a user is timed `--runs` times for both
users, alternating:

- users: `GET /v1/admin/users?prefix=…&limit=50` (find a user);
- bank: `GET /v1/memories?user_id=…&limit=50`, the first page, and a page deep in the bank (the page
  after the cursor of the last memory but 50);
- as_of: `GET /v1/memories?user_id=…&as_of=T0&limit=50` (the time control);
- explain: `GET /v1/memories/{id}/explain` of one memory (its timeline);
- counts: `GET /v1/admin/changesets/counts?user_id=…` (changesets by writer and model).

It prints p50 / p90 per call and user, and the ratio big / small: a page costs about the same however
large the bank, which is what keeps the console fast on large banks.

Usage: python bench/console.py [--small 100] [--big 10000] [--runs 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
from _stack import running_stack
from history import Seeder, summary


async def page_cursor_near_end(client: httpx.AsyncClient, user: str) -> str | None:
    """The cursor of the page of 50 that ends the bank (walked once with pages of 1,000)."""
    cursor, last_cursor = None, None
    while True:
        params = {"user_id": user, "limit": "1000", **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/memories", params=params)).json()
        if page["next_cursor"] is None:
            break
        last_cursor, cursor = cursor, page["next_cursor"]
    params = {"user_id": user, "limit": "950", **({"cursor": last_cursor} if last_cursor else {})}
    return (await client.get("/v1/memories", params=params)).json()["next_cursor"]


async def measure(args: argparse.Namespace, base_url: str, headers: dict[str, str], seeder: Seeder) -> Any:
    await seeder.start()
    started = time.perf_counter()
    for user, size in (("small", args.small), ("big", args.big)):
        await seeder.add(user, size)
    t0 = await seeder.now()
    for user in ("small", "big"):
        await seeder.rewrite(user, await seeder.heads(user), 1)
    for i in range(200):
        await seeder.add(f"user-{i:03d}", 1)
    await seeder.vacuum()
    print(f"seeded in {time.perf_counter() - started:.1f} s", flush=True)

    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as client:
        calls: dict[str, dict[str, tuple[str, dict[str, str]]]] = {}
        for user in ("small", "big"):
            memory_id = (await seeder.heads(user))[len(await seeder.heads(user)) // 2][0]
            deep = await page_cursor_near_end(client, user)
            calls[user] = {
                "users": ("/v1/admin/users", {"prefix": user[:2], "limit": "50"}),
                "bank_first_page": ("/v1/memories", {"user_id": user, "limit": "50"}),
                "bank_deep_page": (
                    "/v1/memories",
                    {"user_id": user, "limit": "50", **({"cursor": deep} if deep else {})},
                ),
                "as_of_page": ("/v1/memories", {"user_id": user, "limit": "50", "as_of": t0.isoformat()}),
                "explain": (f"/v1/memories/{memory_id}/explain", {}),
                "changeset_counts": ("/v1/admin/changesets/counts", {"user_id": user}),
            }
        times: dict[str, dict[str, list[float]]] = {u: {name: [] for name in calls[u]} for u in calls}
        for _ in range(args.runs):
            for name in calls["small"]:
                for user in ("small", "big"):
                    path, params = calls[user][name]
                    t = time.perf_counter()
                    response = await client.get(path, params=params)
                    times[user][name].append(time.perf_counter() - t)
                    response.raise_for_status()
    return {
        user: {name: summary(values) for name, values in by_call.items()} for user, by_call in times.items()
    }


async def run(args: argparse.Namespace) -> Any:
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
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--big", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--log-level", default="WARNING", help="MEMSTORE_LOG_LEVEL of the service")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(f"\n{'call':<18} {'small p50':>10} {'big p50':>10} {'big p90':>10} {'big/small':>10}   (ms)")
    for name, small in results["small"].items():
        big = results["big"][name]
        ratio = big["p50_ms"] / small["p50_ms"] if small["p50_ms"] else float("nan")
        print(f"{name:<18} {small['p50_ms']:>10} {big['p50_ms']:>10} {big['p90_ms']:>10} {ratio:>10.2f}")
    print(f"small: {args.small:,} memories, big: {args.big:,} memories; {args.runs} runs each, alternating")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
