"""The pipeline's jobs, as the workers run them: a turn on a scope the fair scheduler gave a worker slot
(`run_turn`), and sweeping up scopes whose chunks wait with no wake-up in the scheduler. `workers/`
only registers them, and hands its free slots to the scheduler (`workers.wakeable`).

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
from app.db.tenancy import tenant_scope
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.pipeline.scheduler import FairScheduler, Shares, Turn
from app.domain.pipeline.services import PipelineDeps, ScopeRun, take_up_scope
from app.domain.pipeline.services.budgets import shares_of
from app.domain.pipeline.wakeups import WakeReason, scope_wake, wake
from app.lib import metrics
from app.lib.errors import is_db_outage

log = structlog.get_logger("app.domain.pipeline.jobs")


class WorkerContext(TypedDict, total=False):
    """What a job is handed: arq's keys, and what the worker's start-up opened (`workers.settings`)."""

    redis: ArqRedis
    job_id: str
    job_try: int
    settings: Settings
    engine: AsyncEngine
    pipeline: PipelineDeps
    scheduler: FairScheduler
    worker_name: str
    graph_indexer: asyncio.Task[None]


async def process_scope_job(ctx: WorkerContext, tenant_id: str, user_id: str) -> dict[str, Any]:
    """Drain one scope (tenant + user) in `seq` order, whole: the arq job wake-ups enqueued before the
    fair scheduler, run if any is left in Redis from then."""
    deps = ctx["pipeline"]
    structlog.contextvars.bind_contextvars(tenant_id=tenant_id, user_id=user_id)
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
    await _wake_after(ctx, uuid.UUID(tenant_id), user_id, run)
    return run.summary()


async def _wake_after(
    ctx: WorkerContext, tenant_id: uuid.UUID, user_id: str, run: ScopeRun, *, backoff: bool = True
) -> None:
    """The shadow banks the run fed, and (with `backoff`) the scope itself when a chunk's backoff is due
    (without Redis the backoff still holds in Postgres, `available_at`, and the sweeper wakes the scope
    after it)."""
    wakes = [scope_wake(bank_id, user_id, WakeReason.FED) for bank_id in run.fed]
    if backoff and run.retry_at is not None:
        wakes.append(scope_wake(tenant_id, user_id, WakeReason.BACKOFF, defer_until=run.retry_at))
    await wake(ctx["redis"], *wakes)


# A turn that met an outage of Postgres, or a fault of its own, is tried again this much later.
_FAULT_RETRY_S = 2.0


async def run_turn(ctx: WorkerContext, turn: Turn) -> dict[str, Any]:
    """A turn on a scope the scheduler gave this worker: drain it for at most a turn
    (`MEMSTORE_SCHEDULER_TURN_S`), then give it back, charged for the chunks it served, ready again if
    more wait, due later if a chunk backs off. A tenant whose daily token budget is spent, or that moves
    to another embedder, is paused instead, its chunks untouched. Whatever happens, the scope is given
    back (a killed worker's lapses with its lease, and the sweeper wakes it)."""
    deps, scheduler = ctx["pipeline"], ctx["scheduler"]
    tenant_id, user_id = turn.tenant_id, turn.user_id
    structlog.contextvars.bind_contextvars(tenant_id=str(tenant_id), user_id=user_id)
    shares: Shares | None = None
    run: ScopeRun | None = None
    due_ms = 0
    try:
        with tenant_scope([tenant_id]):
            async with AsyncSession(deps.reads) as session:
                options = await deps.tenants.get(session, tenant_id)
                shares = await shares_of(session, tenant_id, options, budgeted=turn.budgeted)
        if shares.paused_until_ms:
            metrics.SCHEDULER_TURNS.labels("paused").inc()
            why = "embedder_move" if options.embedder_switching_to else "budget_spent"
            log.info("scope.paused", until_ms=shares.paused_until_ms, why=why)
            return {"paused_until_ms": shares.paused_until_ms}
        # A tenant with a budget is served a chunk a turn, its spending read again before each.
        budgeted = shares.budgeted
        until = time.monotonic() + (0 if budgeted else deps.settings.scheduler_turn_s)
        run = await take_up_scope(deps, tenant_id, user_id, until=until)
        metrics.SCHEDULER_TURNS.labels("served" if run.served else "idle").inc()
        return run.summary()
    except Exception as exc:
        metrics.SCHEDULER_TURNS.labels("faulted").inc()
        if is_db_outage(exc):
            log.warning("scope.db_unavailable", error=type(exc).__name__)
        else:
            log.exception("scope.turn_failed")
        due_ms = int((time.time() + _FAULT_RETRY_S) * 1000)
        return {"error": type(exc).__name__}
    finally:
        structlog.contextvars.unbind_contextvars("tenant_id", "user_id")
        # Given back whatever happened, a cancellation (the worker stopping) included: ready again at
        # once unless it is done, or due when its backoff ends or after a fault.
        served, more = 0, True
        if run is not None:
            served, more = run.served, run.more
            if run.retry_at is not None:
                due_ms = int(run.retry_at.timestamp() * 1000)
            await _wake_after(ctx, tenant_id, user_id, run, backoff=False)  # the backoff: `due_ms`
        await scheduler.done(turn, served=served, more=more, due_ms=due_ms, shares=shares)


async def find_stranded_scopes(engine: AsyncEngine, min_age_s: float) -> list[tuple[uuid.UUID, str, bool]]:
    """Scopes whose unfinished chunks nobody has touched for `min_age_s` (lost wake-ups, a Redis flush,
    or a backlog waiting its turn), and whether their chunks are all backfill."""
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
    await wake(
        ctx["redis"],
        *(scope_wake(t, u, WakeReason.SWEPT, backfill=backfill) for t, u, backfill in scopes),
    )
    if scopes:
        log.info("sweep.enqueued", scopes=len(scopes))
    return {"enqueued": len(scopes)}
