"""Changesets: one per apply (a chunk's writer result, or an admin action)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, Index, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, tenant_key, timestamp_column, uuid_id

# `review`: a held writer op, applied on approval with the writer's provenance.
CHANGESET_KINDS = ("writer", "rollback", "revert", "restore", "manual", "review")
CHANGESET_STATUSES = ("applied", "reverted")


class Changeset(Base):
    """The ops of one apply with the writer's raw output and provenance.

    Only `status` may ever change (`applied` -> `reverted`); a trigger enforces it.
    """

    __tablename__ = "changesets"
    __table_args__ = (
        tenant_key(),
        # Exactly-once effect: a chunk can be applied by a writer at most once, whatever the queue does.
        Index(
            "uq_changesets_writer_chunk",
            "tenant_id",
            "chunk_id",
            unique=True,
            postgresql_where=text("kind = 'writer'"),
        ),
        Index("ix_changesets_scope_time", "tenant_id", "user_id", "created_at"),
        Index("ix_changesets_tenant_model_time", "tenant_id", "writer", "model", "created_at"),
        CheckConstraint(f"kind IN {CHANGESET_KINDS!r}", name="kind"),
        CheckConstraint(f"status IN {CHANGESET_STATUSES!r}", name="status"),
    )

    id: Mapped[uuid.UUID] = uuid_id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    user_id: Mapped[str] = mapped_column(String(200), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    chunk_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    writer: Mapped[str | None] = mapped_column(String(100))
    model: Mapped[str | None] = mapped_column(String(200))
    profile: Mapped[str | None] = mapped_column(String(50))
    prompt_hash: Mapped[str | None] = mapped_column(String(64))
    raw_output: Mapped[str | None] = mapped_column(Text)
    ops: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False, server_default="[]")
    # Guards that fired between the model and the database, token usage and latency.
    guards: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False, server_default="[]")
    usage: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    # For rollback / revert / restore: the changeset or time this one undoes.
    target: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="applied")
    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = timestamp_column()
