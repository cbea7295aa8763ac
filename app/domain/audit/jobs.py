"""The audit log's job: sealing newly committed events into their tenants' hash chains."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from app.domain.audit.services import seal_pending
from app.lib.errors import is_db_outage

if TYPE_CHECKING:
    from app.domain.pipeline.jobs import WorkerContext

log = structlog.get_logger("app.domain.audit.jobs")


async def seal_audit_job(ctx: WorkerContext) -> dict[str, Any]:
    """Link newly committed audit events into their tenants' hash chains."""
    try:
        sealed = await seal_pending(ctx["engine"])
    except Exception as exc:
        if not is_db_outage(exc):
            raise
        log.warning("audit.seal_db_unavailable", error=type(exc).__name__)
        return {"sealed": 0}
    return {"sealed": sealed}
