"""`/health` (the process answers), `/ready` (its dependencies answer) and `/metrics` (Prometheus text)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, get
from litestar.di import NamedDependency
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.domain.system.metrics import scrape
from app.domain.system.services import check_readiness
from app.lib.errors import RETRY_AFTER_S, Unavailable, error_response, error_responses
from app.lib.metrics import render
from app.lib.queue import JobQueue


class SystemController(Controller):
    tags = ["operations"]
    include_in_schema = True

    @get("/health", summary="Liveness: the process is up", cache_control=None)
    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    @get(
        "/metrics",
        media_type=CONTENT_TYPE_LATEST,
        summary="Prometheus metrics: requests, backlog, chunk lag, writer and apply latency",
    )
    async def metrics(
        self,
        sessionmaker: NamedDependency[async_sessionmaker[AsyncSession]],
        job_queue: NamedDependency[JobQueue],
    ) -> bytes:
        collector = await scrape(sessionmaker, job_queue)
        return render([collector])

    @get(
        "/ready",
        summary="Readiness: Postgres, Redis and the schema are fine (503 otherwise)",
        responses=error_responses(Unavailable),
    )
    async def ready(
        self, engine: NamedDependency[AsyncEngine], job_queue: NamedDependency[JobQueue]
    ) -> Response[dict[str, Any]]:
        readiness = await check_readiness(engine, job_queue)
        checks = {
            "postgres": readiness.postgres,
            "migrations": readiness.migrations,
            "redis": readiness.redis,
        }
        if readiness.ok:
            return Response({"status": "ready", "checks": checks})
        return error_response(
            503,
            "unavailable",
            "Not ready: a dependency is unreachable or the schema is not migrated.",
            details=checks,
            headers={"Retry-After": RETRY_AFTER_S},
        )
