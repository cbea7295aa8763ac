"""`/v1/admin/chunks`: the chunk queue's admin endpoint, a failed chunk's retry."""

from __future__ import annotations

import uuid

from litestar import Controller, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.pipeline.schemas import RetryIn, RetryOut
from app.domain.pipeline.services import retry
from app.domain.pipeline.wakeups import WakeReason, scope_wake
from app.lib.errors import ChunkNotFailed, NotFoundError, error_responses
from app.lib.queue import JobQueue


class ChunkAdminController(Controller):
    path = "/v1/admin/chunks"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @post(
        "/{chunk_id:uuid}/retry",
        status_code=HTTP_200_OK,
        summary="Re-queue a failed chunk",
        responses=error_responses(NotFoundError, ChunkNotFailed),
    )
    async def retry_chunk(
        self,
        chunk_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        job_queue: NamedDependency[JobQueue],
        data: JSONBody[RetryIn | None] = None,
    ) -> Response[RetryOut]:
        dry_run = bool(data and data.dry_run)
        chunk = await retry.retry_chunk(
            db_session,
            caller.tenant_id,
            chunk_id,
            who=caller.who(),
            dry_run=dry_run,
        )
        if dry_run:
            return Response(RetryOut(chunk_id=chunk.id, seq=chunk.seq, status="queued", dry_run=True))
        job = scope_wake(chunk.tenant_id, chunk.user_id, WakeReason.RETRIED).job()
        # After the commit, as ingestion does: a worker woken earlier could find the chunk still failed.
        return Response(
            RetryOut(chunk_id=chunk.id, seq=chunk.seq, status=chunk.status),
            background=BackgroundTask(job_queue.enqueue_many, [job]),
        )
