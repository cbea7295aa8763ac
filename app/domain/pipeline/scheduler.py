"""Who the writer fleet serves next: weighted fair shares across tenants and, inside a tenant, across
its users, with each tenant's cap on the scopes it holds at once and a pause while its budget is spent.

Every worker slot that frees takes its next scope here (`take`), and gives it back after a turn
(`done`): a turn drains the scope for at most `MEMSTORE_SCHEDULER_TURN_S`, so a backlog is served a
turn at a time, interleaved with whoever else has work. The choice is stride scheduling (a form of
weighted fair queuing, start-time fair): each tenant with ready scopes has a *pass*; the tenant with
the lowest pass is served, and its pass moves on by `chunks served / weight`. A tenant that arrives
starts at the pass of the last tenant served — neither ahead on credit from its quiet hours nor
behind the backlog — so its first chunk is next. Inside the tenant its users are ordered the same way
(weight 1 each), live traffic before a backfill (an import, a `priority: backfill` batch) of the same
tenant. Work-conserving: a tenant alone gets every slot; a tenant at its cap or paused is skipped, and
the slot goes to the next.

State, all in Redis under `memstore:fair:` (shared by every worker and API process, one round trip a
call: the scripts below run atomically):

- `tenants`: tenants with ready scopes, by pass; `parked`: tenants paused (budget), until when;
- `ready:<tenant>`: the tenant's ready scopes by `band * BAND + pass` (band 0 live, 1 backfill);
- `running:<tenant>`: scopes taken, by when their lease lapses (a killed worker's share comes back);
- `params:<tenant>`: weight `w`, cap `c` (0: none), paused until `p` (ms): the weight and cap as the
  settings said them (`PATCH /v1/admin/settings`, `memstore tenants set` write them at once; a turn
  restores them from the tenant's settings once they lapse, after 5 minutes or a flush), the pause as a
  worker last found the tenant's budget;
- `due`: scopes to wake later (a backoff), by when; `vt`, `tpass`, `uvt`, `taken:<tenant>`: the
  virtual times; `owner:<tenant>`: the worker running each taken scope. A killed worker's turns lapse
  with their lease, or sooner when the sweeper finds their scope untouched and the worker's heartbeat
  gone.

Postgres stays the truth. Losing all of it (a flush, a restart) loses no chunk: the sweeper wakes
every scope whose chunks wait (with its band, from `chunks.backfill`), a tenant's weight, cap and
pause come back with the next turn a worker runs for it, and the passes start again from zero. A
wake-up for a scope already ready or running changes nothing but its band (live wins); one for a
running scope marks it ready behind the turn, so a chunk committed just after a turn's last look is
not left behind.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, cast

import structlog
from arq.connections import ArqRedis
from redis.exceptions import NoScriptError, RedisError

from app.domain.system.services import HEARTBEAT_KEY
from app.lib.queue import ScriptCall

log = structlog.get_logger(__name__)

PREFIX = "memstore:fair:"
# A band's span of passes: a backfill scope's pass is `BAND + pass`, after every live scope's.
BAND = 1e12
# Tenants looked at per pick (by pass) before giving up for this call: tenants at their cap or paused
# are skipped, and past this many in a row a slot waits for the next look.
SCAN = 64

# The shared functions: a scope made ready, a tenant made active.
_LIB = """
local P = 'memstore:fair:'
local BAND = 1e12
-- A tenant's weight and cap stand this long (s) from when its settings said them; then the next turn
-- brings them again from the settings (as its worker read them, at most a TTL of the options' cache old).
local PARAMS_TTL = 300
local function num(v, default) return tonumber(v) or default end
local function activate(t)
  if redis.call('ZSCORE', P .. 'tenants', t) or redis.call('ZSCORE', P .. 'parked', t) then return end
  local vt = num(redis.call('GET', P .. 'vt'), 0)
  local own = num(redis.call('HGET', P .. 'tpass', t), 0)
  redis.call('ZADD', P .. 'tenants', math.max(vt, own), t)
end
-- `pass`: nil for a wake-up (the tenant's current user virtual time, or just behind the turn of a
-- running scope); a turn's end gives its own.
local function ready(t, u, band, pass)
  local key = P .. 'ready:' .. t
  if not pass then
    local taken = redis.call('ZSCORE', P .. 'running:' .. t, u) and redis.call('HGET', P .. 'taken:' .. t, u)
    if taken then pass = math.fmod(tonumber(taken), BAND) + 1
    else pass = num(redis.call('HGET', P .. 'uvt', t), 0) end
  end
  local cur = redis.call('ZSCORE', key, u)
  if cur then
    cur = tonumber(cur)
    band = math.min(band, math.floor(cur / BAND))
    pass = math.max(pass, math.fmod(cur, BAND))
  end
  redis.call('ZADD', key, band * BAND + pass, u)
  activate(t)
end
"""

# ARGV: heartbeat key prefix, now (ms), then (tenant, user, band, due ms or 0, revive 1/0) per scope.
# `revive`: the sweeper found the scope's chunks untouched for a while; a turn that holds it is dropped
# if its worker's heartbeat is gone (a killed worker's), instead of waiting out its lease.
_READY = (
    _LIB
    + """
local now = tonumber(ARGV[2])
for i = 3, #ARGV, 5 do
  local t, u, band, due = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if ARGV[i + 4] == '1' then
    local owner = redis.call('HGET', P .. 'owner:' .. t, u)
    if not owner or redis.call('EXISTS', ARGV[1] .. owner) == 0 then
      redis.call('ZREM', P .. 'running:' .. t, u)
    end
  end
  if due > now then redis.call('ZADD', P .. 'due', due, band .. '\\t' .. t .. '\\t' .. u)
  else ready(t, u, band, nil) end
end
return 1
"""
)

# ARGV: slots, now (ms), lease (ms), scan, the worker's name. Returns (tenant, user, score, budgeted)
# per scope taken: budgeted, whether the tenant's settings have a daily token budget (fresher than a
# worker's cached read of them: a budget just set holds from the next turn).
_TAKE = (
    _LIB
    + """
local n, now, lease, scan = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local worker = ARGV[5]
for _, m in ipairs(redis.call('ZRANGEBYSCORE', P .. 'due', '-inf', now, 'LIMIT', 0, 500)) do
  local band, t, u = string.match(m, '^(%d)\\t([^\\t]+)\\t(.*)$')
  if t then ready(t, u, tonumber(band), nil) end
  redis.call('ZREM', P .. 'due', m)
end
for _, t in ipairs(redis.call('ZRANGEBYSCORE', P .. 'parked', '-inf', now, 'LIMIT', 0, 100)) do
  redis.call('ZREM', P .. 'parked', t)
  if redis.call('EXISTS', P .. 'ready:' .. t) == 1 then activate(t) end
end
local out, skip = {}, {}
local function leave(t, pass)
  redis.call('ZREM', P .. 'tenants', t)
  redis.call('HSET', P .. 'tpass', t, pass)
end
while #out < 4 * n do
  local heads = redis.call('ZRANGE', P .. 'tenants', 0, scan - 1, 'WITHSCORES')
  local picked = false
  for i = 1, #heads, 2 do
    local t, tp = heads[i], tonumber(heads[i + 1])
    if not skip[t] then
      local params = redis.call('HMGET', P .. 'params:' .. t, 'w', 'c', 'p')
      local w, cap, paused = num(params[1], 1), num(params[2], 0), num(params[3], 0)
      local running = P .. 'running:' .. t
      if paused > now then
        leave(t, tp)
        redis.call('ZADD', P .. 'parked', paused, t)
      else
        redis.call('ZREMRANGEBYSCORE', running, '-inf', now)
        if cap > 0 and redis.call('ZCARD', running) >= cap then
          skip[t] = true
        else
          local users = redis.call('ZRANGE', P .. 'ready:' .. t, 0, 15, 'WITHSCORES')
          local u, us
          for j = 1, #users, 2 do
            if not redis.call('ZSCORE', running, users[j]) then u, us = users[j], users[j + 1]; break end
          end
          if #users == 0 then
            leave(t, tp)
          elseif not u then
            skip[t] = true
          else
            redis.call('ZREM', P .. 'ready:' .. t, u)
            redis.call('ZADD', running, now + lease, u)
            redis.call('HSET', P .. 'taken:' .. t, u, us)
            redis.call('HSET', P .. 'owner:' .. t, u, worker)
            redis.call('HSET', P .. 'uvt', t, math.fmod(tonumber(us), BAND))
            redis.call('SET', P .. 'vt', tp)
            if redis.call('ZCARD', P .. 'ready:' .. t) > 0 then
              redis.call('ZADD', P .. 'tenants', tp + 1 / w, t)
            else
              leave(t, tp + 1 / w)
            end
            out[#out + 1] = t; out[#out + 1] = u; out[#out + 1] = us
            out[#out + 1] = redis.call('HGET', P .. 'params:' .. t, 'b') or '0'
            picked = true
            break
          end
        end
      end
    end
  end
  if not picked then break end
end
return out
"""
)

# ARGV: tenant, user, score when taken, chunks served, more (1/0), due (ms, 0: none), now (ms),
# then weight, cap, paused until (ms), budgeted (1/0) — or '' for "unchanged".
_DONE = (
    _LIB
    + """
local t, u, us, cost = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local more, due, now = ARGV[5] == '1', tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREM', P .. 'running:' .. t, u)
redis.call('HDEL', P .. 'taken:' .. t, u)
redis.call('HDEL', P .. 'owner:' .. t, u)
if ARGV[8] ~= '' then
  -- The pause is the worker's to decide; the weight and cap are the settings' (`configure`), which a
  -- worker's cached read only restores when Redis lost them.
  local key = P .. 'params:' .. t
  redis.call('HSETNX', key, 'w', ARGV[8])
  redis.call('HSETNX', key, 'c', ARGV[9])
  redis.call('HSETNX', key, 'b', ARGV[11])
  redis.call('HSET', key, 'p', ARGV[10])
  if redis.call('TTL', key) < 0 then redis.call('EXPIRE', key, PARAMS_TTL) end
end
local w = num(redis.call('HGET', P .. 'params:' .. t, 'w'), 1)
if cost > 1 then
  local extra = (cost - 1) / w
  local tp = redis.call('ZSCORE', P .. 'tenants', t)
  if tp then redis.call('ZADD', P .. 'tenants', tonumber(tp) + extra, t)
  else redis.call('HINCRBYFLOAT', P .. 'tpass', t, extra) end
end
local band, pass = math.floor(us / BAND), math.fmod(us, BAND)
if due > now then
  redis.call('ZADD', P .. 'due', due, band .. '\\t' .. t .. '\\t' .. u)
elseif more then
  ready(t, u, band, math.max(pass + math.max(cost, 1), num(redis.call('HGET', P .. 'uvt', t), 0)))
end
if num(ARGV[10], 0) > now and redis.call('ZSCORE', P .. 'tenants', t) then
  redis.call('HSET', P .. 'tpass', t, redis.call('ZSCORE', P .. 'tenants', t))
  redis.call('ZREM', P .. 'tenants', t)
  redis.call('ZADD', P .. 'parked', tonumber(ARGV[10]), t)
end
return 1
"""
)

# ARGV: tenant, weight, cap, paused until (ms), budgeted (1/0). A tenant's settings changed: they hold
# at once, and a tenant no longer paused is served again.
_CONFIGURE = (
    _LIB
    + """
local t = ARGV[1]
redis.call('HSET', P .. 'params:' .. t, 'w', ARGV[2], 'c', ARGV[3], 'p', ARGV[4], 'b', ARGV[5])
redis.call('EXPIRE', P .. 'params:' .. t, PARAMS_TTL)
if tonumber(ARGV[4]) == 0 and redis.call('ZSCORE', P .. 'parked', t) then
  redis.call('ZREM', P .. 'parked', t)
  if redis.call('EXISTS', P .. 'ready:' .. t) == 1 then activate(t) end
end
return 1
"""
)

# ARGV: now (ms). Per tenant with ready scopes or parked: ready scopes, running scopes, paused.
_DEPTHS = """
local P = 'memstore:fair:'
local out = {}
local seen = {}
local function add(t)
  if seen[t] then return end
  seen[t] = true
  local running = redis.call('ZCOUNT', P .. 'running:' .. t, ARGV[1], '+inf')
  out[#out + 1] = t
  out[#out + 1] = redis.call('ZCARD', P .. 'ready:' .. t)
  out[#out + 1] = running
  out[#out + 1] = redis.call('ZSCORE', P .. 'parked', t) and 1 or 0
end
for _, t in ipairs(redis.call('ZRANGE', P .. 'tenants', 0, -1)) do add(t) end
for _, t in ipairs(redis.call('ZRANGE', P .. 'parked', 0, -1)) do add(t) end
return out
"""


def _call(script: str, *args: Any) -> ScriptCall:
    return ScriptCall(script, tuple(str(a) for a in args))


def now_ms() -> int:
    return int(time.time() * 1000)


def ready_call(scopes: list[tuple[uuid.UUID, str, bool, int, bool]]) -> ScriptCall:
    """The scopes made ready (or due later), in one call: (tenant, user, backfill, due ms or 0, revive:
    drop the turn that holds it if its worker's heartbeat is gone) each."""
    args: list[Any] = [HEARTBEAT_KEY.format(name=""), now_ms()]
    for tenant_id, user_id, backfill, due, revive in scopes:
        args += [tenant_id, user_id, 1 if backfill else 0, due, 1 if revive else 0]
    return _call(_READY, *args)


@dataclass(frozen=True)
class Turn:
    """A scope a worker slot took: whose, and the score it was taken at (its band and pass)."""

    tenant_id: uuid.UUID
    user_id: str
    score: str
    budgeted: bool = False  # the tenant has a daily token budget, as its settings last told the scheduler

    @property
    def backfill(self) -> bool:
        return float(self.score) >= BAND


# The tenant settings the scheduler holds (`Shares`): a change of one is passed on to it at once.
SHARES = ("write_weight", "max_writer_concurrency", "daily_token_budget")


@dataclass(frozen=True)
class Shares:
    """What the scheduler holds of a tenant's settings: its weight, its cap on scopes at once (0: none)
    and until when it is paused (ms since the epoch, 0: not)."""

    weight: float = 1.0
    cap: int = 0
    paused_until_ms: int = 0
    budgeted: bool = False  # it has a daily token budget (whether or not spent)


@dataclass(frozen=True)
class TenantQueue:
    """A tenant's place in the scheduler now: its ready and running scopes, whether it is paused."""

    tenant_id: str
    ready: int
    running: int
    paused: bool


async def run_call(redis: ArqRedis, call: ScriptCall) -> Any:
    """One script call, by its hash, loaded first if Redis does not have it (a restart, a flush)."""
    try:
        return await cast("Awaitable[Any]", redis.evalsha(call.sha, 0, *call.args))
    except NoScriptError:
        return await cast("Awaitable[Any]", redis.eval(call.script, 0, *call.args))


class FairScheduler:
    """The workers' side: take scopes for free slots, give them back after a turn."""

    def __init__(self, redis: ArqRedis, *, worker: str, lease_s: float) -> None:
        self.redis = redis
        self.worker = worker  # its heartbeat (`system.services`) says whether its turns are alive
        self.lease_ms = int(lease_s * 1000)

    async def take(self, slots: int) -> list[Turn]:
        """Up to `slots` scopes, fairest first; none without Redis (the sweeper's scopes wait)."""
        if slots <= 0:
            return []
        try:
            found = await run_call(
                self.redis, _call(_TAKE, slots, now_ms(), self.lease_ms, SCAN, self.worker)
            )
        except (RedisError, OSError) as exc:
            log.warning("scheduler.take_failed", error=type(exc).__name__)
            return []
        values = [v.decode() if isinstance(v, bytes) else str(v) for v in found or []]
        return [
            Turn(uuid.UUID(values[i]), values[i + 1], values[i + 2], values[i + 3] == "1")
            for i in range(0, len(values), 4)
        ]

    async def done(
        self,
        turn: Turn,
        *,
        served: int,
        more: bool,
        due_ms: int = 0,
        shares: Shares | None = None,
    ) -> None:
        """A turn is over: charge the tenant (and user) for the chunks it served, make the scope ready
        again if it has `more`, or due at `due_ms`; `shares`: the tenant's settings as just read."""
        params: tuple[Any, ...] = ("", "", "", "")
        if shares is not None:
            params = (repr(float(shares.weight)), shares.cap, shares.paused_until_ms, int(shares.budgeted))
        call = _call(
            _DONE,
            turn.tenant_id,
            turn.user_id,
            turn.score,
            served,
            1 if more else 0,
            due_ms,
            now_ms(),
            *params,
        )
        try:
            await run_call(self.redis, call)
        except (RedisError, OSError) as exc:
            # The lease lapses by itself; the sweeper wakes the scope if chunks wait.
            log.warning("scheduler.done_failed", error=type(exc).__name__)


async def configure(redis: ArqRedis, tenant_id: uuid.UUID, shares: Shares) -> bool:
    """A tenant's settings changed: the scheduler holds them from its next pick. Whether Redis had
    them (without it, the next turn a worker runs for the tenant brings them)."""
    call = _call(
        _CONFIGURE,
        tenant_id,
        repr(float(shares.weight)),
        shares.cap,
        shares.paused_until_ms,
        int(shares.budgeted),
    )
    try:
        await run_call(redis, call)
    except (RedisError, OSError) as exc:
        log.warning("scheduler.configure_failed", error=type(exc).__name__)
        return False
    return True


async def queues(redis: ArqRedis) -> list[TenantQueue]:
    """Each tenant with ready scopes or paused, as the scheduler holds it now."""
    found = await run_call(redis, _call(_DEPTHS, now_ms()))
    values = [v.decode() if isinstance(v, bytes) else v for v in found or []]
    return [
        TenantQueue(str(values[i]), int(values[i + 1]), int(values[i + 2]), bool(int(values[i + 3])))
        for i in range(0, len(values), 4)
    ]
