"""`memstore status`: one screen for an operator, read from Postgres and Redis, never from the API.

It works while the API is down. Postgres is read as the configured role (MEMSTORE_DATABASE_URL, else the
embedded stack's, `memstore up`'s if it runs): the service role sees one tenant at a time, so every
cross-tenant figure comes from a function of the tables' owner (migration 0013) that returns counts,
ages, writer names and error classes, never a tenant's content. Redis gives the wake-up jobs waiting
and the workers' heartbeats (`workers.settings.heartbeat`, every 10 s with a 30 s TTL). Each source is
bounded in time; one that does not answer is shown as such and the command exits 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.config import get_settings
from app.db.distribution import Distribution
from app.domain.system.repositories import FailedGroup, TenantStatus, WriterStats

if TYPE_CHECKING:
    from rich.table import Table

_DB_TIMEOUT_S = 10.0
_REDIS_TIMEOUT_S = 3.0

JSON_HELP = """Print one JSON object instead of tables. Its keys (stable; ages in seconds, 0 when none;
a section is null when its source did not answer):
generated_at; window_s; database, redis ("ok" or "unreachable (Error)");
distribution {kind ("single" or "citus"), citus (its version), workers, distributed [tables],
reference [tables], local [tenant tables not yet distributed]};
backlog {queued, processing, oldest_unapplied_age_s} (all tenants: the apply lag);
tenants [{tenant_id, tenant, queued, processing, oldest_unapplied_age_s, failed, reviews_waiting,
oldest_review_age_s, audit_unsealed, oldest_unsealed_age_s, audit_head_seq, audit_sealed}];
failed [{tenant_id, tenant, error, chunks, newest_at}] (error: its class, the head of the chunk's error);
writers [{writer, applied, failed, attempts, failed_attempts, error_rate, latency_p50_ms, latency_p95_ms,
apply_lag_p50_s, apply_lag_p95_s}] (chunks finished in the window);
reviews {waiting, oldest_age_s}; audit {unsealed, oldest_unsealed_age_s};
queue_jobs (arq jobs waiting in Redis: the crons); scopes_ready (scopes waiting for a worker slot in the
fair scheduler); tenants_paused (their daily token budget spent); workers_alive;
workers [{name, host, pid, max_jobs, jobs_running {job: n}, beat_age_s, up_s}]."""


@dataclass
class Status:
    """What `memstore status` shows; `as_json` is its documented shape."""

    window_s: float
    database: str = "ok"
    redis: str = "ok"
    backlog: dict[str, Any] | None = None
    tenants: list[TenantStatus] | None = None
    failed: list[FailedGroup] | None = None
    writers: list[WriterStats] | None = None
    queue_jobs: int | None = None
    scopes_ready: int | None = None
    tenants_paused: int | None = None
    workers: list[dict[str, Any]] | None = None
    distribution: Distribution | None = None
    generated_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def ok(self) -> bool:
        return self.database == "ok" and self.redis == "ok"

    def as_json(self) -> dict[str, Any]:
        tenants = self.tenants
        return {
            "generated_at": self.generated_at.isoformat(),
            "window_s": self.window_s,
            "database": self.database,
            "redis": self.redis,
            "distribution": None if self.distribution is None else self.distribution.as_json(),
            "backlog": self.backlog,
            "tenants": None
            if tenants is None
            else [
                {**asdict(t), "tenant_id": str(t.tenant_id), "audit_sealed": t.audit_unsealed == 0}
                for t in tenants
            ],
            "failed": None
            if self.failed is None
            else [
                {**asdict(f), "tenant_id": str(f.tenant_id), "newest_at": f.newest_at.isoformat()}
                for f in self.failed
            ],
            "writers": None
            if self.writers is None
            else [{**asdict(w), "error_rate": round(w.error_rate, 4)} for w in self.writers],
            "reviews": None
            if tenants is None
            else {
                "waiting": sum(t.reviews_waiting for t in tenants),
                "oldest_age_s": max((t.oldest_review_age_s for t in tenants), default=0.0),
            },
            "audit": None
            if tenants is None
            else {
                "unsealed": sum(t.audit_unsealed for t in tenants),
                "oldest_unsealed_age_s": max((t.oldest_unsealed_age_s for t in tenants), default=0.0),
            },
            "queue_jobs": self.queue_jobs,
            "scopes_ready": self.scopes_ready,
            "tenants_paused": self.tenants_paused,
            "workers_alive": None if self.workers is None else len(self.workers),
            "workers": self.workers,
        }


async def _read_postgres(found: Status, database_url: str) -> None:
    from sqlalchemy import text

    from app.db.distribution import describe
    from app.db.engine import create_engine, create_sessionmaker
    from app.domain.system import repositories

    settings = get_settings().model_copy(update={"database_url": database_url, "db_pool_size": 1})
    engine = create_engine(settings, application_name="memstore-status")
    try:
        async with asyncio.timeout(_DB_TIMEOUT_S), create_sessionmaker(engine)() as session, session.begin():
            await session.execute(text("SET LOCAL statement_timeout = '8s'"))
            # First: it says where the database is, should a later read fail.
            found.distribution = await describe(await session.connection())
            backlog = await repositories.backlog(session)
            found.backlog = {
                "queued": backlog.queued,
                "processing": backlog.processing,
                "oldest_unapplied_age_s": backlog.oldest_age_s,
            }
            found.tenants = await repositories.tenant_status(session)
            found.failed = await repositories.failed_groups(session)
            found.writers = await repositories.writer_stats(session, found.window_s, settings.writer)
    except Exception as exc:  # noqa: BLE001  (any fault of the database is what the screen reports)
        found.database = f"unreachable ({type(exc).__name__})"
    finally:
        await engine.dispose()


async def _read_redis(found: Status, redis_url: str) -> None:
    from app.domain.pipeline.scheduler import queues
    from app.domain.system.services import worker_beats
    from app.lib.queue import QUEUE_NAME, create_redis

    redis = create_redis(redis_url)
    try:
        async with asyncio.timeout(_REDIS_TIMEOUT_S):
            found.queue_jobs = int(await redis.zcard(QUEUE_NAME))
            waiting = await queues(redis)
            found.scopes_ready = sum(q.ready for q in waiting)
            found.tenants_paused = sum(q.paused for q in waiting)
            now = time.time()
            found.workers = [
                {
                    "name": b.name,
                    "host": b.host,
                    "pid": b.pid,
                    "max_jobs": b.max_jobs,
                    "jobs_running": b.jobs_running,
                    "beat_age_s": round(max(0.0, now - b.beat_at), 1),
                    "up_s": round(max(0.0, now - b.started_at), 1),
                }
                for b in await worker_beats(redis)
            ]
    except Exception as exc:  # noqa: BLE001  (any fault of Redis is what the screen reports)
        found.redis = f"unreachable ({type(exc).__name__})"
        found.queue_jobs = found.scopes_ready = found.tenants_paused = found.workers = None
    finally:
        await redis.aclose()


async def read_status(database_url: str, redis_url: str, window_s: float) -> Status:
    """Both sources, read side by side."""
    found = Status(window_s=window_s)
    await asyncio.gather(_read_postgres(found, database_url), _read_redis(found, redis_url))
    return found


def _age(seconds: float | None) -> str:
    if not seconds:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours < 48 else f"{hours // 24}d{hours % 24:02d}h"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _summary(found: Status) -> str:
    data = found.as_json()
    line = f"postgres: {found.database}  redis: {found.redis}"
    if found.distribution is not None:
        line += f"\ndatabase: {found.distribution.summary}"
    if found.backlog is not None:
        b, reviews, audit = found.backlog, data["reviews"], data["audit"]
        line += (
            f"\nbacklog: {b['queued']} queued, {b['processing']} processing, "
            f"apply lag {_age(b['oldest_unapplied_age_s'])}   "
            f"reviews waiting: {reviews['waiting']} (oldest {_age(reviews['oldest_age_s'])})   "
            f"audit unsealed: {audit['unsealed']} (oldest {_age(audit['oldest_unsealed_age_s'])})"
        )
    return line


def _table(title: str, columns: dict[str, str]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column, justify in columns.items():
        table.add_column(column, justify="right" if justify == "r" else "left")
    return table


def _tenants(tenants: list[TenantStatus]) -> Table:
    names = ("tenant", "queued", "processing", "oldest unapplied", "failed", "reviews", "oldest review")
    table = _table(
        "Tenants", {name: "l" if name == "tenant" else "r" for name in names} | {"audit chain": "l"}
    )
    for t in tenants:
        chain = (
            f"sealed at {t.audit_head_seq}"
            if t.audit_unsealed == 0
            else f"{t.audit_unsealed} unsealed, oldest {_age(t.oldest_unsealed_age_s)}"
        )
        table.add_row(
            t.tenant,
            str(t.queued),
            str(t.processing),
            _age(t.oldest_unapplied_age_s),
            str(t.failed),
            str(t.reviews_waiting),
            _age(t.oldest_review_age_s),
            chain,
        )
    return table


def _failed(found: Status, failed: list[FailedGroup]) -> Table:
    table = _table("Failed chunks by error", {"tenant": "l", "error": "l", "chunks": "r", "newest": "l"})
    for f in failed:
        newest = _age((found.generated_at - f.newest_at).total_seconds()) + " ago"
        table.add_row(f.tenant, f.error, str(f.chunks), newest)
    if not failed:
        table.add_row("-", "none", "0", "-")
    return table


def _writers(window_s: float, writers: list[WriterStats]) -> Table:
    names = ("writer", "applied", "failed", "error rate", "p50 ms", "p95 ms", "lag p50", "lag p95")
    table = _table(f"Writers, last {_age(window_s)}", {n: "l" if n == "writer" else "r" for n in names})
    for w in writers:
        table.add_row(
            w.writer,
            str(w.applied),
            str(w.failed),
            f"{w.error_rate:.0%} of {w.attempts}",
            _ms(w.latency_p50_ms),
            _ms(w.latency_p95_ms),
            _age(w.apply_lag_p50_s),
            _age(w.apply_lag_p95_s),
        )
    if not writers:
        table.add_row("-", "0", "0", "-", "-", "-", "-", "-")
    return table


def _workers(found: Status, workers: list[dict[str, Any]]) -> Table:
    title = (
        f"Workers alive: {len(workers)}   scopes ready: {found.scopes_ready}"
        f"   tenants paused (budget): {found.tenants_paused}"
    )
    table = _table(title, {"worker": "l", "jobs running": "l", "slots": "r", "last beat": "r", "up": "r"})
    for worker in workers:
        running = ", ".join(f"{name} {n}" for name, n in sorted(worker["jobs_running"].items())) or "idle"
        table.add_row(
            worker["name"],
            running,
            str(worker["max_jobs"]),
            f"{_age(worker['beat_age_s'])} ago",
            _age(worker["up_s"]),
        )
    if not workers:
        table.add_row("none", "-", "-", "-", "-")
    return table


def render(found: Status) -> None:
    """The human screen: a summary and a few `rich` tables."""
    from rich.console import Console

    console = Console()
    console.print(f"[bold]memstore status[/bold]  {found.generated_at:%Y-%m-%d %H:%M:%S} UTC")
    console.print(_summary(found))
    if found.tenants is not None:
        console.print(_tenants(found.tenants))
    if found.failed is not None:
        console.print(_failed(found, found.failed))
    if found.writers is not None:
        console.print(_writers(found.window_s, found.writers))
    if found.workers is not None:
        console.print(_workers(found, found.workers))


def status(
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    window: Annotated[
        float, typer.Option("--window", min=1, help="Seconds of writer activity the writers table covers.")
    ] = 900.0,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded data directory, when no URL is set.")
    ] = None,
) -> None:
    """One screen for an operator: queues, lag, failures, writers, reviews, the audit chain, workers.

    Reads Postgres (MEMSTORE_DATABASE_URL) and Redis (MEMSTORE_REDIS_URL), else the embedded stack;
    never the API. Exits 1 when a source does not answer.
    """
    from app.lib.embedded import EmbeddedError, EmbeddedPostgres, EmbeddedStack

    settings = get_settings()
    where = data_dir or settings.data_dir
    if settings.database_url is None and not EmbeddedPostgres(where / "pg").initialised:
        typer.echo(f"memstore: no database under {where.resolve()}; set MEMSTORE_DATABASE_URL", err=True)
        raise typer.Exit(1)
    stack = EmbeddedStack(where, settings.database_url, settings.redis_url)
    try:
        database_url, redis_url = stack.start()
    except EmbeddedError as exc:
        typer.echo(f"memstore: {exc}", err=True)
        raise typer.Exit(1) from exc
    try:
        found = asyncio.run(read_status(database_url, redis_url, window))
    finally:
        stack.stop()
    if as_json:
        typer.echo(json.dumps(found.as_json(), indent=2))
    else:
        render(found)
    raise typer.Exit(0 if found.ok else 1)


def register(cli: typer.Typer) -> None:
    """Add `memstore status` to the `memstore` command."""
    cli.command(name="status")(status)
