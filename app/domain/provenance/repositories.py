"""SQL of writer views: what a writer was shown for each changeset it wrote."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import WriterView


class WriterViewRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def insert_many(self, rows: Sequence[dict[str, Any]]) -> None:
        """Views of changesets written in the caller's transaction (the changesets are inserted first)."""
        if rows:
            await self.session.execute(insert(WriterView), list(rows))

    async def by_changesets(
        self, tenant_id: uuid.UUID, changeset_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, WriterView]:
        if not changeset_ids:
            return {}
        rows = await self.session.scalars(
            select(WriterView).where(
                WriterView.tenant_id == tenant_id, WriterView.changeset_id.in_(list(set(changeset_ids)))
            )
        )
        return {view.changeset_id: view for view in rows}
