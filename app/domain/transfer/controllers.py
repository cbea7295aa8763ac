"""`POST /v1/admin/users/{user_id}/import`: another instance's export of a user, loaded as it was."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import JSONBody, PathParameter
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Principal
from app.domain.pipeline.wakeups import WakeReason, scope_wake
from app.domain.transfer.schemas import ImportIn, ImportOut
from app.domain.transfer.services import import_batch
from app.lib.queue import JobQueue

UserId = Annotated[str, PathParameter(min_length=1, max_length=200)]


AdminRequest = Request[Principal, Any, Any]


class TransferController(Controller):
    path = "/v1/admin/users"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @post(
        "/{user_id:str}/import",
        status_code=HTTP_200_OK,
        summary="Load a batch of another instance's export of a user: history as it was, ids mapped",
    )
    async def import_user(
        self,
        user_id: UserId,
        data: JSONBody[ImportIn],
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
    ) -> Response[ImportOut]:
        written = await import_batch(
            db_session,
            request.user.tenant_id,
            user_id,
            data,
            embedder=request.app.state.searcher.embedder,
            actor=request.user.actor,
            request_id=request.state.get("request_id"),
        )
        body = ImportOut(user_id=user_id, written=written)
        if not any(c.status in ("queued", "processing") for c in data.chunks):
            return Response(body)
        # Chunks the source had not finished are this instance's to write: wake a worker after the commit.
        queue: JobQueue = request.app.state.job_queue
        job = scope_wake(request.user.tenant_id, user_id, WakeReason.IMPORTED).job()
        return Response(body, background=BackgroundTask(queue.enqueue_many, [job]))
