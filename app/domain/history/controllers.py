"""`/v1/admin`: changesets, rollback, revert, restore (undo), and the purge of a user."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Annotated, Any

from litestar import Controller, Request, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Principal
from app.domain.audit.services import Actor
from app.domain.history import services
from app.domain.history.repositories import HistoryRepository
from app.domain.history.schemas import (
    BulkRevertIn,
    ChangesetList,
    ChangesetOut,
    DiffOut,
    PurgeOut,
    RestoreIn,
    RevertIn,
    RollbackIn,
)
from app.domain.memories.services import decode_cursor
from app.lib.errors import ApiError
from app.lib.params import Limit, Text, UserId, When

AdminRequest = Request[Principal, Any, Any]


def _who(request: AdminRequest, reason: str | None = None) -> Actor:
    return Actor(request.user.actor, request.state.get("request_id"), reason)


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
