"""SQL of the operational endpoints."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# Served by the partial index on unfinished chunks, so its cost follows the backlog, not the table.
# Shadow banks' chunks are their own backlog (`memstore_shadow_*`), never the tenants'.
_BACKLOG = text(
    """
    SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'processing') AS processing,
           coalesce(extract(epoch FROM now() - min(received_at)), 0) AS oldest_age_s
    FROM chunks
    WHERE status IN ('queued', 'processing')
      AND tenant_id NOT IN (SELECT id FROM tenants WHERE shadow_of IS NOT NULL)
    """
)


@dataclass(frozen=True)
class Backlog:
    queued: int
    processing: int
    oldest_age_s: float


async def backlog(session: AsyncSession) -> Backlog:
    row = (await session.execute(_BACKLOG)).one()
    return Backlog(int(row.queued), int(row.processing), float(row.oldest_age_s))
