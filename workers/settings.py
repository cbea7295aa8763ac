"""`WorkerSettings` for arq. Job bodies live in domain services; this module only wires them."""

from __future__ import annotations

import os
import socket
from typing import Any, ClassVar

import structlog
from arq import cron
from arq.connections import RedisSettings

from app.config import get_settings
from app.db.engine import create_engine, create_sessionmaker
from app.lib.logging import configure_logging
from app.lib.queue import QUEUE_NAME, redis_settings

log = structlog.get_logger("workers")

HEARTBEAT_KEY = "memstore:workers:{name}"
HEARTBEAT_TTL_S = 30


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def startup(ctx: dict[str, Any]) -> None:
    """Open the shared clients one worker process uses for all its jobs."""
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format, process="worker")
    ctx["settings"] = settings
    ctx["engine"] = create_engine(settings, application_name="memstore-worker")
    ctx["sessionmaker"] = create_sessionmaker(ctx["engine"])
    ctx["worker_name"] = worker_name()
    await heartbeat(ctx)
    log.info("worker.started", worker=ctx["worker_name"], max_jobs=settings.worker_max_jobs)


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["redis"].delete(HEARTBEAT_KEY.format(name=ctx["worker_name"]))
    await ctx["engine"].dispose()
    log.info("worker.stopped", worker=ctx["worker_name"])


async def on_job_start(ctx: dict[str, Any]) -> None:
    structlog.contextvars.bind_contextvars(job_id=ctx.get("job_id"), job_try=ctx.get("job_try"))


async def on_job_end(ctx: dict[str, Any]) -> None:
    structlog.contextvars.unbind_contextvars("job_id", "job_try")


async def heartbeat(ctx: dict[str, Any]) -> None:
    """Announce this worker in Redis (with a TTL), so operators and readiness checks can count workers."""
    await ctx["redis"].set(HEARTBEAT_KEY.format(name=ctx["worker_name"]), "1", ex=HEARTBEAT_TTL_S)


class WorkerSettings:
    """Read by `arq` (via `memstore worker`); values come from the Memstore settings."""

    _settings = get_settings()
    queue_name = QUEUE_NAME
    functions: ClassVar[list[Any]] = []
    cron_jobs: ClassVar[list[Any]] = [
        cron(heartbeat, second=set(range(0, 60, 10)), run_at_startup=False, unique=False, timeout=5)
    ]
    on_startup = startup
    on_shutdown = shutdown
    on_job_start = on_job_start
    on_job_end = on_job_end
    max_jobs = _settings.worker_max_jobs
    job_timeout = _settings.worker_job_timeout_s
    job_completion_wait = _settings.worker_shutdown_wait_s
    keep_result = 60
    redis_settings: RedisSettings | None = (
        redis_settings(_settings.redis_url, retries=60) if _settings.redis_url else None
    )
