"""The webhooks' job: a cron every second that delivers what is due (`delivery.Deliverer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from app.domain.webhooks.delivery import Deliverer
from app.lib.errors import is_db_outage

if TYPE_CHECKING:
    from app.domain.pipeline.jobs import WorkerContext

log = structlog.get_logger("app.domain.webhooks.jobs")

DELIVER_JOB = "deliver_webhooks"
# A run delivers for at most this long, then leaves the rest to the next (arq runs one at a time: unique).
RUN_BUDGET_S = 20.0


async def deliver_webhooks_job(ctx: WorkerContext) -> dict[str, Any]:
    """Send due webhook deliveries, in order per user, with their retries."""
    try:
        made = await Deliverer(ctx["engine"], ctx["settings"]).run(RUN_BUDGET_S)
    except Exception as exc:
        if not is_db_outage(exc):
            raise
        log.warning("webhook.db_unavailable", error=type(exc).__name__)
        return {"attempts": 0}
    return {"attempts": made}
