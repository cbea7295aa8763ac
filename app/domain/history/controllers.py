"""`/v1/admin`: changesets, rollback, revert, restore (undo), and the purge of a user."""

from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Controller, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
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
from app.embeddings.base import Embedder
from app.lib.errors import (
    AlreadyReverted,
    InvalidField,
    MemoryChanged,
    NotFoundError,
    PurgeNotConfirmed,
    RevertConflict,
    TooManyChangesets,
    error_responses,
)
from app.lib.paging import KeysetCursor, cursor_after, decode_keyset, paged
from app.lib.params import Limit, Text, UserId, When


class AdminHistoryController(Controller):
    path = "/v1/admin"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get("/changesets", summary="Changesets, newest first", responses=error_responses(InvalidField))
    async def list_changesets(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        user_id: Text = None,
        writer: Text = None,
        model: Text = None,
        kind: Text = None,
        since: When = None,
        until: When = None,
        limit: Limit = 100,
        cursor: KeysetCursor = None,
    ) -> ChangesetList:
        before = decode_keyset(cursor) if cursor else None
        page = await paged(
            lambda n: HistoryRepository(db_session).changesets(
                caller.tenant_id,
                user_id=user_id,
                writer=writer,
                model=model,
                kind=kind,
                since=since,
                until=until,
                before=before,
                limit=n,
            ),
            limit,
            cursor_after,
        )
        return ChangesetList(items=[ChangesetOut.of(c) for c in page.items], next_cursor=page.next_cursor)

    @get(
        "/changesets/{changeset_id:uuid}",
        summary="One changeset with the writer's raw output (audited)",
        responses=error_responses(NotFoundError),
    )
    async def get_changeset(
        self,
        changeset_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
    ) -> ChangesetOut:
        changeset = await services.get_changeset(db_session, caller.tenant_id, changeset_id, who=caller.who())
        return ChangesetOut.of(changeset, raw=True)

    @post(
        "/memories/{memory_id:uuid}/rollback",
        status_code=HTTP_200_OK,
        summary="Roll a memory back",
        responses=error_responses(NotFoundError, InvalidField, MemoryChanged),
    )
    async def rollback(
        self,
        memory_id: FromPath[uuid.UUID],
        data: JSONBody[RollbackIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
    ) -> DiffOut:
        result = await services.rollback_memory(
            db_session,
            caller.tenant_id,
            memory_id,
            to_version=data.to_version,
            who=caller.who(data.reason),
            embedder=embedder,
            dry_run=data.dry_run,
        )
        return DiffOut.of(result)

    @post(
        "/changesets/{changeset_id:uuid}/revert",
        status_code=HTTP_200_OK,
        summary="Revert a changeset",
        responses=error_responses(NotFoundError, AlreadyReverted, RevertConflict, MemoryChanged),
    )
    async def revert(
        self,
        changeset_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        data: JSONBody[RevertIn | None] = None,
    ) -> DiffOut:
        body = data or RevertIn()
        result = await services.revert_changeset(
            db_session,
            caller.tenant_id,
            changeset_id,
            who=caller.who(body.reason),
            embedder=embedder,
            force=body.force,
            dry_run=body.dry_run,
        )
        return DiffOut.of(result)

    @post(
        "/users/{user_id:str}/restore",
        status_code=HTTP_200_OK,
        summary="Restore a user's bank as of a time",
        responses=error_responses(MemoryChanged),
    )
    async def restore(
        self,
        user_id: UserId,
        data: JSONBody[RestoreIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
    ) -> DiffOut:
        result = await services.restore_user(
            db_session,
            caller.tenant_id,
            user_id,
            as_of=data.as_of,
            who=caller.who(data.reason),
            embedder=embedder,
            dry_run=data.dry_run,
        )
        return DiffOut.of(result)

    @post(
        "/revert",
        status_code=HTTP_200_OK,
        summary="Revert every matching writer changeset, newest first",
        responses=error_responses(TooManyChangesets, RevertConflict, MemoryChanged),
    )
    async def bulk_revert(
        self,
        data: JSONBody[BulkRevertIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        settings: NamedDependency[Settings],
    ) -> DiffOut:
        result = await services.bulk_revert(
            db_session,
            caller.tenant_id,
            since=data.since,
            until=data.until,
            writer=data.writer,
            model=data.model,
            user_id=data.user_id,
            who=caller.who(data.reason),
            embedder=embedder,
            force=data.force,
            dry_run=data.dry_run,
            max_changesets=settings.max_bulk_revert_changesets,
        )
        return DiffOut.of(result)

    @delete(
        "/users/{user_id:str}",
        status_code=HTTP_200_OK,
        summary="Erase a user (GDPR): ?purge=true",
        responses=error_responses(PurgeNotConfirmed),
    )
    async def purge_user(
        self,
        user_id: UserId,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        # Required by the document (`?purge=true`); its absence is answered with purge_not_confirmed.
        purge: Annotated[bool, QueryParameter(required=True, schema_extra={"enum": [True]})] = False,
        dry_run: Annotated[bool, QueryParameter()] = False,
    ) -> PurgeOut:
        if not purge:
            raise PurgeNotConfirmed(
                "Erasing a user removes all their content for good; confirm with ?purge=true."
            )
        counts = await services.purge_user(
            db_session, caller.tenant_id, user_id, who=caller.who(), dry_run=dry_run
        )
        return PurgeOut(user_id=user_id, deleted=counts, dry_run=dry_run)
