"""What the fair scheduler holds of a tenant (`scheduler.Shares`), as a worker reads it before a turn:
its weight and cap from its settings, and a pause while its daily token budget is spent.

A budget is read fresh (its value and the tokens spent today, one statement), at most once a second per
tenant and process, and only for a tenant that has one: a tenant without a budget costs nothing here.
The writer calls in flight when a budget runs out finish and are applied, so a budget can be passed by
at most the tenant's calls in flight; none of its chunks is dropped or failed: they wait `queued` until
the UTC day turns, or the budget is raised (`PATCH /v1/admin/settings` unpauses the tenant at once; any
other change is seen within `RECHECK_S`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.pipeline.repositories import PipelineRepository, TenantOptions
from app.domain.pipeline.scheduler import Shares

# How long a paused tenant waits before a worker looks at its budget again (unless the day turns first).
RECHECK_S = 60.0
# How long a read of a tenant's budget and spending stands, per process.
FRESH_S = 1.0


def day_start(now: datetime) -> datetime:
    """The start of `now`'s UTC day: when today's budget began."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Spending:
    budget: int | None
    spent: int
    read_at: float

    @property
    def exhausted(self) -> bool:
        return self.budget is not None and self.spent >= self.budget


@dataclass
class TenantShares:
    """The tenants' shares as this process last read them, and their budgets' spending."""

    spending: dict[uuid.UUID, Spending] = field(default_factory=dict)

    async def of(self, session: AsyncSession, tenant_id: uuid.UUID, options: TenantOptions) -> Shares:
        """The tenant's shares now; paused (until the day turns, or `RECHECK_S`) if its budget is spent."""
        paused_until_ms = 0
        if options.daily_token_budget is not None:
            spending = await self.read(session, tenant_id)
            if spending.exhausted:
                now = datetime.now(UTC)
                until = min(day_start(now) + timedelta(days=1), now + timedelta(seconds=RECHECK_S))
                paused_until_ms = int(until.timestamp() * 1000)
        return Shares(
            weight=options.write_weight,
            cap=options.max_writer_concurrency or 0,
            paused_until_ms=paused_until_ms,
        )

    async def read(self, session: AsyncSession, tenant_id: uuid.UUID) -> Spending:
        known = self.spending.get(tenant_id)
        if known is not None and time.monotonic() - known.read_at < FRESH_S:
            return known
        budget, spent = await PipelineRepository(session).tokens_today(
            tenant_id, day_start(datetime.now(UTC))
        )
        spending = Spending(budget, spent, time.monotonic())
        if len(self.spending) > 4096:
            self.spending.clear()
        self.spending[tenant_id] = spending
        return spending
