"""A claimed chunk that did not get applied: a failed attempt (retried after a backoff, or failed for
good with its audit event), a fault outside Postgres (the claim given back uncounted, the chunk waiting
with the error on it), or a claim returned as the worker stops.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.audit.services import record_event
from app.domain.pipeline.repositories import ChunkRow, PipelineRepository
from app.domain.pipeline.services.deps import PipelineDeps
from app.domain.pipeline.services.faults import backoff
from app.domain.pipeline.services.scope_run import ScopeRun
from app.domain.webhooks.events import Announcement, announce, chunk_fields
from app.lib import metrics
from app.writers.base import storable_text

log = structlog.get_logger("app.domain.pipeline.services")

MAX_ERROR_CHARS = 2_000


async def failed_attempt(
    deps: PipelineDeps,
    chunk: ChunkRow,
    run: ScopeRun,
    error: str,
    raw: str | None = None,
    attempt_limit: int | None = None,
    *,
    writer_name: str,
    usage: dict[str, Any] | None = None,
) -> bool:
    """Record the claimed attempt as failed: retried after a backoff, or failed for good once the
    chunk has had its attempts (True: go on with the scope's next chunk)."""
    settings = deps.settings
    attempt = chunk.attempts
    final = attempt >= min(settings.max_attempts, attempt_limit or settings.max_attempts)
    retry_at = None if final else datetime.now(UTC) + backoff(settings, attempt)
    await fail(deps, chunk, error, raw, final=final, attempt=attempt, retry_at=retry_at, usage=usage)
    if final:
        metrics.CHUNKS_FINISHED.labels("failed", writer_name).inc()
        run.failed += 1
        return True
    run.retried += 1
    run.retry_at = retry_at
    return False


async def outage(deps: PipelineDeps, chunk: ChunkRow, run: ScopeRun, exc: Exception) -> bool:
    """A fault that is not the chunk's: the claim goes back uncounted, and the chunk waits with the
    error on it (`GET /v1/chunks/{id}` shows it) until the backoff has passed."""
    error = describe(exc)
    retry_at = datetime.now(UTC) + deps.outage.backoff()
    async with AsyncSession(deps.engine) as session, session.begin():
        await PipelineRepository(session).give_back(
            chunk, error=storable_text(error[:MAX_ERROR_CHARS]), available_at=retry_at
        )
    log.warning("chunk.outage", chunk_id=str(chunk.id), seq=chunk.seq, error=error, at=retry_at.isoformat())
    run.retried += 1
    run.retry_at = retry_at
    return False


async def give_back(deps: PipelineDeps, chunk: ChunkRow) -> None:
    """Return the claim's attempt, if Postgres answers; shielded, so a job cancelled again meanwhile
    does not stop it half-way."""

    async def give_back() -> None:
        async with AsyncSession(deps.engine) as session, session.begin():
            await PipelineRepository(session).give_back(chunk)

    try:
        await asyncio.shield(give_back())
    except Exception as exc:  # noqa: BLE001  (the fault being handled is what the caller reports)
        log.warning("chunk.give_back_failed", chunk_id=str(chunk.id), error=type(exc).__name__)


def describe(exc: BaseException) -> str:
    """An error as recorded on its chunk: a database error by the driver's exception and message
    (SQLAlchemy's text repeats the statement and its parameters)."""
    cause = getattr(exc, "orig", None) or exc
    driver = cause.__cause__ if isinstance(cause.__cause__, Exception) else cause  # asyncpg's, by name
    return f"{type(driver).__name__}: {cause}"


async def fail(
    deps: PipelineDeps,
    chunk: ChunkRow,
    error: str,
    raw: str | None,
    *,
    final: bool,
    attempt: int | None = None,
    retry_at: datetime | None = None,
    usage: dict[str, Any] | None = None,
) -> None:
    """Record a failed attempt (and, if final, its audit event) in a transaction of its own."""
    attempts = attempt if attempt is not None else chunk.attempts
    async with AsyncSession(deps.engine) as session, session.begin():
        recorded = await PipelineRepository(session).mark_failed_attempt(
            chunk.tenant_id,
            chunk.id,
            error=storable_text(error[:MAX_ERROR_CHARS]),  # a plugin's message may hold a NUL
            raw_output=None if raw is None else storable_text(raw),
            final=final,
            available_at=retry_at,
            attempt=attempt,
            usage=usage,
        )
        if recorded and final:
            await record_event(
                session,
                tenant_id=chunk.tenant_id,
                actor=deps.actor,
                action="chunk.failed",
                target_type="chunk",
                target_id=str(chunk.id),
                summary={"seq": chunk.seq, "attempts": attempts, "error": storable_text(error[:200])},
            )
            await announce(
                session,
                [
                    Announcement(
                        tenant_id=chunk.tenant_id,
                        user_id=chunk.user_id,
                        type="chunk.failed",
                        data={
                            **chunk_fields(chunk),
                            "attempts": attempts,
                            "writer": chunk.writer,
                            "error": storable_text(error[:200]),
                        },
                    )
                ],
            )
    if not recorded:
        return
    if final:
        log.warning("chunk.failed", chunk_id=str(chunk.id), seq=chunk.seq, attempts=attempts, error=error)
        if deps.announcer is not None:
            deps.announcer.finished(chunk.id)
    else:
        log.info(
            "chunk.retry_scheduled",
            chunk_id=str(chunk.id),
            seq=chunk.seq,
            attempts=attempts,
            error=error,
            at=retry_at.isoformat() if retry_at else None,
        )
