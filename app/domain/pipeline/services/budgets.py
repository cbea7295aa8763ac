"""What the fair scheduler holds of a tenant (`scheduler.Shares`), as a worker reads it before a turn:
its weight and cap from its settings, and a pause while its daily token budget is spent or while it
moves to another embedder (`search.tenant_embedder`: its chunks wait meanwhile, and a turn would only
claim each again to give it back).

A budget is read fresh before each turn of a tenant that has one (by its settings as the worker cached
them, or as the scheduler was told at once when they changed) (its value and the tokens spent today,
one statement), and such a tenant is served a chunk a turn: a raised budget holds from the next turn, and
a tenant without a budget costs nothing here. The writer calls in flight when a budget runs out finish
and are applied, so a budget can be passed by at most the tenant's calls in flight
(`max_writer_concurrency` bounds them); none of its chunks is dropped or failed: they wait `queued` until
the UTC day turns or the budget is raised (`PATCH /v1/admin/settings` unpauses the tenant at once; any
other change is seen within `RECHECK_S`).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.pipeline.repositories import PipelineRepository, TenantOptions
from app.domain.pipeline.scheduler import Shares

# How long a paused tenant waits before a worker looks at its budget again (unless the day turns first).
RECHECK_S = 60.0
# How long a tenant moving to another embedder is paused before a worker looks again (the move's end
# unpauses it at once, `search.jobs`: this is for a move ended by hand or a lost word).
MOVE_RECHECK_S = 5.0


def day_start(now: datetime) -> datetime:
    """The start of `now`'s UTC day: when today's budget began."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


async def shares_of(
    session: AsyncSession, tenant_id: uuid.UUID, options: TenantOptions, *, budgeted: bool = False
) -> Shares:
    """The tenant's shares now; paused (until the day turns, or `RECHECK_S`) if its budget is spent, or
    `MOVE_RECHECK_S` while it moves to another embedder.
    `budgeted`: the scheduler knows of a budget the cached `options` may not show yet."""
    paused_until_ms = 0
    budget: int | None = None
    if options.embedder_switching_to is not None:
        paused_until_ms = int((datetime.now(UTC) + timedelta(seconds=MOVE_RECHECK_S)).timestamp() * 1000)
    if options.daily_token_budget is not None or budgeted:
        now = datetime.now(UTC)
        budget, spent = await PipelineRepository(session).tokens_today(tenant_id, day_start(now))
        if budget is not None and spent >= budget:
            until = min(day_start(now) + timedelta(days=1), now + timedelta(seconds=RECHECK_S))
            paused_until_ms = max(paused_until_ms, int(until.timestamp() * 1000))
    return Shares(
        weight=options.write_weight,
        cap=options.max_writer_concurrency or 0,
        paused_until_ms=paused_until_ms,
        budgeted=budget is not None,
    )
