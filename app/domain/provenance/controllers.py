"""`GET /v1/memories/{id}/explain`: why a memory says what it says."""

from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.exceptions import PermissionDeniedException
from litestar.params import FromPath, QueryParameter
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.provenance.schemas import ExplainOut
from app.domain.provenance.services import Reader, explain_memory
from app.lib.errors import NotFoundError, error_responses


class ProvenanceController(Controller):
    path = "/v1/memories"
    tags = ["memories"]

    @get(
        "/{memory_id:uuid}/explain",
        guards=[requires_role("read")],
        summary="Every version of a memory beside the messages, context, candidates and changeset behind it",
        responses=error_responses(NotFoundError),
    )
    async def explain(
        self,
        memory_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        raw_output: Annotated[
            bool,
            QueryParameter(
                description="Also the writers' raw output (admin keys only; each read is audited)."
            ),
        ] = False,
    ) -> ExplainOut:
        if raw_output and not caller.may("admin"):
            raise PermissionDeniedException("Reading a writer's raw output needs the 'admin' role.")
        return await explain_memory(
            db_session,
            caller.tenant_id,
            memory_id,
            raw_output=raw_output,
            reader=Reader(caller.actor, caller.request_id),
        )
