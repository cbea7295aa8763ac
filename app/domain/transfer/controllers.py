"""`POST /v1/admin/users/{user_id}/import`: another instance's export of a user, loaded as it was."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import JSONBody, PathParameter
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.pipeline.wakeups import WakeReason, scope_wake
from app.domain.transfer.schemas import ImportIn, ImportOut
from app.domain.transfer.services import import_batch
from app.embeddings.base import Embedder
from app.lib.errors import ImportConflict, InvalidField, Unavailable, error_responses
from app.lib.queue import JobQueue

UserId = Annotated[str, PathParameter(min_length=1, max_length=200)]


class TransferController(Controller):
    path = "/v1/admin/users"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @post(
        "/{user_id:str}/import",
        status_code=HTTP_200_OK,
        summary="Load a batch of another instance's export of a user: history as it was, ids mapped",
        responses=error_responses(InvalidField, ImportConflict, Unavailable),
    )
    async def import_user(
        self,
        user_id: UserId,
        data: JSONBody[ImportIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        job_queue: NamedDependency[JobQueue],
    ) -> Response[ImportOut]:
        written = await import_batch(
            db_session,
            caller.tenant_id,
            user_id,
            data,
            embedder=embedder,
            actor=caller.actor,
            request_id=caller.request_id,
        )
        body = ImportOut(user_id=user_id, written=written)
        if not any(c.status in ("queued", "processing") for c in data.chunks):
            return Response(body)
        # Chunks the source had not finished are this instance's to write: wake a worker after the commit.
        job = scope_wake(caller.tenant_id, user_id, WakeReason.IMPORTED).job()
        return Response(body, background=BackgroundTask(job_queue.enqueue_many, [job]))
