"""Job entry points: thin wrappers that call the pipeline and translate faults into arq retries."""

from __future__ import annotations

import time
import uuid
from typing import Any

import structlog
from arq import Retry
from redis.exceptions import RedisError

from app.domain.audit.services import seal_pending
from app.domain.ingest.services import PROCESS_SCOPE_JOB, scope_job_name
from app.domain.pipeline.services import PipelineDeps, find_stranded_scopes, take_up_scope
from app.lib.errors import is_db_outage
from app.lib.queue import next_drain

log = structlog.get_logger("workers.jobs")


async def process_scope_job(ctx: dict[str, Any], tenant_id: str, user_id: str) -> dict[str, Any]:
    """Drain one scope (tenant + user) in `seq` order."""
    deps: PipelineDeps = ctx["pipeline"]
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
        await _wake(ctx, str(bank_id), user_id, _job_id=f"shadow:{bank_id}:{user_id}:{uuid.uuid4().hex}")
    if run.retry_at is not None:
        # A chunk is waiting out its backoff; wake the scope when it is due. Without Redis the backoff
        # still holds in Postgres (`available_at`), and the sweeper wakes the scope once it has passed.
        await _wake(
            ctx,
            tenant_id,
            user_id,
            _defer_until=run.retry_at,
            _job_id=f"retry:{tenant_id}:{user_id}:{run.retry_at.timestamp():.0f}",
        )
    return run.summary()


async def _wake(ctx: dict[str, Any], tenant_id: str, user_id: str, **options: Any) -> None:
    """Queue a job for the scope; without Redis the chunks still wait in Postgres for the sweeper."""
    try:
        await ctx["redis"].enqueue_job(PROCESS_SCOPE_JOB, tenant_id, user_id, **options)
    except (RedisError, OSError) as exc:
        log.warning("scope.wake_up_not_queued", error=f"{type(exc).__name__}: {exc}")


async def sweep_job(ctx: dict[str, Any]) -> dict[str, Any]:
    """Re-enqueue scopes whose chunks wait in Postgres with no job to run them (lost Redis, lost job)."""
    settings = ctx["settings"]
    deps: PipelineDeps = ctx["pipeline"]
    try:
        scopes = await find_stranded_scopes(deps.engine, settings.sweep_min_age_s)
    except Exception as exc:
        if not is_db_outage(exc):
            raise
        log.warning("sweep.db_unavailable", error=type(exc).__name__)
        return {"enqueued": 0}
    window = int(time.time() // max(1, settings.sweep_interval_s))
    for tenant_id, user_id in scopes:
        await ctx["redis"].enqueue_job(
            PROCESS_SCOPE_JOB, str(tenant_id), user_id, _job_id=f"sweep:{tenant_id}:{user_id}:{window}"
        )
    if scopes:
        log.info("sweep.enqueued", scopes=len(scopes))
    return {"enqueued": len(scopes)}


async def seal_audit_job(ctx: dict[str, Any]) -> dict[str, Any]:
    """Link newly committed audit events into their tenants' hash chains."""
    deps: PipelineDeps = ctx["pipeline"]
    try:
        sealed = await seal_pending(deps.engine)
    except Exception as exc:
        if not is_db_outage(exc):
            raise
        log.warning("audit.seal_db_unavailable", error=type(exc).__name__)
        return {"sealed": 0}
    return {"sealed": sealed}
