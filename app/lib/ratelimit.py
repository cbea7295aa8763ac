"""Per-key request rate limits: a token bucket per API key in Redis, one round trip per request.

A key may make `burst` requests at once and `rate_per_s` a second after that; past it the request is
answered 429 `rate_limited` with `Retry-After`, before any handler runs, so it costs the database
nothing. The bucket lives in Redis, so the limit holds across every API process, on Redis's clock.
Limits are a shield for everyone else, not a source of truth: while Redis is unreachable requests
pass (and a warning is logged once), as ingestion does.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

# KEYS[1]: the bucket; ARGV: rate per second, burst. Returns {allowed (1/0), milliseconds to wait}.
_BUCKET_SCRIPT = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 't', 'v')
local last = tonumber(state[1]) or now
local tokens = tonumber(state[2]) or burst
tokens = math.min(burst, tokens + math.max(0, now - last) * rate / 1000)
if tokens < 1 then
  return {0, math.ceil((1 - tokens) * 1000 / rate)}
end
redis.call('HSET', KEYS[1], 't', now, 'v', tostring(tokens - 1))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {1, 0}
"""


@dataclass(frozen=True)
class Limit:
    rate_per_s: float  # 0: no limit
    burst: int

    @property
    def off(self) -> bool:
        return self.rate_per_s <= 0 or self.burst <= 0


NO_LIMIT = Limit(0.0, 0)


class RateLimiter:
    def __init__(self, redis: Redis, timeout_s: float = 0.25) -> None:
        self.redis = redis
        self.timeout_s = timeout_s
        self._script = redis.register_script(_BUCKET_SCRIPT)
        self._warned_at = -math.inf

    async def wait_s(self, key: str, limit: Limit) -> float:
        """0 if a request on `key` may go now, else the seconds until it may."""
        if limit.off:
            return 0.0
        try:
            async with asyncio.timeout(self.timeout_s):
                allowed, wait_ms = await self._script(
                    keys=[f"memstore:rate:{key}"], args=[limit.rate_per_s, limit.burst]
                )
        except (RedisError, OSError, TimeoutError) as exc:
            if time.monotonic() - self._warned_at > 60:
                self._warned_at = time.monotonic()
                log.warning("ratelimit.unavailable", error=type(exc).__name__, effect="requests pass")
            return 0.0
        return 0.0 if int(allowed) else max(int(wait_ms), 1) / 1000
