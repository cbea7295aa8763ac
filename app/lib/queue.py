"""The arq side of the API: enqueueing wake-up jobs without ever blocking ingestion on Redis.

Postgres is the source of truth; a job is only a hint that work exists. If Redis is unreachable the
enqueue is skipped (and logged), and the workers' sweeper finds the work in Postgres later.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from arq.connections import ArqRedis, RedisSettings
from arq.constants import expires_extra_ms, job_key_prefix
from arq.jobs import serialize_job
from redis.asyncio import ConnectionPool
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

QUEUE_NAME = "memstore:queue"
# Published once per batch of enqueued jobs; idle workers listening end their wait between polls.
WAKE_CHANNEL = "memstore:wake"
# A scope's drain generation: a job `once_per_drain` is named after it, and the job starting its drain
# moves it on (`next_drain`), so enqueues before that start share the job and later ones make the next.
DRAIN_KEY = "memstore:drain:{name}"
_DRAIN_KEY_TTL_S = 86_400

# Enqueue a job named `<base>:<the drain generation>` unless a job of that name already waits or runs.
_ONCE_PER_DRAIN = """
local id = ARGV[1] .. ':' .. (redis.call('GET', KEYS[1]) or '0')
local key = ARGV[2] .. id
if redis.call('EXISTS', key) == 1 then return 0 end
redis.call('PSETEX', key, ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[5], id)
return 1
"""


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

    def __init__(self, redis: ArqRedis, timeout_s: float = 1.0, *, wake: bool = True) -> None:
        self.redis = redis
        self.timeout_s = timeout_s
        self.wake = wake

    async def enqueue_many(self, jobs: list[tuple[str, dict[str, Any]]]) -> int:
        """Enqueue jobs in one round trip; return how many reached Redis. Never raises on a Redis fault.

        Each job is written exactly as arq's `enqueue_job` writes it (job key + queue entry), without
        its per-job existence check: callers name jobs uniquely, and a duplicate wake-up is harmless
        anyway (the worker finds the chunk applied). A job with the option `_once_per_drain` is the
        exception: it is named after `_job_id` and the drain generation of that name (`next_drain`),
        and not enqueued while a job of that name waits or has not yet started its drain. A job with
        `_defer_until` (a datetime) waits until then. With `wake`,
        one message on `WAKE_CHANNEL` follows them, so a waiting worker polls now; a lost one costs
        only the poll delay.
        """
        if not jobs:
            return 0
        now_ms = int(time.time() * 1000)
        try:
            async with asyncio.timeout(self.timeout_s):
                pipe = self.redis.pipeline(transaction=False)
                for function, options in jobs:
                    kwargs = {k: v for k, v in options.items() if not k.startswith("_")}
                    job_id = str(options["_job_id"])
                    payload = serialize_job(function, (), kwargs, None, now_ms)
                    if options.get("_once_per_drain"):
                        drain = DRAIN_KEY.format(name=job_id)
                        args = (job_id, job_key_prefix, expires_extra_ms, payload, now_ms)
                        pipe.eval(_ONCE_PER_DRAIN, 2, drain, QUEUE_NAME, *args)  # type: ignore[arg-type]
                        continue
                    due = options.get("_defer_until")
                    score = int(due.timestamp() * 1000) if due is not None else now_ms
                    pipe.psetex(job_key_prefix + job_id, expires_extra_ms + max(0, score - now_ms), payload)
                    pipe.zadd(QUEUE_NAME, {job_id: score})
                if self.wake:
                    pipe.publish(WAKE_CHANNEL, b"")  # after the jobs, in the same round trip
                await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("queue.enqueue_skipped", jobs=len(jobs), error=type(exc).__name__)
            return 0
        return len(jobs)

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(self.timeout_s):
                return bool(await self.redis.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        await self.redis.aclose()


async def next_drain(redis: ArqRedis, name: str) -> None:
    """A drain of `name` starts: the jobs `_once_per_drain` enqueued from now on are the next one's.
    Called before the drain's first look at the scope, so whatever an enqueue was folded into this job
    for is committed before that look. Without Redis nothing moves on: later wake-ups fold into this
    job (already running), and what they stand for waits for the drain's last look or the sweeper."""
    key = DRAIN_KEY.format(name=name)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, _DRAIN_KEY_TTL_S)
            await pipe.execute()
    except (RedisError, OSError) as exc:
        log.warning("queue.drain_not_moved_on", error=type(exc).__name__)
