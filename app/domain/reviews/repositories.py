"""SQL of the review queue: held ops written with their changeset, listed, locked and decided."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Review

REVIEWS = cast("Table", Review.__table__)


class ReviewRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def insert_many(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            await self.session.execute(insert(REVIEWS), list(rows))

    async def get(self, tenant_id: uuid.UUID, review_id: uuid.UUID, *, lock: bool = False) -> Review | None:
        stmt = select(Review).where(Review.tenant_id == tenant_id, Review.id == review_id)
        if lock:
            stmt = stmt.with_for_update()
        return await self.session.scalar(stmt)

    async def page(
        self,
        tenant_id: uuid.UUID,
        *,
        status: str | None,
        user_id: str | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> Sequence[Review]:
        """Matching reviews, oldest first (a queue), keyset on (created_at, id)."""
        stmt = select(Review).where(Review.tenant_id == tenant_id)
        if status is not None:
            stmt = stmt.where(Review.status == status)
        if user_id is not None:
            stmt = stmt.where(Review.user_id == user_id)
        if after is not None:
            stmt = stmt.where(tuple_(Review.created_at, Review.id) > tuple_(*after))
        stmt = stmt.order_by(Review.created_at, Review.id).limit(limit)
        return (await self.session.scalars(stmt)).all()

    async def decide(
        self,
        review: Review,
        *,
        status: str,
        actor: str,
        reason: str | None,
        changeset_id: uuid.UUID | None = None,
    ) -> None:
        await self.session.execute(
            update(REVIEWS)
            .where(REVIEWS.c.tenant_id == review.tenant_id, REVIEWS.c.id == review.id)
            .values(
                status=status,
                decided_by=actor,
                decided_at=func.now(),
                decision_reason=reason,
                decision_changeset_id=changeset_id,
            )
        )
