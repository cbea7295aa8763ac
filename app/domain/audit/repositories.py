"""SQL of the audit log."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.arrays import as_columns
from app.db.models import AuditEvent, AuditHead
from app.domain.audit.chain import GENESIS_HASH

_EVENT_COLUMNS = (
    "tenant_id",
    "actor",
    "action",
    "target_type",
    "target_id",
    "request_id",
    "summary",
    "created_at",
)
# A column each, as an array (`app.db.arrays`): one statement text for any number of events. RETURNING,
# unread: a Citus cluster inserts the rows of an INSERT … SELECT from a function by COPY into the shards,
# which row-level security refuses, unless the statement returns rows (then by INSERT on each shard).
_INSERT_EVENTS = text(
    """INSERT INTO audit_events (tenant_id, actor, action, target_type, target_id, request_id, summary,
                              created_at)
    SELECT tenant_id, actor, action, target_type, target_id, request_id, summary::jsonb, created_at
    FROM unnest(CAST(:tenant_id AS uuid[]), CAST(:actor AS text[]), CAST(:action AS text[]),
                CAST(:target_type AS text[]), CAST(:target_id AS text[]), CAST(:request_id AS text[]),
                CAST(:summary AS text[]), CAST(:created_at AS timestamptz[]))
        AS e(tenant_id, actor, action, target_type, target_id, request_id, summary, created_at)
    RETURNING id
    """
)
# A purge's event, written by the tables' owner as the purge's deletions are (migration 0022).
_RECORD_PURGE = text(
    """SELECT memstore_record_purge(CAST(:tenant_id AS uuid), CAST(:user_id AS text), CAST(:actor AS text),
                                    CAST(:request_id AS text), CAST(:deleted AS jsonb),
                                    CAST(:created_at AS timestamptz))"""
)


class AuditRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def insert_many(self, rows: Sequence[dict[str, Any]]) -> None:
        """Unsealed events (`audit.services.event_row`), in one statement of one text however many."""
        if rows:
            await self.session.execute(_INSERT_EVENTS, as_columns(rows, _EVENT_COLUMNS, json=("summary",)))

    async def insert_purge(
        self,
        tenant_id: uuid.UUID,
        user_id: str,
        *,
        actor: str,
        request_id: str | None,
        deleted: dict[str, int],
        created_at: datetime,
    ) -> None:
        """A purge's event (`user.purged`, unsealed), inserted as the tables' owner through
        `memstore_record_purge` (migration 0022), as the purge deleted: a Citus cluster refuses a
        second user on the shards the first modified in a transaction."""
        await self.session.execute(
            _RECORD_PURGE,
            {
                "tenant_id": tenant_id,
                "user_id": user_id,
                "actor": actor,
                "request_id": request_id,
                "deleted": json.dumps(deleted),
                "created_at": created_at,
            },
        )

    async def lock_head(self, tenant_id: uuid.UUID) -> AuditHead:
        """The tenant's chain head, row-locked until the transaction ends (sealers are serialised)."""
        await self.session.execute(
            pg_insert(AuditHead)
            .values(tenant_id=tenant_id, seq=0, hash=GENESIS_HASH)
            .on_conflict_do_nothing(index_elements=[AuditHead.tenant_id])
        )
        head = await self.session.scalar(
            select(AuditHead).where(AuditHead.tenant_id == tenant_id).with_for_update()
        )
        assert head is not None
        return head

    async def head(self, tenant_id: uuid.UUID) -> AuditHead | None:
        return await self.session.get(AuditHead, tenant_id, populate_existing=True)

    async def unsealed(self, tenant_id: uuid.UUID, limit: int) -> Sequence[AuditEvent]:
        result = await self.session.scalars(
            select(AuditEvent)
            .where(AuditEvent.tenant_id == tenant_id, AuditEvent.hash.is_(None))
            .order_by(AuditEvent.id)
            .limit(limit)
        )
        return result.all()

    async def seal(self, tenant_id: uuid.UUID, seals: Sequence[dict[str, Any]]) -> None:
        """Write chain positions and hashes of the tenant's unsealed events (the trigger allows this
        once)."""
        if not seals:
            return
        stmt = (
            update(AuditEvent)
            .where(AuditEvent.tenant_id == tenant_id, AuditEvent.id == bindparam("event_id"))
            .values(
                seq=bindparam("new_seq"), prev_hash=bindparam("new_prev_hash"), hash=bindparam("new_hash")
            )
        )
        conn = await self.session.connection()
        await conn.execute(stmt, list(seals))

    async def tenants_with_unsealed(self, limit: int = 1000) -> Sequence[uuid.UUID]:
        """Read across tenants, through a function of the tables' owner (migration 0008)."""
        return (await self.session.scalars(select(func.memstore_unsealed_audit_tenants(limit)))).all()

    async def count_unsealed(self, tenant_id: uuid.UUID) -> int:
        return int(
            await self.session.scalar(
                select(func.count())
                .select_from(AuditEvent)
                .where(AuditEvent.tenant_id == tenant_id, AuditEvent.hash.is_(None))
            )
            or 0
        )

    async def stream_sealed(self, tenant_id: uuid.UUID, batch: int = 1000) -> AsyncIterator[AuditEvent]:
        """Every sealed event of a tenant in chain order."""
        result = await self.session.stream_scalars(
            select(AuditEvent)
            .where(AuditEvent.tenant_id == tenant_id, AuditEvent.hash.is_not(None))
            .order_by(AuditEvent.seq)
            .execution_options(yield_per=batch)
        )
        async for event in result:
            yield event

    async def events(
        self,
        tenant_id: uuid.UUID,
        *,
        since: datetime | None,
        until: datetime | None,
        actor: str | None,
        action: str | None,
        after_id: int | None,
        limit: int,
    ) -> Sequence[AuditEvent]:
        """A tenant's events, oldest first, keyset-paginated on id."""
        stmt = select(AuditEvent).where(AuditEvent.tenant_id == tenant_id)
        if since is not None:
            stmt = stmt.where(AuditEvent.created_at >= since)
        if until is not None:
            stmt = stmt.where(AuditEvent.created_at < until)
        if actor is not None:
            stmt = stmt.where(AuditEvent.actor == actor)
        if action is not None:
            stmt = stmt.where(AuditEvent.action == action)
        if after_id is not None:
            stmt = stmt.where(AuditEvent.id > after_id)
        return (await self.session.scalars(stmt.order_by(AuditEvent.id).limit(limit))).all()
