"""The usage report: its window and groups checked, its rows summed, today's budget beside them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.pipeline.repositories import PipelineRepository
from app.domain.pipeline.services.budgets import day_start
from app.domain.usage.repositories import GROUPS, UsageRepository
from app.domain.usage.schemas import UsageReport
from app.lib.errors import InvalidField


def window(since: date | None, until: date | None) -> tuple[date, date]:
    """The report's UTC days: by default the last seven, today included (a `since` after `until`: none)."""
    until = until or datetime.now(UTC).date()
    return since or until - timedelta(days=6), until


def groups(group_by: Sequence[str]) -> list[str]:
    unknown = [g for g in group_by if g not in GROUPS]
    if unknown:
        raise InvalidField(
            f"Unknown group {unknown[0]!r}.", details={"field": "group_by", "allowed": list(GROUPS)}
        )
    return [g for g in GROUPS if g in group_by]


async def tenant_report(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    since: date | None,
    until: date | None,
    group_by: Sequence[str],
    limit: int,
) -> UsageReport:
    """The tenant's usage by `group_by`, with its whole window's sum (not only the groups returned) and
    its daily token budget and what today has spent of it."""
    first, last = window(since, until)
    grouped = groups(group_by)
    repo = UsageRepository(session)
    rows = await repo.report(tenant_id, first, last, grouped, limit)
    [whole] = await repo.report(tenant_id, first, last, [], 1)  # no group: one row, zeros or sums
    today = day_start(datetime.now(UTC))
    budget, spent = await PipelineRepository(session).tokens_today(tenant_id, today, always=True)
    return UsageReport(
        since=first,
        until=last,
        group_by=grouped,
        items=rows,
        total=whole,
        daily_token_budget=budget,
        tokens_today=spent,
    )
