"""An embeddings server stopped for a minute mid-run, as an operator sees it: no chunk lost, none failed.

Runs `memstore up` with the `openai` embedder pointed at the fake model server (its own process, real
HTTP), the default (offline) writer, and `MEMSTORE_MAX_ATTEMPTS=3` (`--max-attempts`), so that an
outage that counted attempts would fail chunks within seconds. `--users` users post one chunk each,
in turn, at a steady `--rate` chunks/s in all, each user's chunks in order. After `--before-s`
seconds the embeddings server is stopped; `--outage-s` seconds later it is started again on the same
port; posting goes on for `--after-s` more seconds, then the run waits until every accepted chunk is
finished, or `--deadline-s` after the server's return.

Every chunk states a first-person fact ("I live in Oslo.") that the offline writer extracts, so every
chunk needs the embedder (for its candidates and its new memory). LoCoMo turns are not used here:
most of them state nothing the offline writer extracts, and such a chunk never calls the embedder.

Every `--sample-s` seconds it reads the chunks table: chunks waiting (queued or processing), how many
of them carry an error, the most common one, the most attempts among them; and, as a client sees it,
`GET /v1/chunks/{id}` of the oldest waiting chunk that has an error. At the end: chunks by status;
from the server's return, when the first chunk was applied, when every chunk received before the
return was finished (the backlog) and when every chunk was; and the attempts of the chunks that
waited through the outage (received before the return, unfinished when the server stopped).

Exits 1 if a chunk ended `failed`, a chunk was unfinished at the deadline, a post was refused, or no
waiting chunk showed the embedder's error during the outage: the script is itself a check.

Usage: python bench/embedder_outage.py [--users 50] [--rate 10] [--before-s 10] [--outage-s 60]
                                       [--after-s 10] [--deadline-s 150] [--sample-s 5]
                                       [--max-attempts 3] [--workers 1] [--json out.json]
                                       [--env MEMSTORE_X=V ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
from _stack import (
    FakeModelServer,
    Stack,
    add_stack_options,
    bench_parser,
    conclude,
    running_stack,
    settings_of,
    write_figures,
)

ERROR_CHARS = 240  # of an error, in the printed report

_TEMPLATES = [
    "I live in {city}.",
    "I like {hobby}.",
    "I mainly use {language}.",
    "My {relative}'s name is {name}.",
    "I work at {company}.",
    "I'm allergic to {food}.",
    "My favorite color is {color}.",
    "I moved to {city} last month.",
    "I don't like {hobby} anymore.",
]
_WORDS = {
    "city": ["Oslo", "Lyon", "Porto", "Osaka", "Denver", "Glasgow", "Austin", "Lisbon"],
    "hobby": ["jazz", "hiking", "chess", "pottery", "cycling", "baking"],
    "language": ["Python", "Rust", "Go", "Kotlin", "TypeScript"],
    "relative": ["daughter", "son", "brother", "sister"],
    "name": ["Mia", "Ana", "Jonas", "Priya", "Tom", "Lena"],
    "company": ["Acme", "Globex", "Initech", "Umbrella"],
    "food": ["peanuts", "shellfish", "sesame", "gluten"],
    "color": ["green", "blue", "orange", "purple"],
}


def user_chunk(user_id: str, i: int, rng: random.Random) -> dict[str, Any]:
    """The user's `i`-th chunk: a fact in the first person and the assistant's acknowledgement."""
    fact = _TEMPLATES[i % len(_TEMPLATES)].format(**{k: rng.choice(v) for k, v in _WORDS.items()})
    return {
        "user_id": user_id,
        "messages": [{"role": "user", "content": fact}, {"role": "assistant", "content": "Got it."}],
    }


# --- the clients -----------------------------------------------------------------------------------


@dataclass
class Posting:
    """What the clients did: chunk ids accepted, answers by phase of the outage."""

    accepted: list[str] = field(default_factory=list)
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)  # (phase, status or error)
    first_refusal: str | None = None


@dataclass
class Clock:
    """When the embeddings server went away and came back (epoch seconds; None: not yet)."""

    stopped: float | None = None
    returned: float | None = None

    def phase(self, at: float) -> str:
        if self.stopped is None or at < self.stopped:
            return "before"
        return "outage" if self.returned is None or at < self.returned else "after"


async def post_steadily(
    stack: Stack, key: str, args: argparse.Namespace, clock: Clock, posting: Posting
) -> None:
    """Each user posts a chunk every `users / rate` seconds, users staggered evenly, until the
    posting time is over; a user's next chunk waits for the answer to its previous one (in order)."""
    interval = args.users / args.rate
    until = time.monotonic() + args.before_s + args.outage_s + args.after_s
    async with httpx.AsyncClient(
        base_url=stack.base_url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
        limits=httpx.Limits(max_connections=args.users),
    ) as client:

        async def user(u: int) -> None:
            user_id, rng = f"outage-u{u:03d}", random.Random(u)
            due = time.monotonic() + u * interval / args.users
            i = 0
            while due < until:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                phase = clock.phase(time.time())
                try:
                    response = await client.post("/v1/chunks", json=user_chunk(user_id, i, rng))
                except httpx.HTTPError as exc:
                    posting.answers[phase, type(exc).__name__] += 1
                    posting.first_refusal = posting.first_refusal or repr(exc)
                else:
                    posting.answers[phase, str(response.status_code)] += 1
                    if response.status_code == 202:
                        posting.accepted.append(str(response.json()["chunk_id"]))
                    else:
                        posting.first_refusal = posting.first_refusal or (
                            f"{response.status_code} {response.text[:300]}"
                        )
                i += 1
                due += interval

        await asyncio.gather(*(user(u) for u in range(args.users)))


# --- what the operator looks at --------------------------------------------------------------------

_PENDING = "status IN ('queued', 'processing')"


async def sample(
    conn: asyncpg.Connection, client: httpx.AsyncClient, at: float, phase: str
) -> dict[str, Any]:
    """The queue as the chunks table and `GET /v1/chunks/{id}` show it now."""
    row = await conn.fetchrow(
        f"SELECT count(*) FILTER (WHERE {_PENDING}) AS waiting,"
        f" count(*) FILTER (WHERE {_PENDING} AND last_error IS NOT NULL) AS with_error,"
        f" max(attempts) FILTER (WHERE {_PENDING}) AS max_attempts,"
        " count(*) FILTER (WHERE status = 'applied') AS applied,"
        " count(*) FILTER (WHERE status = 'failed') AS failed FROM chunks"
    )
    common = await conn.fetchrow(
        f"SELECT last_error, count(*) AS n FROM chunks WHERE {_PENDING} AND last_error IS NOT NULL"
        " GROUP BY last_error ORDER BY n DESC LIMIT 1"
    )
    oldest = await conn.fetchval(
        f"SELECT id FROM chunks WHERE {_PENDING} AND last_error IS NOT NULL ORDER BY received_at LIMIT 1"
    )
    shown = None
    if oldest is not None:
        answer = await client.get(f"/v1/chunks/{oldest}")
        if answer.status_code == 200:
            body = answer.json()
            shown = {k: body[k] for k in ("chunk_id", "status", "attempts", "error")}
    return {
        "t_s": at,
        "phase": phase,
        **{k: int(row[k] or 0) for k in ("waiting", "with_error", "max_attempts", "applied", "failed")},
        "most_common_error": common["last_error"] if common else None,
        "most_common_error_chunks": int(common["n"]) if common else 0,
        "oldest_waiting_via_api": shown,
    }


def print_sample(s: dict[str, Any]) -> None:
    error = s["most_common_error"]
    shown = f'; most common error ({s["most_common_error_chunks"]}): "{_short(error)}"' if error else ""
    print(
        f"  {s['t_s']:6.1f} s  {s['phase']:<6}  waiting {s['waiting']:>4} ({s['with_error']} with an error),"
        f" max attempts {s['max_attempts']}; applied {s['applied']:>4}, failed {s['failed']}{shown}",
        flush=True,
    )


def _short(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


async def outcome(conn: asyncpg.Connection, clock: Clock) -> dict[str, Any]:
    """Chunks by status, the drain after the server's return, the attempts of those that waited."""
    stopped, returned = clock.stopped, clock.returned
    assert stopped is not None
    assert returned is not None
    statuses = {
        r["status"]: int(r["n"])
        for r in await conn.fetch("SELECT status, count(*) AS n FROM chunks GROUP BY 1")
    }
    # Received before the return, and not finished when the server stopped: they waited it out.
    waited = (
        "received_at < to_timestamp($2) AND (status IN ('queued', 'processing')"
        " OR coalesce(applied_at, updated_at) >= to_timestamp($1))"
    )
    attempts = {
        int(r["attempts"]): int(r["n"])
        for r in await conn.fetch(
            f"SELECT attempts, count(*) AS n FROM chunks WHERE {waited} GROUP BY 1 ORDER BY 1",
            stopped,
            returned,
        )
    }
    times = await conn.fetchrow(
        "SELECT extract(epoch FROM min(applied_at) FILTER (WHERE applied_at >= to_timestamp($2)))"
        "   AS first_applied,"
        " extract(epoch FROM max(applied_at) FILTER (WHERE received_at < to_timestamp($2))) AS backlog_done,"
        " extract(epoch FROM max(applied_at)) AS all_done,"
        " count(*) FILTER (WHERE status = 'applied' AND last_error IS NOT NULL) AS applied_with_error,"
        " count(*) FILTER (WHERE applied_at >= to_timestamp($1) AND applied_at < to_timestamp($2))"
        "   AS applied_during_outage"
        " FROM chunks",
        stopped,
        returned,
    )

    def since_return(epoch: Any) -> float | None:
        return float(epoch) - returned if epoch is not None else None

    return {
        "outage_s": returned - stopped,
        "statuses": statuses,
        "waited_through_outage": sum(attempts.values()),
        "attempts_of_those_that_waited": attempts,
        "first_applied_after_return_s": since_return(times["first_applied"]),
        "backlog_finished_after_return_s": since_return(times["backlog_done"]),
        "all_finished_after_return_s": since_return(times["all_done"]),
        "applied_during_outage": int(times["applied_during_outage"]),
        "applied_still_showing_an_error": int(times["applied_with_error"]),
    }


def log_events(stack: Stack, *names: str) -> dict[str, int]:
    """How often each structlog event appears in the service's log (JSON lines), and how many lines
    were logged at level error or above (a traceback the outage caused would be one)."""
    counts = dict.fromkeys([*names, "level error+"], 0)
    with contextlib.suppress(OSError), stack.log_file.open(errors="replace") as log:
        for line in log:
            for name in names:
                if f'"event": "{name}"' in line:
                    counts[name] += 1
            if '"level": "error"' in line or '"level": "critical"' in line:
                counts["level error+"] += 1
    return counts


# --- the run ---------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    embeddings = FakeModelServer()
    embeddings.start()
    env = {
        "MEMSTORE_EMBEDDER": "openai",
        "MEMSTORE_EMBEDDER_BASE_URL": embeddings.base_url,
        "MEMSTORE_MAX_ATTEMPTS": str(args.max_attempts),
        **settings_of(args.env),
    }
    clock, posting, samples = Clock(), Posting(), []
    try:
        with running_stack(workers=args.workers, log_level=args.log_level, env_overrides=env) as stack:
            key = stack.create_key("bench-embedder-outage", ("ingest", "read"))
            conn = await asyncpg.connect(stack.dsn)
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=30) as client:
                started = time.time()
                posters = asyncio.create_task(post_steadily(stack, key, args, clock, posting))

                async def sampler() -> None:
                    while True:
                        now = time.time()
                        s = await sample(conn, client, now - started, clock.phase(now))
                        samples.append(s)
                        print_sample(s)
                        await asyncio.sleep(args.sample_s)

                sampling = asyncio.create_task(sampler())
                await asyncio.sleep(args.before_s)
                await asyncio.to_thread(embeddings.stop)
                clock.stopped = time.time()
                print(f"  {clock.stopped - started:6.1f} s  -- embeddings server stopped", flush=True)
                await asyncio.sleep(args.outage_s)
                await asyncio.to_thread(embeddings.start)
                clock.returned = time.time()
                print(
                    f"  {clock.returned - started:6.1f} s  -- embeddings server back,"
                    f" on the same port ({embeddings.port})",
                    flush=True,
                )
                await posters
                deadline = clock.returned + args.deadline_s
                while time.time() < deadline:
                    pending = await conn.fetchval(f"SELECT count(*) FROM chunks WHERE {_PENDING}")
                    if pending == 0:
                        break
                    await asyncio.sleep(0.5)
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling
                final = await sample(conn, client, time.time() - started, "end")
                print_sample(final)
                result = await outcome(conn, clock)
            await conn.close()
            events = log_events(stack, "chunk.outage", "chunk.failed", "embedder.retry")
    finally:
        embeddings.stop()
    during = [s for s in samples if s["phase"] == "outage"]
    errors: Counter[str] = Counter()
    for s in during:
        if s["most_common_error"]:
            errors[s["most_common_error"]] += 1
    return {
        "settings": {
            **{
                k: getattr(args, k)
                for k in ("users", "rate", "before_s", "outage_s", "after_s", "workers", "max_attempts")
            },
            "deadline_s": args.deadline_s,
            "env": env | {"MEMSTORE_EMBEDDER_BASE_URL": "<fake embeddings server>"},
            "cpus": os.cpu_count(),
        },
        "posted": {
            "accepted": len(posting.accepted),
            "answers": {f"{phase} {status}": n for (phase, status), n in sorted(posting.answers.items())},
            "first_refusal": posting.first_refusal,
        },
        "during_outage": {
            "samples": len(during),
            "max_waiting": max((s["waiting"] for s in during), default=0),
            "max_waiting_with_error": max((s["with_error"] for s in during), default=0),
            "max_attempts_unfinished": max((s["max_attempts"] for s in during), default=0),
            "failed": max((s["failed"] for s in during), default=0),
            "most_common_error": errors.most_common(1)[0][0] if errors else None,
            "last_seen_via_api": next(
                (s["oldest_waiting_via_api"] for s in reversed(during) if s["oldest_waiting_via_api"]), None
            ),
        },
        "log_events": events,
        "samples": [*samples, final],
        **result,
        "unfinished": final["waiting"],
    }


def verdict(r: dict[str, Any]) -> list[str]:
    """What went wrong, if anything (empty: the service rode the outage out)."""
    problems = []
    failed = r["statuses"].get("failed", 0)
    if failed:
        problems.append(f"{failed} chunk(s) ended failed")
    if r["unfinished"]:
        problems.append(f"{r['unfinished']} chunk(s) unfinished at the deadline")
    refused = sum(n for k, n in r["posted"]["answers"].items() if not k.endswith(" 202"))
    if refused:
        problems.append(f"{refused} post(s) refused, first: {r['posted']['first_refusal']}")
    if not r["during_outage"]["max_waiting_with_error"]:
        problems.append("no waiting chunk showed an error during the outage")
    return problems


def print_report(r: dict[str, Any]) -> None:
    d = r["during_outage"]
    s = r["settings"]

    def secs(value: float | None) -> str:
        return f"{value:.1f} s" if value is not None else "-"

    shown = d["last_seen_via_api"]
    rows = [
        ("chunks accepted", f"{r['posted']['accepted']:,} ({s['users']} users, {s['rate']:g}/s)"),
        (
            "answers to posts (phase status: n)",
            ", ".join(f"{k}: {n}" for k, n in r["posted"]["answers"].items()),
        ),
        ("embeddings server down", f"{r['outage_s']:.1f} s"),
        (
            "most waiting during the outage",
            f"{d['max_waiting']:,} (at most {d['max_waiting_with_error']} with an error)",
        ),
        ("most common error on them", f'"{_short(d["most_common_error"])}"'),
        ("GET /v1/chunks/{id} of the oldest", json.dumps(shown) if shown else "-"),
        ("max attempts among unfinished", f"{d['max_attempts_unfinished']} (of {s['max_attempts']} allowed)"),
        ("applied while it was down", f"{r['applied_during_outage']:,}"),
        ("chunks by status at the end", ", ".join(f"{k} {n:,}" for k, n in sorted(r["statuses"].items()))),
        ("waited through the outage", f"{r['waited_through_outage']:,}"),
        (
            "  their attempts (attempts: chunks)",
            ", ".join(f"{a}: {n:,}" for a, n in r["attempts_of_those_that_waited"].items()),
        ),
        ("after the return: first applied", secs(r["first_applied_after_return_s"])),
        ("  backlog (received before) finished", secs(r["backlog_finished_after_return_s"])),
        ("  every chunk finished", secs(r["all_finished_after_return_s"])),
        ("applied chunks still showing an error", f"{r['applied_still_showing_an_error']}"),
        ("log events", ", ".join(f"{k} {n:,}" for k, n in r["log_events"].items())),
    ]
    print()
    for label, value in rows:
        print(f"    {label:<38} {value}")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--users", type=int, default=50, help="users posting, each in order")
    parser.add_argument("--rate", type=float, default=10.0, help="chunks per second, all users together")
    parser.add_argument("--before-s", type=float, default=10.0, help="seconds of posting before the outage")
    parser.add_argument("--outage-s", type=float, default=60.0, help="seconds the embeddings server is down")
    parser.add_argument("--after-s", type=float, default=10.0, help="seconds of posting after it is back")
    parser.add_argument(
        "--deadline-s", type=float, default=150.0, help="most seconds after its return to wait for the queue"
    )
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between looks at the queue")
    parser.add_argument(
        "--max-attempts",
        type=int,
        default=3,
        help="MEMSTORE_MAX_ATTEMPTS: few, so counted outages would show",
    )
    add_stack_options(parser, workers=1, log_level="INFO")
    args = parser.parse_args()
    print(
        f"embedder outage: {args.users} users at {args.rate:g} chunks/s; the embeddings server stops after"
        f" {args.before_s:g} s for {args.outage_s:g} s; MEMSTORE_MAX_ATTEMPTS={args.max_attempts},"
        f" {args.workers} worker process(es), offline writer; {os.cpu_count()} CPUs",
        flush=True,
    )
    result = asyncio.run(run(args))
    print_report(result)
    problems = verdict(result)
    result["problems"] = problems
    write_figures(result, args.json)
    conclude(problems, "every chunk applied, none failed, and the error was on the waiting chunks meanwhile")


if __name__ == "__main__":
    main()
