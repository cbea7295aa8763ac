"""The arq side of the API: enqueueing wake-up jobs without ever blocking ingestion on Redis.

Postgres is the source of truth; a job is only a hint that work exists. If Redis is unreachable the
enqueue is skipped (and logged), and the workers' sweeper finds the work in Postgres later.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from arq.connections import ArqRedis, RedisSettings
from redis.asyncio import ConnectionPool
from redis.exceptions import NoScriptError, RedisError

log = structlog.get_logger(__name__)

QUEUE_NAME = "memstore:queue"
# Published once per batch of wake-ups; idle workers listening end their wait between polls.
WAKE_CHANNEL = "memstore:wake"


@dataclass(frozen=True)
class ScriptCall:
    """A Lua script's call, sent by its hash (the script itself only when Redis does not have it)."""

    script: str
    args: tuple[str, ...]

    @property
    def sha(self) -> str:
        return _sha(self.script)


@functools.cache
def _sha(script: str) -> str:
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()


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
    """Best-effort, after-commit writes of wake-ups: script calls (the scheduler's, `pipeline.scheduler`)
    in one round trip, never blocking or failing the caller on a Redis fault."""

    def __init__(self, redis: ArqRedis, timeout_s: float = 1.0, *, wake: bool = True) -> None:
        self.redis = redis
        self.timeout_s = timeout_s
        self.wake = wake

    async def enqueue_many(self, calls: Sequence[ScriptCall]) -> int:
        """Run the calls in one round trip (a second, with the scripts' text, only if Redis lost them);
        return how many reached Redis. Never raises on a Redis fault. With `wake`, one message on
        `WAKE_CHANNEL` follows them, so a waiting worker looks now; a lost one costs only its poll delay.
        """
        if not calls:
            return 0
        try:
            async with asyncio.timeout(self.timeout_s):
                pipe = self.redis.pipeline(transaction=False)
                for call in calls:
                    pipe.evalsha(call.sha, 0, *call.args)
                if self.wake:
                    pipe.publish(WAKE_CHANNEL, b"")  # after the calls, in the same round trip
                results = await pipe.execute(raise_on_error=False)
                missing = [c for c, r in zip(calls, results, strict=False) if isinstance(r, NoScriptError)]
                if missing:
                    pipe = self.redis.pipeline(transaction=False)
                    for call in missing:
                        pipe.eval(call.script, 0, *call.args)
                    if self.wake:
                        pipe.publish(WAKE_CHANNEL, b"")
                    await pipe.execute()
                failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, NoScriptError)]
                if failed:
                    raise failed[0]
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("queue.enqueue_skipped", jobs=len(calls), error=type(exc).__name__)
            return 0
        return len(calls)

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(self.timeout_s):
                return bool(await self.redis.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        await self.redis.aclose()
