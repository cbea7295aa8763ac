"""`/v1/admin`: changesets, rollback, revert, restore, retry, purge; `/v1/admin/audit`: the audit log."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, PathParameter, QueryParameter
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Principal
from app.domain.audit.services import seal_and_verify
from app.domain.history import services
from app.domain.history.repositories import HistoryRepository
from app.domain.history.schemas import (
    AuditEventOut,
    AuditList,
    BulkRevertIn,
    ChangesetList,
    ChangesetOut,
    DiffOut,
    PurgeOut,
    RestoreIn,
    RetryIn,
    RetryOut,
    RevertIn,
    RollbackIn,
    VerifyOut,
)
from app.domain.ingest.services import PROCESS_SCOPE_JOB
from app.domain.memories.services import decode_cursor
from app.lib.errors import ApiError
from app.lib.queue import JobQueue
from app.lib.validation import Moment

AdminRequest = Request[Principal, Any, Any]
Limit = Annotated[int, QueryParameter(ge=1, le=1000)]
Text = Annotated[str | None, QueryParameter(min_length=1, max_length=200)]
When = Annotated[Moment | None, QueryParameter()]
UserId = Annotated[str, PathParameter(min_length=1, max_length=200)]


def _who(request: AdminRequest, reason: str | None = None) -> services.Actor:
    return services.Actor(request.user.actor, request.state.get("request_id"), reason)


def _cursor(created_at: datetime, item_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{item_id}".encode()).decode().rstrip("=")


def _invalid_cursor() -> ApiError:
    return ApiError(
        "The cursor is not valid.", code="validation_error", status_code=422, details={"field": "cursor"}
    )


class AdminHistoryController(Controller):
    path = "/v1/admin"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get("/changesets", summary="Changesets, newest first")
    async def list_changesets(
        self,
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
        user_id: Text = None,
        writer: Text = None,
        model: Text = None,
        kind: Text = None,
        since: When = None,
        until: When = None,
        limit: Limit = 100,
        cursor: Annotated[str | None, QueryParameter(max_length=500)] = None,
    ) -> ChangesetList:
        page = await HistoryRepository(db_session).changesets(
            request.user.tenant_id,
            user_id=user_id,
            writer=writer,
            model=model,
            kind=kind,
            since=since,
            until=until,
            before=decode_cursor(cursor) if cursor else None,
            limit=limit + 1,
        )
        next_cursor = _cursor(page[limit - 1].created_at, page[limit - 1].id) if len(page) > limit else None
        return ChangesetList(items=[ChangesetOut.of(c) for c in page[:limit]], next_cursor=next_cursor)

    @get("/changesets/{changeset_id:uuid}", summary="One changeset with the writer's raw output (audited)")
    async def get_changeset(
        self,
        changeset_id: FromPath[uuid.UUID],
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
    ) -> ChangesetOut:
        changeset = await services.get_changeset(
            db_session, request.user.tenant_id, changeset_id, who=_who(request)
        )
        return ChangesetOut.of(changeset, raw=True)

    @post("/memories/{memory_id:uuid}/rollback", status_code=HTTP_200_OK, summary="Roll a memory back")
    async def rollback(
        self,
        memory_id: FromPath[uuid.UUID],
        data: JSONBody[RollbackIn],
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
    ) -> DiffOut:
        result = await services.rollback_memory(
            db_session,
            request.user.tenant_id,
            memory_id,
            to_version=data.to_version,
            who=_who(request, data.reason),
            embedder=request.app.state.searcher.embedder,
            dry_run=data.dry_run,
        )
        return DiffOut.of(result)

    @post("/changesets/{changeset_id:uuid}/revert", status_code=HTTP_200_OK, summary="Revert a changeset")
    async def revert(
        self,
        changeset_id: FromPath[uuid.UUID],
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
        data: JSONBody[RevertIn | None] = None,
    ) -> DiffOut:
        body = data or RevertIn()
        result = await services.revert_changeset(
            db_session,
            request.user.tenant_id,
            changeset_id,
            who=_who(request, body.reason),
            embedder=request.app.state.searcher.embedder,
            force=body.force,
            dry_run=body.dry_run,
        )
        return DiffOut.of(result)

    @post(
        "/users/{user_id:str}/restore", status_code=HTTP_200_OK, summary="Restore a user's bank as of a time"
    )
    async def restore(
        self,
        user_id: UserId,
        data: JSONBody[RestoreIn],
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
    ) -> DiffOut:
        result = await services.restore_user(
            db_session,
            request.user.tenant_id,
            user_id,
            as_of=data.as_of,
            who=_who(request, data.reason),
            embedder=request.app.state.searcher.embedder,
            dry_run=data.dry_run,
        )
        return DiffOut.of(result)

    @post("/revert", status_code=HTTP_200_OK, summary="Revert every matching writer changeset, newest first")
    async def bulk_revert(
        self, data: JSONBody[BulkRevertIn], request: AdminRequest, db_session: NamedDependency[AsyncSession]
    ) -> DiffOut:
        result = await services.bulk_revert(
            db_session,
            request.user.tenant_id,
            since=data.since,
            until=data.until,
            writer=data.writer,
            model=data.model,
            user_id=data.user_id,
            who=_who(request, data.reason),
            embedder=request.app.state.searcher.embedder,
            force=data.force,
            dry_run=data.dry_run,
            max_changesets=request.app.state.settings.max_bulk_revert_changesets,
        )
        return DiffOut.of(result)

    @post("/chunks/{chunk_id:uuid}/retry", status_code=HTTP_200_OK, summary="Re-queue a failed chunk")
    async def retry_chunk(
        self,
        chunk_id: FromPath[uuid.UUID],
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
        data: JSONBody[RetryIn | None] = None,
    ) -> Response[RetryOut]:
        dry_run = bool(data and data.dry_run)
        chunk = await services.retry_chunk(
            db_session, request.user.tenant_id, chunk_id, who=_who(request), dry_run=dry_run
        )
        if dry_run:
            return Response(RetryOut(chunk_id=chunk.id, seq=chunk.seq, status="queued", dry_run=True))
        queue: JobQueue = request.app.state.job_queue
        job = (
            PROCESS_SCOPE_JOB,
            {
                "tenant_id": str(chunk.tenant_id),
                "user_id": chunk.user_id,
                "_job_id": f"retry-chunk:{chunk.id}:{uuid.uuid4().hex[:8]}",
            },
        )
        # After the commit, as ingestion does: a worker woken earlier could find the chunk still failed.
        return Response(
            RetryOut(chunk_id=chunk.id, seq=chunk.seq, status=chunk.status),
            background=BackgroundTask(queue.enqueue_many, [job]),
        )

    @delete("/users/{user_id:str}", status_code=HTTP_200_OK, summary="Erase a user (GDPR): ?purge=true")
    async def purge_user(
        self,
        user_id: UserId,
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
        purge: Annotated[bool, QueryParameter()] = False,
        dry_run: Annotated[bool, QueryParameter()] = False,
    ) -> PurgeOut:
        if not purge:
            raise ApiError(
                "Erasing a user removes all their content for good; confirm with ?purge=true.",
                code="purge_not_confirmed",
                status_code=400,
            )
        counts = await services.purge_user(
            db_session, request.user.tenant_id, user_id, who=_who(request), dry_run=dry_run
        )
        return PurgeOut(user_id=user_id, deleted=counts, dry_run=dry_run)


class AuditController(Controller):
    path = "/v1/admin/audit"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get("/", summary="Audit events, oldest first")
    async def list_events(
        self,
        request: AdminRequest,
        db_session: NamedDependency[AsyncSession],
        since: When = None,
        until: When = None,
        actor: Text = None,
        action: Text = None,
        limit: Limit = 100,
        cursor: Annotated[str | None, QueryParameter(max_length=40)] = None,
    ) -> AuditList:
        if cursor is not None and not cursor.isdigit():
            raise _invalid_cursor()
        page = await HistoryRepository(db_session).audit_events(
            request.user.tenant_id,
            since=since,
            until=until,
            actor=actor,
            action=action,
            after_id=int(cursor) if cursor else None,
            limit=limit + 1,
        )
        next_cursor = str(page[limit - 1].id) if len(page) > limit else None
        return AuditList(items=[AuditEventOut.of(e) for e in page[:limit]], next_cursor=next_cursor)

    @get("/verify", summary="Seal pending events and verify the tenant's hash chain")
    async def verify(self, request: AdminRequest) -> VerifyOut:
        verdict = await seal_and_verify(request.app.state.sessionmaker, request.user.tenant_id)
        return VerifyOut(
            ok=verdict.ok,
            checked=verdict.checked,
            unsealed=verdict.unsealed,
            broken_at_seq=verdict.broken_at_seq,
            reason=verdict.reason,
        )
