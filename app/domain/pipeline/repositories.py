"""SQL the pipeline needs: the next chunk of a scope, its context, its outcome, and stranded scopes.

Plain Core statements: the worker runs them for every chunk, so they stay few and cheap.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Chunk

CHUNKS = cast("Table", Chunk.__table__)
PENDING = ("queued", "processing")


@dataclass(frozen=True)
class ChunkRow:
    """What the pipeline reads of a chunk."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: str
    agent_id: str | None
    run_id: str | None
    seq: int
    messages: list[dict[str, Any]]
    writer: str | None
    status: str
    attempts: int
    available_at: datetime
    received_at: datetime


class PipelineRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def next_pending(self, tenant_id: uuid.UUID, user_id: str) -> ChunkRow | None:
        """The scope's oldest unfinished chunk, row-locked.

        `processing` counts as unfinished: the caller holds the scope lock, so a chunk still marked
        `processing` was left by a worker that died mid-way, and is taken again.
        """
        c = CHUNKS.c
        row = (
            await self.session.execute(
                select(
                    c.id,
                    c.tenant_id,
                    c.user_id,
                    c.agent_id,
                    c.run_id,
                    c.seq,
                    c.messages,
                    c.writer,
                    c.status,
                    c.attempts,
                    c.available_at,
                    c.received_at,
                )
                .where(c.tenant_id == tenant_id, c.user_id == user_id, c.status.in_(PENDING))
                .order_by(c.seq)
                .limit(1)
                .with_for_update()
            )
        ).first()
        return None if row is None else ChunkRow(**row._asdict())

    async def claim_next(self, tenant_id: uuid.UUID, user_id: str, max_attempts: int) -> ChunkRow | None:
        """Take the scope's oldest unfinished chunk in one statement: mark it `processing` and count
        the attempt. None if that chunk is not takeable now (none left, backing off, or out of
        attempts); `next_pending` then says which."""
        c = CHUNKS.c
        oldest = (
            select(c.id)
            .where(c.tenant_id == tenant_id, c.user_id == user_id, c.status.in_(PENDING))
            .order_by(c.seq)
            .limit(1)
            .with_for_update()
            .scalar_subquery()
        )
        row = (
            await self.session.execute(
                update(CHUNKS)
                .where(c.id == oldest, c.available_at <= func.now(), c.attempts < max_attempts)
                .values(status="processing", attempts=c.attempts + 1, updated_at=func.now())
                .returning(
                    c.id,
                    c.tenant_id,
                    c.user_id,
                    c.agent_id,
                    c.run_id,
                    c.seq,
                    c.messages,
                    c.writer,
                    c.status,
                    c.attempts,
                    c.available_at,
                    c.received_at,
                )
            )
        ).first()
        return None if row is None else ChunkRow(**row._asdict())

    async def mark_applied(self, chunk_id: uuid.UUID, changeset_id: uuid.UUID) -> bool:
        """Flip the chunk to `applied`; False if an earlier delivery already did (then roll back)."""
        c = CHUNKS.c
        result = await self.session.execute(
            update(CHUNKS)
            .where(c.id == chunk_id, c.status != "applied")
            .values(
                status="applied",
                changeset_id=changeset_id,
                last_error=None,
                applied_at=func.now(),
                updated_at=func.now(),
            )
            .returning(c.id)
        )
        return result.first() is not None

    async def mark_failed_attempt(
        self,
        chunk_id: uuid.UUID,
        *,
        error: str,
        raw_output: str | None,
        final: bool,
        available_at: datetime | None,
    ) -> bool:
        """Record a failed attempt: back to `queued` until `available_at`, or `failed` for good."""
        c = CHUNKS.c
        values: dict[str, Any] = {
            "last_error": error,
            "raw_output": raw_output,
            "updated_at": func.now(),
            "status": "failed" if final else "queued",
        }
        if available_at is not None:
            values["available_at"] = available_at
        result = await self.session.execute(
            update(CHUNKS).where(c.id == chunk_id, c.status != "applied").values(**values).returning(c.id)
        )
        return result.first() is not None

    async def has_ready(self, tenant_id: uuid.UUID, user_id: str) -> bool:
        c = CHUNKS.c
        found = await self.session.scalar(
            select(c.id)
            .where(
                c.tenant_id == tenant_id,
                c.user_id == user_id,
                c.status.in_(PENDING),
                c.available_at <= func.now(),
            )
            .limit(1)
        )
        return found is not None

    async def earlier_messages(
        self, tenant_id: uuid.UUID, user_id: str, before_seq: int, limit: int
    ) -> list[dict[str, Any]]:
        """The scope's last `limit` messages before chunk `before_seq`, oldest first."""
        if limit <= 0:
            return []
        c = CHUNKS.c
        rows = await self.session.scalars(
            select(c.messages)
            .where(c.tenant_id == tenant_id, c.user_id == user_id, c.seq < before_seq)
            .order_by(c.seq.desc())
            .limit(limit)
        )
        messages = [m for chunk_messages in reversed(rows.all()) for m in chunk_messages]
        return messages[-limit:]

    async def stranded_scopes(self, min_age_s: float, limit: int = 1000) -> Sequence[tuple[uuid.UUID, str]]:
        """Scopes with unfinished chunks untouched for `min_age_s` whose backoff (if any) has passed."""
        c = CHUNKS.c
        rows = await self.session.execute(
            select(c.tenant_id, c.user_id)
            .where(
                c.status.in_(PENDING),
                c.updated_at < func.now() - text("make_interval(secs => :age)").bindparams(age=min_age_s),
                c.available_at <= func.now(),
            )
            .group_by(c.tenant_id, c.user_id)
            .limit(limit)
        )
        return [(r[0], r[1]) for r in rows]
