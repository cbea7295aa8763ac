"""SQL of the operational endpoints and of `memstore status`.

Every read here spans tenants, so it goes through a function of the tables' owner (migrations 0008 and
0013) that returns counts, ages, writer names and error classes, never a tenant's content.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# Every tenant's backlog, read across tenants through a function of the tables' owner (migration 0008),
# served by the partial index on unfinished chunks, so its cost follows the backlog, not the table.
# Shadow banks' chunks are their own backlog (`memstore_shadow_*`), never the tenants'.
_BACKLOG = text("SELECT queued, processing, oldest_age_s FROM memstore_backlog()")
# The scrape's figures in one round trip: the backlog and the operator's gauges (migration 0013).
_SCRAPE = text(
    "SELECT b.queued, b.processing, b.oldest_age_s,"
    " g.reviews_waiting, g.review_oldest_age_s, g.audit_unsealed_age_s"
    " FROM memstore_backlog() b CROSS JOIN memstore_operator_gauges() g"
)
_TENANTS = text("SELECT * FROM memstore_operator_status()")
# The tenants waiting longest, bounded (migration 0019): the per-tenant series of a scrape.
_TENANT_BACKLOG = text("SELECT * FROM memstore_tenant_backlog(:p_limit, :p_day)")
_FAILED = text("SELECT tenant_id, tenant, error, chunks, newest_at FROM memstore_failed_chunks()")
_WRITERS = text("SELECT * FROM memstore_writer_stats(:p_window_s, :p_default_writer)")


@dataclass(frozen=True)
class Backlog:
    queued: int
    processing: int
    oldest_age_s: float


@dataclass(frozen=True)
class OperatorGauges:
    """What the alerts watch beyond the backlog: the review queue and the audit sealer."""

    reviews_waiting: int
    review_oldest_age_s: float
    audit_unsealed_age_s: float


@dataclass(frozen=True)
class TenantBacklog:
    """A tenant among those waiting longest: its waiting chunks, the oldest's age, and its budget and
    writer tokens today if it has a budget."""

    tenant_id: uuid.UUID
    tenant: str
    queued: int
    oldest_queued_age_s: float
    daily_token_budget: int | None
    tokens_today: int | None


async def tenant_backlog(session: AsyncSession, limit: int, day: datetime) -> list[TenantBacklog]:
    rows = await session.execute(_TENANT_BACKLOG, {"p_limit": limit, "p_day": day})
    return [TenantBacklog(*row) for row in rows]


@dataclass(frozen=True)
class TenantStatus:
    tenant_id: uuid.UUID
    tenant: str
    queued: int
    processing: int
    oldest_unapplied_age_s: float
    failed: int
    reviews_waiting: int
    oldest_review_age_s: float
    audit_unsealed: int
    oldest_unsealed_age_s: float
    audit_head_seq: int


@dataclass(frozen=True)
class FailedGroup:
    """Failed chunks of one tenant sharing an error class (the error's text before its first colon)."""

    tenant_id: uuid.UUID
    tenant: str
    error: str
    chunks: int
    newest_at: datetime


@dataclass(frozen=True)
class WriterStats:
    """One writer's chunks finished in the window; latencies are None when it recorded none."""

    writer: str
    applied: int
    failed: int
    attempts: int
    failed_attempts: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    apply_lag_p50_s: float | None
    apply_lag_p95_s: float | None

    @property
    def error_rate(self) -> float:
        """Failed attempts over all attempts (0 when none)."""
        return self.failed_attempts / self.attempts if self.attempts else 0.0


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


async def backlog(session: AsyncSession) -> Backlog:
    row = (await session.execute(_BACKLOG)).one()
    return Backlog(int(row.queued), int(row.processing), float(row.oldest_age_s))


async def scrape_figures(session: AsyncSession) -> tuple[Backlog, OperatorGauges]:
    """The backlog and the operator's gauges, in one statement."""
    row = (await session.execute(_SCRAPE)).one()
    return (
        Backlog(int(row.queued), int(row.processing), float(row.oldest_age_s)),
        OperatorGauges(
            int(row.reviews_waiting), float(row.review_oldest_age_s), float(row.audit_unsealed_age_s)
        ),
    )


async def tenant_status(session: AsyncSession) -> list[TenantStatus]:
    """Every tenant's queue, failures, review queue and audit chain, by tenant name."""
    rows = (await session.execute(_TENANTS)).all()
    return [
        TenantStatus(
            tenant_id=row.tenant_id,
            tenant=row.tenant,
            queued=int(row.queued),
            processing=int(row.processing),
            oldest_unapplied_age_s=float(row.oldest_unapplied_age_s),
            failed=int(row.failed),
            reviews_waiting=int(row.reviews_waiting),
            oldest_review_age_s=float(row.oldest_review_age_s),
            audit_unsealed=int(row.audit_unsealed),
            oldest_unsealed_age_s=float(row.oldest_unsealed_age_s),
            audit_head_seq=int(row.audit_head_seq),
        )
        for row in rows
    ]


async def failed_groups(session: AsyncSession) -> list[FailedGroup]:
    """Failed chunks by tenant and error class, the group with the newest failure first."""
    rows = (await session.execute(_FAILED)).all()
    return [FailedGroup(row.tenant_id, row.tenant, row.error, int(row.chunks), row.newest_at) for row in rows]


async def writer_stats(session: AsyncSession, window_s: float, default_writer: str) -> list[WriterStats]:
    """Per writer, the chunks finished in the last `window_s` seconds, by writer name; a chunk that
    named no writer, of a tenant with no default, is `default_writer`'s (the deployment's)."""
    params = {"p_window_s": window_s, "p_default_writer": default_writer}
    rows = (await session.execute(_WRITERS, params)).all()
    return [
        WriterStats(
            writer=row.writer,
            applied=int(row.applied),
            failed=int(row.failed),
            attempts=int(row.attempts),
            failed_attempts=int(row.failed_attempts),
            latency_p50_ms=_float(row.latency_p50_ms),
            latency_p95_ms=_float(row.latency_p95_ms),
            apply_lag_p50_s=_float(row.apply_lag_p50_s),
            apply_lag_p95_s=_float(row.apply_lag_p95_s),
        )
        for row in rows
    ]
