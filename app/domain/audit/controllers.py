"""`/v1/admin/audit`: the tenant's audit log, and the check of its hash chain."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.audit.repositories import AuditRepository
from app.domain.audit.schemas import AuditEventOut, AuditList, VerifyOut
from app.domain.audit.services import seal_and_verify
from app.lib.paging import EventCursor, paged
from app.lib.params import Limit, Text, When


class AuditController(Controller):
    path = "/v1/admin/audit"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get("/", summary="Audit events, oldest first")
    async def list_events(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        since: When = None,
        until: When = None,
        actor: Text = None,
        action: Text = None,
        limit: Limit = 100,
        cursor: EventCursor = None,
    ) -> AuditList:
        page = await paged(
            lambda n: AuditRepository(db_session).events(
                caller.tenant_id,
                since=since,
                until=until,
                actor=actor,
                action=action,
                after_id=int(cursor) if cursor else None,
                limit=n,
            ),
            limit,
            lambda event: str(event.id),  # the last event's id: an exporter may resume from it
        )
        return AuditList(items=[AuditEventOut.of(e) for e in page.items], next_cursor=page.next_cursor)

    @get("/verify", summary="Seal pending events and verify the tenant's hash chain")
    async def verify(
        self, caller: NamedDependency[Caller], sessionmaker: NamedDependency[async_sessionmaker[AsyncSession]]
    ) -> VerifyOut:
        verdict = await seal_and_verify(sessionmaker, caller.tenant_id)
        return VerifyOut(
            ok=verdict.ok,
            checked=verdict.checked,
            unsealed=verdict.unsealed,
            broken_at_seq=verdict.broken_at_seq,
            reason=verdict.reason,
        )
