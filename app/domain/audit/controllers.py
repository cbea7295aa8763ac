"""`/v1/admin/audit`: the tenant's audit log, and the check of its hash chain."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, get
from litestar.di import NamedDependency
from litestar.params import QueryParameter
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Principal
from app.domain.audit.repositories import AuditRepository
from app.domain.audit.schemas import AuditEventOut, AuditList, VerifyOut
from app.domain.audit.services import seal_and_verify
from app.lib.errors import ApiError
from app.lib.params import Limit, Text, When

AdminRequest = Request[Principal, Any, Any]


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
            raise ApiError(
                "The cursor is not valid.",
                code="validation_error",
                status_code=422,
                details={"field": "cursor"},
            )
        page = await AuditRepository(db_session).events(
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
