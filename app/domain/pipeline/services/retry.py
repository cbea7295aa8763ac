"""An admin's retry of a failed chunk: back to the queue with a fresh set of attempts, audited; the
caller wakes the scope after the commit."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Chunk
from app.domain.audit.services import Actor, record_event
from app.domain.pipeline.repositories import PipelineRepository
from app.lib.errors import ChunkNotFailed, NotFoundError


async def retry_chunk(
    session: AsyncSession, tenant_id: uuid.UUID, chunk_id: uuid.UUID, *, who: Actor, dry_run: bool = False
) -> Chunk:
    """A failed chunk goes back to the queue with a fresh set of attempts (the caller wakes a worker
    after the commit). A dry run only checks that it could."""
    repo = PipelineRepository(session)
    if dry_run:
        found = await repo.chunk(tenant_id, chunk_id)
        chunk = found if found is not None and found.status == "failed" else None
    else:
        chunk = await repo.requeue_failed(tenant_id, chunk_id)
    if chunk is None:
        existing = await repo.chunk(tenant_id, chunk_id)
        if existing is None:
            raise NotFoundError("No such chunk.")
        raise ChunkNotFailed(
            f"Only a failed chunk can be retried; this one is {existing.status}.",
            details={"status": existing.status},
        )
    if dry_run:
        return chunk
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=who.actor,
        action="chunk.retried",
        target_type="chunk",
        target_id=str(chunk_id),
        request_id=who.request_id,
        summary={"seq": chunk.seq},
    )
    return chunk
