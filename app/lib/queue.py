"""The arq side of the API: enqueueing wake-up jobs without ever blocking ingestion on Redis.

Postgres is the source of truth; a job is only a hint that work exists. If Redis is unreachable the
enqueue is skipped (and logged), and the workers' sweeper finds the work in Postgres later.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from arq.connections import ArqRedis, RedisSettings
from redis.asyncio import ConnectionPool
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

QUEUE_NAME = "memstore:queue"


def redis_settings(url: str, retries: int = 0) -> RedisSettings:
    """arq settings for a redis:// or unix:// URL: short timeouts, and `retries` one second apart."""
    settings = RedisSettings.from_dsn(url)
    settings.conn_timeout = 1
    settings.conn_retries = retries
    settings.conn_retry_delay = 1
    return settings


def create_redis(url: str) -> ArqRedis:
    """An arq client that connects lazily, so a process can start while Redis is down."""
    pool = ConnectionPool.from_url(
        url, socket_connect_timeout=0.5, socket_timeout=2, health_check_interval=10
    )
    return ArqRedis(connection_pool=pool, default_queue_name=QUEUE_NAME)


class JobQueue:
    """Best-effort enqueue of jobs by function name."""

    def __init__(self, redis: ArqRedis, timeout_s: float = 1.0) -> None:
        self.redis = redis
        self.timeout_s = timeout_s

    async def enqueue_many(self, jobs: list[tuple[str, dict[str, Any]]]) -> int:
        """Enqueue each job; return how many reached Redis. Never raises on a Redis fault."""
        sent = 0
        for function, kwargs in jobs:
            job_id = kwargs.pop("_job_id", None)
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self.redis.enqueue_job(function, _job_id=job_id, **kwargs)
                sent += 1
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("queue.enqueue_skipped", function=function, error=type(exc).__name__)
                break
        return sent

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(self.timeout_s):
                return bool(await self.redis.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        await self.redis.aclose()
