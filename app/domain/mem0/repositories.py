"""SQL of the Mem0-compatible routes: a tenant's active memories under a compiled Mem0 filter, and the
entities (users, agents, runs) that hold them. Every query names the tenant; row-level security is the
second wall behind it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Memory

# Entities listed per kind (users, agents, runs), most recently written first.
MAX_ENTITIES = 1_000


class Mem0Repository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    def _active(self, tenant_id: uuid.UUID, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        return (Memory.tenant_id == tenant_id) & (Memory.status == "active") & condition

    async def count(self, tenant_id: uuid.UUID, condition: ColumnElement[bool]) -> int:
        stmt = select(func.count()).select_from(Memory).where(self._active(tenant_id, condition))
        return int(await self.session.scalar(stmt) or 0)

    async def page(
        self, tenant_id: uuid.UUID, condition: ColumnElement[bool], *, offset: int, limit: int
    ) -> Sequence[Memory]:
        """Active memories matching `condition`, newest first."""
        stmt = (
            select(Memory)
            .where(self._active(tenant_id, condition))
            .order_by(Memory.created_at.desc(), Memory.id.desc())
            .offset(offset)
            .limit(limit)
        )
        return (await self.session.scalars(stmt)).all()

    async def matching_ids(
        self, tenant_id: uuid.UUID, ids: Sequence[uuid.UUID], condition: ColumnElement[bool]
    ) -> set[uuid.UUID]:
        """Which of `ids` are active memories matching `condition`."""
        if not ids:
            return set()
        stmt = select(Memory.id).where(self._active(tenant_id, condition), Memory.id.in_(ids))
        return set((await self.session.scalars(stmt)).all())

    async def active(self, tenant_id: uuid.UUID, condition: ColumnElement[bool]) -> Sequence[Memory]:
        """Every active memory matching `condition` (what a delete-all removes), oldest first."""
        stmt = select(Memory).where(self._active(tenant_id, condition)).order_by(Memory.created_at, Memory.id)
        return (await self.session.scalars(stmt)).all()

    async def many(self, tenant_id: uuid.UUID, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Memory]:
        """The tenant's memories among `ids`, by id."""
        stmt = select(Memory).where(Memory.tenant_id == tenant_id, Memory.id.in_(ids))
        return {m.id: m for m in (await self.session.scalars(stmt)).all()}

    async def entities(
        self, tenant_id: uuid.UUID, kind: str
    ) -> Sequence[tuple[str, int, datetime, datetime]]:
        """(name, active memories, first written, last written) per user, agent or run of the tenant."""
        column = {"user": Memory.user_id, "agent": Memory.agent_id, "run": Memory.run_id}[kind]
        stmt = (
            select(column, func.count(), func.min(Memory.created_at), func.max(Memory.updated_at))
            .where(self._active(tenant_id, column.is_not(None)))
            .group_by(column)
            .order_by(func.max(Memory.updated_at).desc())
            .limit(MAX_ENTITIES)
        )
        return [(str(r[0]), int(r[1]), r[2], r[3]) for r in (await self.session.execute(stmt)).all()]
