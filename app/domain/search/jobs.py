"""The search domain's job, as the workers run it: carrying on a tenant's move to another embedder
(`tenant_embedder.switch_tenant`), a slice of time at a time, each slice enqueueing the next."""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.engine import create_sessionmaker
from app.db.tenancy import tenant_scope
from app.domain.pipeline.jobs import WorkerContext
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.pipeline.scheduler import configure
from app.domain.pipeline.services.budgets import shares_of
from app.domain.search.tenant_embedder import enqueue_switch, switch_tenant
from app.lib.errors import is_db_outage

log = structlog.get_logger(__name__)

# A run's share of a worker slot before it hands over to the next run (its last batch finished first).
SWITCH_SLICE_S = 60.0
# A run that met an outage of Postgres is tried again this much later.
_OUTAGE_RETRY_S = 5.0


async def switch_embedder_job(ctx: WorkerContext, tenant_id: str) -> dict[str, Any]:
    deps = ctx["pipeline"]
    assert deps.embedders is not None
    try:
        outcome = await switch_tenant(
            create_sessionmaker(deps.engine),
            deps.embedders,
            uuid.UUID(tenant_id),
            actor=deps.actor,
            budget_s=SWITCH_SLICE_S,
        )
    except Exception as exc:
        if not is_db_outage(exc):
            raise
        log.warning("embedder.switch_db_unavailable", tenant_id=tenant_id, error=type(exc).__name__)
        await enqueue_switch(ctx["redis"], uuid.UUID(tenant_id), defer_s=_OUTAGE_RETRY_S)
        return {"finished": False}
    if not outcome.finished:
        await enqueue_switch(ctx["redis"], uuid.UUID(tenant_id))
    elif outcome.to is not None:
        await _resume(ctx, uuid.UUID(tenant_id))
    return {"embedded": outcome.embedded, "finished": outcome.finished}


async def _resume(ctx: WorkerContext, tenant_id: uuid.UUID) -> None:
    """The moved tenant's chunks go on at once: the scheduler, which held the tenant paused while it
    moved (`budgets.shares_of`), is told its shares now."""
    deps = ctx["pipeline"]
    with tenant_scope([tenant_id]):
        async with AsyncSession(deps.reads) as session:
            options = await PipelineRepository(session).tenant_options(tenant_id)
            shares = await shares_of(session, tenant_id, options)
    await configure(ctx["redis"], tenant_id, shares)
