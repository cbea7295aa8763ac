"""SQL of the audit log."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AuditEvent, AuditHead
from app.domain.audit.chain import GENESIS_HASH


class AuditRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def lock_head(self, tenant_id: uuid.UUID) -> AuditHead:
        """The tenant's chain head, row-locked until the transaction ends (appends are serialised)."""
        await self.session.execute(
            insert(AuditHead)
            .values(tenant_id=tenant_id, seq=0, hash=GENESIS_HASH)
            .on_conflict_do_nothing(index_elements=[AuditHead.tenant_id])
        )
        head = await self.session.scalar(
            select(AuditHead).where(AuditHead.tenant_id == tenant_id).with_for_update()
        )
        assert head is not None
        return head

    async def head(self, tenant_id: uuid.UUID) -> AuditHead | None:
        return await self.session.get(AuditHead, tenant_id)

    def add(self, event: AuditEvent) -> None:
        self.session.add(event)

    async def stream(self, tenant_id: uuid.UUID, batch: int = 1000) -> AsyncIterator[AuditEvent]:
        """Every event of a tenant in chain order."""
        result = await self.session.stream_scalars(
            select(AuditEvent)
            .where(AuditEvent.tenant_id == tenant_id)
            .order_by(AuditEvent.seq)
            .execution_options(yield_per=batch)
        )
        async for event in result:
            yield event
