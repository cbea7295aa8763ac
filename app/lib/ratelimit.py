"""Request and chunk rate limits: token buckets in Redis, shared by every API process.

Two limits, each a bucket that holds at most `burst` tokens and refills at `rate_per_s`:

- **per API key** (`RateLimiter.wait_s`), on every authenticated request, before any handler runs;
- **per user** (`RateLimiter.admit`), on the chunks of each end user (a scope), charged by ingestion's
  group commit for all the requests of a batch at once: one flooding user of a chat app is refused
  while the app's other users, behind the same key, are not.

Past a limit a request is answered 429 `rate_limited` with `Retry-After`, and costs the database
nothing. The buckets live in Redis, on Redis's clock, so a limit holds across API processes.

A key's tokens are leased a few at a time (`lease_size`: about 20 ms of its rate, at most a tenth of
its burst, one for a small limit): a process spends its lease locally and asks Redis again when it is
used up, so a busy key costs one round trip per lease, not per request. Tokens of a lease unspent
after `LEASE_S` lapse (the limit errs strict), and N processes may together overshoot a burst by at
most N leases. The users' buckets are charged exactly, one script call per batch.

Limits are a shield for everyone else, not a source of truth: while Redis is unreachable requests
pass (and a warning is logged once a minute; Redis is asked again a second after a failed call), as
ingestion does.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

# KEYS[1]: the bucket; ARGV: rate per second, burst, tokens wanted. Takes what is there, up to the
# tokens wanted: returns {tokens granted, 0}, or {0, milliseconds until one is there}.
_LEASE_SCRIPT = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 't', 'v')
local last = tonumber(state[1]) or now
local tokens = tonumber(state[2]) or burst
tokens = math.min(burst, tokens + math.max(0, now - last) * rate / 1000)
if tokens < 1 then
  return {0, math.ceil((1 - tokens) * 1000 / rate)}
end
local granted = math.min(want, math.floor(tokens))
redis.call('HSET', KEYS[1], 't', now, 'v', tostring(tokens - granted))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {granted, 0}
"""

# KEYS: the buckets of a batch; ARGV: rate per second, burst, then per request its number of buckets
# m and m pairs (bucket's index in KEYS, tokens). In order, a request takes its tokens from all its
# buckets or from none. Returns per request two numbers: 0 (admitted) or the milliseconds until it
# would be, and the index in KEYS of the bucket that holds it back the longest (0 if none).
_ADMIT_SCRIPT = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local tokens = {}
for i, key in ipairs(KEYS) do
  local state = redis.call('HMGET', key, 't', 'v')
  local last = tonumber(state[1]) or now
  local held = tonumber(state[2]) or burst
  tokens[i] = math.min(burst, held + math.max(0, now - last) * rate / 1000)
end
local waits = {}
local pos = 3
while pos <= #ARGV do
  local m = tonumber(ARGV[pos])
  local wait = 0
  local holding = 0
  for j = 1, m do
    local k = tonumber(ARGV[pos + 2 * j - 1])
    local n = tonumber(ARGV[pos + 2 * j])
    if tokens[k] < n then
      local w = math.ceil((n - tokens[k]) * 1000 / rate)
      if w > wait then
        wait = w
        holding = k
      end
    end
  end
  if wait == 0 then
    for j = 1, m do
      local k = tonumber(ARGV[pos + 2 * j - 1])
      tokens[k] = tokens[k] - tonumber(ARGV[pos + 2 * j])
    end
  end
  waits[#waits + 1] = wait
  waits[#waits + 1] = holding
  pos = pos + 2 * m + 1
end
local ttl = math.ceil(burst * 1000 / rate) + 1000
for i, key in ipairs(KEYS) do
  redis.call('HSET', key, 't', now, 'v', tostring(tokens[i]))
  redis.call('PEXPIRE', key, ttl)
end
return waits
"""

LEASE_S = 1.0  # how long a process may spend a leased token
_LEASE_OF_RATE_S = 0.02  # a lease is about this much of the key's rate
_MAX_LEASES = 10_000  # keys with a lease held per process (a flood of keys cannot grow it without end)


@dataclass(frozen=True)
class Limit:
    rate_per_s: float  # 0: no limit
    burst: int

    @property
    def off(self) -> bool:
        return self.rate_per_s <= 0 or self.burst <= 0


NO_LIMIT = Limit(0.0, 0)


def lease_size(limit: Limit) -> int:
    """Tokens a process takes from a key's bucket at once: ~20 ms of its rate, at most a tenth of its
    burst, and one (each request asks Redis: exact) for a small limit."""
    return max(1, min(limit.burst // 10, math.ceil(limit.rate_per_s * _LEASE_OF_RATE_S)))


@dataclass
class _Lease:
    tokens: int
    until: float


class RateLimiter:
    def __init__(self, redis: Redis, timeout_s: float = 0.25) -> None:
        self.redis = redis
        self.timeout_s = timeout_s
        self._lease_script = redis.register_script(_LEASE_SCRIPT)
        self._admit_script = redis.register_script(_ADMIT_SCRIPT)
        self._leases: dict[str, _Lease] = {}
        self._asking: dict[str, asyncio.Future[float]] = {}  # one lease asked of Redis per key at a time
        self._warned_at = -math.inf
        self._down_until = -math.inf  # after a failed call, Redis is not asked again for a second

    async def wait_s(self, key: str, limit: Limit) -> float:
        """0 if a request on `key` may go now (a token of this process's lease is spent), else the
        seconds until it may."""
        if limit.off:
            return 0.0
        while True:
            lease = self._leases.get(key)
            if lease is not None and lease.tokens > 0 and lease.until > time.monotonic():
                lease.tokens -= 1
                return 0.0
            asking = self._asking.get(key)
            if asking is None:
                return await self._lease(key, limit)
            wait = await asyncio.shield(asking)  # another request is asking for this key: share it
            if wait > 0:
                return wait

    async def _lease(self, key: str, limit: Limit) -> float:
        asking: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._asking[key] = asking
        wait = 0.0
        try:
            want = lease_size(limit)
            args = [limit.rate_per_s, limit.burst, want]
            result = await self._call(self._lease_script, [f"memstore:rate:{key}"], args)
            if result is not None:
                granted, wait_ms = (int(v) for v in result)
                if granted > 0:
                    if len(self._leases) >= _MAX_LEASES:
                        self._leases.clear()
                    self._leases[key] = _Lease(granted - 1, time.monotonic() + LEASE_S)
                else:
                    wait = max(wait_ms, 1) / 1000
        finally:
            del self._asking[key]
            asking.set_result(wait)
        return wait

    async def admit(self, limit: Limit, requests: Sequence[dict[str, int]]) -> list[tuple[float, str | None]]:
        """Charge each request's tokens (bucket name -> tokens) in order, all of a request or none:
        per request (0, None) if admitted, else the seconds until it would be and the bucket that
        holds it back. One round trip for them all."""
        if limit.off or not requests:
            return [(0.0, None)] * len(requests)
        index: dict[str, int] = {}
        args: list[float] = [limit.rate_per_s, limit.burst]
        for charges in requests:
            args.append(len(charges))
            for bucket, tokens in charges.items():
                # A request larger than the burst is let through when the bucket is full (and empties it).
                args += [index.setdefault(bucket, len(index) + 1), min(tokens, limit.burst)]
        keys = [f"memstore:rate:{bucket}" for bucket in index]
        result = await self._call(self._admit_script, keys, args)
        if result is None:
            return [(0.0, None)] * len(requests)
        buckets = list(index)
        answers: list[tuple[float, str | None]] = []
        for ms, holding in zip(result[::2], result[1::2], strict=True):
            admitted = int(ms) == 0
            answers.append((0.0, None) if admitted else (int(ms) / 1000, buckets[int(holding) - 1]))
        return answers

    async def _call(self, script: object, keys: list[str], args: list[float]) -> list[int] | None:
        """The script's answer, or None (requests pass) when Redis does not give one in time."""
        if time.monotonic() < self._down_until:
            return None
        try:
            async with asyncio.timeout(self.timeout_s):
                return await script(keys=keys, args=args)  # type: ignore[operator, no-any-return]
        except (RedisError, OSError, TimeoutError) as exc:
            self._down_until = time.monotonic() + 1.0
            if time.monotonic() - self._warned_at > 60:
                self._warned_at = time.monotonic()
                log.warning("ratelimit.unavailable", error=type(exc).__name__, effect="requests pass")
            return None
