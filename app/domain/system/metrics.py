"""Metrics read at scrape time from the sources of truth: the backlog, the review queue and the audit
sealer in Postgres (one statement), the tenants waiting longest (one more, bounded), the fair scheduler's
ready scopes and paused tenants, the job queue and the workers' heartbeats in Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.pipeline.scheduler import TenantQueue, queues
from app.domain.pipeline.services.budgets import day_start
from app.domain.shadows.repositories import ShadowBacklog, ShadowRepository
from app.domain.system.repositories import (
    Backlog,
    OperatorGauges,
    TenantBacklog,
    scrape_figures,
    tenant_backlog,
)
from app.domain.system.services import workers_alive
from app.lib.queue import QUEUE_NAME, JobQueue

log = structlog.get_logger(__name__)


class ScrapeCollector:
    """A one-shot collector holding values fetched just before rendering."""

    def __init__(
        self,
        backlog: Backlog | None,
        redis_jobs: int | None,
        shadows: list[ShadowBacklog] | None = None,
        gauges: OperatorGauges | None = None,
        workers: int | None = None,
        tenants: list[TenantBacklog] | None = None,
        scheduler: list[TenantQueue] | None = None,
    ) -> None:
        self.backlog = backlog
        self.redis_jobs = redis_jobs
        self.shadows = shadows or []
        self.gauges = gauges
        self.workers = workers
        self.tenants = tenants or []
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "memstore_database_up",
            "1 if Postgres answered this scrape.",
            value=0 if self.backlog is None else 1,
        )
        if self.backlog is not None:
            depth = GaugeMetricFamily(
                "memstore_queue_depth", "Chunks accepted but not yet applied or failed.", labels=["status"]
            )
            depth.add_metric(["queued"], self.backlog.queued)
            depth.add_metric(["processing"], self.backlog.processing)
            yield depth
            yield GaugeMetricFamily(
                "memstore_chunk_lag_seconds",
                "Age of the oldest chunk not yet applied (0 when none).",
                value=self.backlog.oldest_age_s,
            )
            shadow_depth = GaugeMetricFamily(
                "memstore_shadow_queue_depth",
                "Chunks a shadow bank has been given but not yet applied or failed.",
                labels=["bank", "writer"],
            )
            shadow_lag = GaugeMetricFamily(
                "memstore_shadow_lag_seconds",
                "Age of a shadow bank's oldest chunk not yet applied: how far the shadow is behind.",
                labels=["bank", "writer"],
            )
            for shadow in self.shadows:
                shadow_depth.add_metric([shadow.bank, shadow.writer], shadow.pending)
                shadow_lag.add_metric([shadow.bank, shadow.writer], shadow.oldest_age_s)
            yield shadow_depth
            yield shadow_lag
        if self.gauges is not None:
            yield GaugeMetricFamily(
                "memstore_reviews_waiting",
                "Writer ops held in the review queue, waiting for a human (all tenants).",
                value=self.gauges.reviews_waiting,
            )
            yield GaugeMetricFamily(
                "memstore_review_oldest_age_seconds",
                "Age of the oldest review waiting (0 when none).",
                value=self.gauges.review_oldest_age_s,
            )
            yield GaugeMetricFamily(
                "memstore_audit_unsealed_age_seconds",
                "Age of the oldest audit event not yet sealed into its tenant's chain (0 when none).",
                value=self.gauges.audit_unsealed_age_s,
            )
        if self.backlog is not None:
            yield from self._tenants()
        if self.scheduler is not None:
            yield GaugeMetricFamily(
                "memstore_scheduler_scopes_ready",
                "Scopes waiting in the fair scheduler for a worker slot (all tenants).",
                value=sum(q.ready for q in self.scheduler),
            )
            yield GaugeMetricFamily(
                "memstore_scheduler_tenants_paused",
                "Tenants the scheduler holds back because their daily token budget is spent.",
                value=sum(q.paused for q in self.scheduler),
            )
        if self.redis_jobs is not None:
            yield GaugeMetricFamily(
                "memstore_redis_queue_jobs", "Wake-up jobs waiting in the arq queue.", value=self.redis_jobs
            )
        if self.workers is not None:
            yield GaugeMetricFamily(
                "memstore_workers_alive",
                "Workers whose heartbeat in Redis is fresh (within its TTL).",
                value=self.workers,
            )

    def _tenants(self) -> Iterator[Metric]:
        """Per tenant, for the `TENANT_SERIES` tenants whose chunks have waited longest (a bounded set of
        series whatever the number of tenants; the others are in the totals above)."""
        labels = ["tenant"]
        queued = GaugeMetricFamily(
            "memstore_tenant_queued_chunks", "A tenant's chunks not yet applied or failed.", labels=labels
        )
        oldest = GaugeMetricFamily(
            "memstore_tenant_oldest_queued_seconds",
            "Age of a tenant's oldest chunk not yet applied: its wait for the writer fleet.",
            labels=labels,
        )
        budget = GaugeMetricFamily(
            "memstore_tenant_daily_token_budget",
            "A tenant's writer tokens a UTC day, if it has a budget.",
            labels=labels,
        )
        spent = GaugeMetricFamily(
            "memstore_tenant_tokens_today",
            "A tenant's writer tokens spent today (UTC), if it has a budget: at its budget, its chunks wait.",
            labels=labels,
        )
        for t in self.tenants:
            queued.add_metric([t.tenant], t.queued)
            oldest.add_metric([t.tenant], t.oldest_queued_age_s)
            if t.daily_token_budget is not None:
                budget.add_metric([t.tenant], t.daily_token_budget)
                spent.add_metric([t.tenant], t.tokens_today or 0)
        yield from (queued, oldest, budget, spent)


# The tenants a scrape reports one by one: those whose chunks have waited longest.
TENANT_SERIES = 20


async def scrape(sessionmaker: async_sessionmaker[AsyncSession], queue: JobQueue) -> ScrapeCollector:
    """Fetch the backlog, the operator's gauges, the queue length and the workers alive, each source
    bounded so a slow dependency cannot stall the scrape."""
    found: Backlog | None = None
    gauges: OperatorGauges | None = None
    shadows: list[ShadowBacklog] = []
    jobs: int | None = None
    workers: int | None = None
    tenants: list[TenantBacklog] = []
    scheduler: list[TenantQueue] | None = None
    try:
        async with asyncio.timeout(2.0), sessionmaker() as session:
            found, gauges = await scrape_figures(session)
            shadows = await ShadowRepository(session).backlog()
            tenants = await tenant_backlog(session, TENANT_SERIES, day_start(datetime.now(UTC)))
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        log.warning("metrics.backlog_unavailable", error=type(exc).__name__)
    try:
        async with asyncio.timeout(1.0):
            jobs = int(await queue.redis.zcard(QUEUE_NAME))
            workers = await workers_alive(queue.redis)
            scheduler = await queues(queue.redis)
    except (RedisError, OSError, TimeoutError):
        jobs = None
    return ScrapeCollector(found, jobs, shadows, gauges, workers, tenants, scheduler)
