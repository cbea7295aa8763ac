"""`/v1/memories`: a scope's memories, one memory, and its version history."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from litestar import Controller, delete, get, patch
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.memories import services
from app.domain.memories.schemas import (
    HistoryOut,
    MemoryList,
    MemoryOut,
    MemoryPatch,
    MemoryWritten,
    VersionOut,
)
from app.embeddings.base import Embedder
from app.lib.errors import InvalidField, MemoryChanged, MemoryNotActive, NotFoundError, error_responses
from app.lib.paging import KeysetCursor
from app.lib.params import Limit
from app.lib.validation import Moment


def _written(caller: NamedDependency[Caller], memory: object) -> MemoryOut | MemoryWritten:
    """The memory after an edit, as the key may see it: a write-only key never receives its text."""
    return MemoryOut.of(memory) if caller.may("read") else MemoryWritten.of(memory)


class MemoryController(Controller):
    path = "/v1/memories"
    tags = ["memories"]

    @get(
        "/",
        guards=[requires_role("read")],
        summary="A user's memories (active by default), oldest first",
        responses=error_responses(InvalidField),
    )
    async def list_memories(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        user_id: Annotated[str, QueryParameter(min_length=1, max_length=200)],
        agent_id: Annotated[str | None, QueryParameter(max_length=200)] = None,
        status: Annotated[Literal["active", "superseded", "deleted", "all"], QueryParameter()] = "active",
        limit: Limit = 100,
        cursor: KeysetCursor = None,
        as_of: Annotated[
            Moment | None, QueryParameter(description="The bank as it stood at this time.")
        ] = None,
        include_expired: Annotated[
            bool, QueryParameter(description="Also the memories whose expires_at has passed.")
        ] = False,
        valid_at: Annotated[
            Moment | None,
            QueryParameter(
                description="Only the memories whose fact held at this time (valid time); with the "
                "default status, superseded ones too."
            ),
        ] = None,
    ) -> MemoryList:
        page = await services.list_memories(
            db_session,
            caller.tenant_id,
            user_id,
            agent_id=agent_id,
            status=status,
            cursor=cursor,
            limit=limit,
            as_of=as_of,
            include_expired=include_expired,
            valid_at=valid_at,
        )
        return MemoryList(items=[MemoryOut.of(m) for m in page.items], next_cursor=page.next_cursor)

    @get(
        "/{memory_id:uuid}",
        guards=[requires_role("read")],
        summary="One memory as it stands now",
        responses=error_responses(NotFoundError),
    )
    async def get_memory(
        self,
        memory_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
    ) -> MemoryOut:
        return MemoryOut.of(await services.get_memory(db_session, caller.tenant_id, memory_id))

    @get(
        "/{memory_id:uuid}/history",
        guards=[requires_role("read")],
        summary="Every version of a memory with its provenance, oldest first",
        responses=error_responses(NotFoundError),
    )
    async def history(
        self,
        memory_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
    ) -> HistoryOut:
        versions = await services.memory_history(db_session, caller.tenant_id, memory_id)
        return HistoryOut(memory_id=memory_id, versions=[VersionOut.of(v) for v in versions])

    @patch(
        "/{memory_id:uuid}",
        guards=[requires_role("write")],
        summary="Edit a memory by hand (a new version)",
        responses=error_responses(NotFoundError, InvalidField, MemoryNotActive, MemoryChanged),
    )
    async def edit_memory(
        self,
        memory_id: FromPath[uuid.UUID],
        data: JSONBody[MemoryPatch],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        settings: NamedDependency[Settings],
    ) -> MemoryOut | MemoryWritten:
        memory = await services.edit_memory(
            db_session,
            caller.tenant_id,
            memory_id,
            content=data.content,
            tags=data.tags,
            reason=data.reason,
            actor=caller.actor,
            request_id=caller.request_id,
            embedder=embedder,
            limits=services.ApplyLimits(max_chars=settings.max_memory_chars),
            expires_at=data.expires_at.plain() if isinstance(data.expires_at, Moment) else None,
            clears_expiry=data.expires_at is None,
        )
        return _written(caller, memory)

    @delete(
        "/{memory_id:uuid}",
        guards=[requires_role("write")],
        status_code=HTTP_200_OK,
        summary="Delete a memory by hand (soft: a new version with status deleted)",
        responses=error_responses(NotFoundError, MemoryNotActive, MemoryChanged),
    )
    async def delete_memory(
        self,
        memory_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        reason: Annotated[str | None, QueryParameter(max_length=2_000)] = None,
    ) -> MemoryOut | MemoryWritten:
        memory = await services.delete_memory(
            db_session,
            caller.tenant_id,
            memory_id,
            reason=reason,
            actor=caller.actor,
            request_id=caller.request_id,
            embedder=embedder,
        )
        return _written(caller, memory)
