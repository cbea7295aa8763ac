"""Reviews: a writer's destructive op held for a human under the `review` policy."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, tenant_key, timestamp_column, uuid_id

REVIEW_STATUSES = ("pending", "approved", "rejected")


class Review(Base):
    """One op of a writer changeset that was held instead of applied, with what it was shown.

    The rest of its changeset applied; the memories it names stayed as they were. Approval applies it
    as new versions (a `review` changeset with the writer's provenance and the approver as actor),
    provided the memories are still at the versions recorded here. A trigger lets a row change only
    once, from `pending` to a decision.
    """

    __tablename__ = "reviews"
    __table_args__ = (
        tenant_key(),
        Index("ix_reviews_queue", "tenant_id", "status", "created_at", "id"),
        # The operators' count of reviews waiting, per tenant (`memstore_operator_status`).
        Index("ix_reviews_pending", "tenant_id", "created_at", postgresql_where=text("status = 'pending'")),
        Index("ix_reviews_scope", "tenant_id", "user_id", "created_at"),
        CheckConstraint(f"status IN {REVIEW_STATUSES!r}", name="status"),
    )

    id: Mapped[uuid.UUID] = uuid_id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    user_id: Mapped[str] = mapped_column(String(200), nullable=False)
    agent_id: Mapped[str | None] = mapped_column(String(200))
    run_id: Mapped[str | None] = mapped_column(String(200))
    # The writer changeset that held the op (its `guards` say so), its chunk, and the op's place in it.
    changeset_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    chunk_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    op_index: Mapped[int] = mapped_column(Integer, nullable=False)
    # The op as the writer gave it: {"op", "content", "tags", "owner", "reason"}.
    op: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    # The memories it targets, each at the version the writer was shown: [{"memory_id", "version"}].
    targets: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False)
    memory_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    writer: Mapped[str | None] = mapped_column(String(100))
    model: Mapped[str | None] = mapped_column(String(200))
    profile: Mapped[str | None] = mapped_column(String(50))
    prompt_hash: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="pending")
    decided_by: Mapped[str | None] = mapped_column(String(200))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    decision_reason: Mapped[str | None] = mapped_column(Text)
    # The `review` changeset an approval wrote.
    decision_changeset_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = timestamp_column()
