"""Metrics read at scrape time from the sources of truth: the backlog in Postgres, the job queue in Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.shadows.repositories import ShadowBacklog, ShadowRepository
from app.domain.system.repositories import Backlog, backlog
from app.lib.queue import QUEUE_NAME, JobQueue

log = structlog.get_logger(__name__)


class ScrapeCollector:
    """A one-shot collector holding values fetched just before rendering."""

    def __init__(
        self, backlog: Backlog | None, redis_jobs: int | None, shadows: list[ShadowBacklog] | None = None
    ) -> None:
        self.backlog = backlog
        self.redis_jobs = redis_jobs
        self.shadows = shadows or []

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
        if self.redis_jobs is not None:
            yield GaugeMetricFamily(
                "memstore_redis_queue_jobs", "Wake-up jobs waiting in the arq queue.", value=self.redis_jobs
            )


async def scrape(sessionmaker: async_sessionmaker[AsyncSession], queue: JobQueue) -> ScrapeCollector:
    """Fetch the backlog and queue length, each bounded so a slow dependency cannot stall the scrape."""
    found: Backlog | None = None
    shadows: list[ShadowBacklog] = []
    jobs: int | None = None
    try:
        async with asyncio.timeout(2.0), sessionmaker() as session:
            found = await backlog(session)
            shadows = await ShadowRepository(session).backlog()
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        log.warning("metrics.backlog_unavailable", error=type(exc).__name__)
    try:
        async with asyncio.timeout(1.0):
            jobs = int(await queue.redis.zcard(QUEUE_NAME))
    except (RedisError, OSError, TimeoutError):
        jobs = None
    return ScrapeCollector(found, jobs, shadows)
