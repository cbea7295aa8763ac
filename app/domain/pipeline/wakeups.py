"""The one place a scope's job is named and every wake-up of a scope is made.

A wake-up is a hint, never the work: Postgres holds the chunks, and a lost wake-up costs only the
sweeper's delay. The job (`jobs.process_scope_job`) drains the scope, whoever woke it, so each reason
a scope is woken differs only in its job's id — which decides which wake-ups fold into one job:

- `accepted`: chunks accepted by ingestion. One job per drain (`JobQueue`'s `_once_per_drain`): the
  chunks accepted before the scope's next drain starts share it, however many requests brought them.
- `retried`, `imported`, `replayed`, `fed` (a shadow bank's scope got new chunks): each wake-up a job.
- `backoff`: a chunk waits out its backoff; the scope is woken when it is due (one job per moment).
- `swept`: the sweeper found chunks no job will take; one job per scope and sweep window.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import structlog
from arq.connections import ArqRedis
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

SCOPE_JOB = "process_scope"


class WakeReason(StrEnum):
    ACCEPTED = "scope"
    RETRIED = "retry-chunk"
    IMPORTED = "import"
    REPLAYED = "replay"
    FED = "shadow"
    BACKOFF = "retry"
    SWEPT = "sweep"


def scope_job_name(tenant_id: uuid.UUID | str, user_id: str) -> str:
    """The name of a scope's drain jobs for accepted chunks (one per drain)."""
    return f"{WakeReason.ACCEPTED}:{tenant_id}:{user_id}"


@dataclass(frozen=True)
class ScopeWake:
    """A job that drains one scope, and why it was asked for."""

    tenant_id: uuid.UUID
    user_id: str
    reason: WakeReason
    # What tells this wake-up's job from another of the same reason (a time window, a moment); none: a
    # fresh one each time.
    key: str | None = None
    defer_until: datetime | None = None  # not before then (a backoff)

    @property
    def job_id(self) -> str:
        if self.reason is WakeReason.ACCEPTED:
            return scope_job_name(self.tenant_id, self.user_id)
        return f"{self.reason}:{self.tenant_id}:{self.user_id}:{self.key or uuid.uuid4().hex}"

    def job(self) -> tuple[str, dict[str, Any]]:
        """The job as `JobQueue.enqueue_many` takes it (the API's enqueue, after its commit)."""
        options: dict[str, Any] = {
            "tenant_id": str(self.tenant_id),
            "user_id": self.user_id,
            "_job_id": self.job_id,
        }
        if self.reason is WakeReason.ACCEPTED:
            options["_once_per_drain"] = True
        if self.defer_until is not None:
            options["_defer_until"] = self.defer_until
        return SCOPE_JOB, options


def scope_wake(
    tenant_id: uuid.UUID | str,
    user_id: str,
    reason: WakeReason,
    *,
    key: str | None = None,
    defer_until: datetime | None = None,
) -> ScopeWake:
    tenant = tenant_id if isinstance(tenant_id, uuid.UUID) else uuid.UUID(tenant_id)
    return ScopeWake(tenant, user_id, reason, key, defer_until)


async def wake(redis: ArqRedis, wake_up: ScopeWake) -> bool:
    """Enqueue a wake-up from a worker (arq's own enqueue, which skips a job id already queued);
    without Redis the chunks still wait in Postgres for the sweeper. Whether it was queued."""
    try:
        job = await redis.enqueue_job(
            SCOPE_JOB,
            tenant_id=str(wake_up.tenant_id),
            user_id=wake_up.user_id,
            _job_id=wake_up.job_id,
            _defer_until=wake_up.defer_until,
        )
    except (RedisError, OSError) as exc:
        log.warning(
            "scope.wake_up_not_queued", reason=str(wake_up.reason), error=f"{type(exc).__name__}: {exc}"
        )
        return False
    return job is not None
