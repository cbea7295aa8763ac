"""The pipeline's jobs, as the workers run them: draining a scope, and sweeping up scopes whose chunks
no job will take. `workers/` only registers them.

A job gets a `WorkerContext`: arq's keys (`redis`, `job_id`, `job_try`) and what the worker's start-up
put there. Faults of the database connection become arq retries; everything else a chunk meets is
recorded on the chunk (`services`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, TypedDict

import structlog
from arq import Retry
from arq.connections import ArqRedis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.config import Settings
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.pipeline.services import PipelineDeps, take_up_scope
from app.domain.pipeline.wakeups import WakeReason, scope_job_name, scope_wake, wake
from app.lib.errors import is_db_outage
from app.lib.queue import next_drain

log = structlog.get_logger("app.domain.pipeline.jobs")


class WorkerContext(TypedDict, total=False):
    """What a job is handed: arq's keys, and what the worker's start-up opened (`workers.settings`)."""

    redis: ArqRedis
    job_id: str
    job_try: int
    settings: Settings
    engine: AsyncEngine
    pipeline: PipelineDeps
    worker_name: str
    graph_indexer: asyncio.Task[None]


async def process_scope_job(ctx: WorkerContext, tenant_id: str, user_id: str) -> dict[str, Any]:
    """Drain one scope (tenant + user) in `seq` order."""
    deps = ctx["pipeline"]
    structlog.contextvars.bind_contextvars(tenant_id=tenant_id, user_id=user_id)
    # Wake-ups from here on make the scope's next job; those before it are this one's (`JobQueue`).
    await next_drain(ctx["redis"], scope_job_name(tenant_id, user_id))
    try:
        run = await take_up_scope(deps, uuid.UUID(tenant_id), user_id)
    except Exception as exc:
        if not is_db_outage(exc):
            raise
        # Faults of the database connection: the job is retried, the chunk is still safely in Postgres.
        log.warning("scope.db_unavailable", error=type(exc).__name__, try_=ctx.get("job_try"))
        raise Retry(defer=min(30, 2 * int(ctx.get("job_try", 1)))) from exc
    finally:
        structlog.contextvars.unbind_contextvars("tenant_id", "user_id")
    for bank_id in run.fed:
        await wake(ctx["redis"], scope_wake(bank_id, user_id, WakeReason.FED))
    if run.retry_at is not None:
        # A chunk is waiting out its backoff; wake the scope when it is due. Without Redis the backoff
        # still holds in Postgres (`available_at`), and the sweeper wakes the scope once it has passed.
        due = scope_wake(
            tenant_id,
            user_id,
            WakeReason.BACKOFF,
            key=f"{run.retry_at.timestamp():.0f}",
            defer_until=run.retry_at,
        )
        await wake(ctx["redis"], due)
    return run.summary()


async def find_stranded_scopes(engine: AsyncEngine, min_age_s: float) -> list[tuple[uuid.UUID, str]]:
    """Scopes whose unfinished chunks nobody has touched for `min_age_s` (lost or never-sent jobs)."""
    async with AsyncSession(engine) as session:
        return list(await PipelineRepository(session).stranded_scopes(min_age_s))


async def sweep_job(ctx: WorkerContext) -> dict[str, Any]:
    """Re-enqueue scopes whose chunks wait in Postgres with no job to run them (lost Redis, lost job)."""
    settings = ctx["settings"]
    try:
        scopes = await find_stranded_scopes(ctx["pipeline"].engine, settings.sweep_min_age_s)
    except Exception as exc:
        if not is_db_outage(exc):
            raise
        log.warning("sweep.db_unavailable", error=type(exc).__name__)
        return {"enqueued": 0}
    window = str(int(time.time() // max(1, settings.sweep_interval_s)))
    for tenant_id, user_id in scopes:
        await wake(ctx["redis"], scope_wake(tenant_id, user_id, WakeReason.SWEPT, key=window))
    if scopes:
        log.info("sweep.enqueued", scopes=len(scopes))
    return {"enqueued": len(scopes)}
