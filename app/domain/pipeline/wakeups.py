"""The one place every wake-up of a scope is made.

A wake-up is a hint, never the work: Postgres holds the chunks, and a lost wake-up costs only the
sweeper's delay. It makes the scope ready in the fair scheduler (`scheduler`), which decides which
ready scope a free worker slot drains next; a scope already ready or running is not queued twice, so
the reasons below differ only in what the logs say and in when the scope is due:

- `accepted`: chunks accepted by ingestion (a backfill batch's scope waits behind the tenant's live
  ones); `retried`, `imported` (a backfill), `replayed`, `fed` (a shadow bank's scope got new chunks);
- `backoff`: a chunk waits out its backoff; the scope is due when it has passed;
- `swept`: the sweeper found chunks waiting in Postgres that the scheduler does not hold (a lost
  wake-up, a Redis flush).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import structlog
from arq.connections import ArqRedis
from redis.exceptions import RedisError

from app.domain.pipeline.scheduler import ready_call, run_call
from app.lib.queue import ScriptCall

log = structlog.get_logger(__name__)

# The arq job that drains a whole scope: what wake-ups enqueued before the scheduler, still run if
# any are left in Redis from then; nothing enqueues it now.
SCOPE_JOB = "process_scope"


class WakeReason(StrEnum):
    ACCEPTED = "scope"
    RETRIED = "retry-chunk"
    IMPORTED = "import"
    REPLAYED = "replay"
    FED = "shadow"
    BACKOFF = "retry"
    SWEPT = "sweep"


@dataclass(frozen=True)
class ScopeWake:
    """A scope made ready, and why."""

    tenant_id: uuid.UUID
    user_id: str
    reason: WakeReason
    backfill: bool = False  # behind the tenant's live scopes
    defer_until: datetime | None = None  # not before then (a backoff)

    @property
    def entry(self) -> tuple[uuid.UUID, str, bool, int, bool]:
        """The scope as the scheduler's ready script takes it; a swept scope's turn, if the scheduler
        holds one, is a dead worker's (its chunks have been untouched for a while)."""
        due_ms = int(self.defer_until.timestamp() * 1000) if self.defer_until is not None else 0
        return (self.tenant_id, self.user_id, self.backfill, due_ms, self.reason is WakeReason.SWEPT)

    def job(self) -> ScriptCall:
        """The wake-up as `JobQueue.enqueue_many` takes it (the API's, after its commit)."""
        return ready_call([self.entry])


def scope_wake(
    tenant_id: uuid.UUID | str,
    user_id: str,
    reason: WakeReason,
    *,
    backfill: bool = False,
    defer_until: datetime | None = None,
) -> ScopeWake:
    tenant = tenant_id if isinstance(tenant_id, uuid.UUID) else uuid.UUID(tenant_id)
    return ScopeWake(tenant, user_id, reason, backfill or reason is WakeReason.IMPORTED, defer_until)


async def wake(redis: ArqRedis, *wake_ups: ScopeWake) -> bool:
    """Make scopes ready from a worker, in one round trip; without Redis the chunks still wait in
    Postgres for the sweeper. Whether it reached Redis."""
    if not wake_ups:
        return True
    call = ready_call([w.entry for w in wake_ups])
    try:
        await run_call(redis, call)
    except (RedisError, OSError) as exc:
        reasons = sorted({str(w.reason) for w in wake_ups})
        log.warning("scope.wake_up_not_queued", reason=reasons, error=f"{type(exc).__name__}: {exc}")
        return False
    return True
