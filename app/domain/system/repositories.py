"""SQL of the operational endpoints."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# Every tenant's backlog, read across tenants through a function of the tables' owner (migration 0008),
# served by the partial index on unfinished chunks, so its cost follows the backlog, not the table.
# Shadow banks' chunks are their own backlog (`memstore_shadow_*`), never the tenants'.
_BACKLOG = text("SELECT queued, processing, oldest_age_s FROM memstore_backlog()")


@dataclass(frozen=True)
class Backlog:
    queued: int
    processing: int
    oldest_age_s: float


async def backlog(session: AsyncSession) -> Backlog:
    row = (await session.execute(_BACKLOG)).one()
    return Backlog(int(row.queued), int(row.processing), float(row.oldest_age_s))
