"""Replay: a tenant's stored chunks, run again through any writer into a fresh shadow bank.

The bank is named after the writer and the filter (`replay_bank_name`), so running the same replay
again finds the bank it made, feeds it nothing twice, and goes on with what is left. Its chunks are
written by the ordinary pipeline, in `seq` order per user: in the calling process (`drain`, what
`memstore replay` does) or by the workers (the admin endpoint wakes them).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.domain.pipeline.services import PipelineDeps, process_scope
from app.domain.shadows.repositories import Progress
from app.domain.shadows.services import REPLAY, Bank, ensure_bank, feed, progress, replay_bank_name
from app.writers.registry import WriterRegistry

# Since the beginning: a replay without `since` takes every stored chunk.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LONGEST_WAIT_S = 30.0

_WAITING_USERS = text(
    "SELECT DISTINCT user_id FROM chunks WHERE tenant_id = :p_bank AND status IN ('queued', 'processing')"
)


class UnknownReplayWriterError(ValueError):
    pass


async def start_replay(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    writer: str,
    writers: WriterRegistry,
    user_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    name: str | None = None,
) -> Bank:
    """The replay's bank (made on the first run); the writer must be one this process knows."""
    if not writers.knows(writer) or writer == "default":
        msg = f"unknown writer {writer!r} (available: {', '.join(writers.names()[1:])})"
        raise UnknownReplayWriterError(msg)
    return await ensure_bank(
        session,
        tenant_id,
        name=name or replay_bank_name(writer, user_id, since, until),
        writer=writer,
        kind=REPLAY,
        since=since or EPOCH,
        until=until,
        user_id=user_id,
    )


async def feed_all(engine: AsyncEngine, target: Bank) -> set[str]:
    """Feed the bank every chunk its filter selects, one committed batch at a time; the users fed."""
    users: set[str] = set()
    while True:
        async with AsyncSession(engine) as session, session.begin():
            fed = await feed(session, target)
        if not fed:
            return users
        users.update(fed)


async def waiting_users(engine: AsyncEngine, bank_id: uuid.UUID) -> list[str]:
    async with AsyncSession(engine) as session:
        return [r[0] for r in await session.execute(_WAITING_USERS, {"p_bank": bank_id})]


async def drain(
    deps: PipelineDeps,
    target: Bank,
    *,
    concurrency: int = 16,
    report: Callable[[Progress], None] | None = None,
) -> Progress:
    """Write the bank's waiting chunks here, up to `concurrency` users at once, until none is left
    waiting (a chunk in backoff is waited for); what the bank holds then."""
    slots = asyncio.Semaphore(concurrency)

    async def one(user_id: str) -> datetime | None:
        async with slots:
            return (await process_scope(deps, target.id, user_id, linked=True)).retry_at

    while True:
        users = await waiting_users(deps.engine, target.id)
        async with AsyncSession(deps.engine) as session:
            now = await progress(session, target)
        if report is not None:
            report(now)
        if not users:
            return now
        due = [at for at in await asyncio.gather(*(one(u) for u in users)) if at is not None]
        # Chunks still waiting are in backoff, or a worker is writing them: look again when one is due.
        wait = (min(due) - datetime.now(UTC)).total_seconds() if due else 0.2
        await asyncio.sleep(min(_LONGEST_WAIT_S, max(0.05, wait)))
