"""Writer views: what a writer was shown for the changeset it wrote, so its decision can be explained."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, ForeignKeyConstraint, Integer
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, tenant_key, timestamp_column


class WriterView(Base):
    """The candidate memories (local id -> memory and version) and how many earlier messages of the
    scope a writer was given for one chunk. The texts are not copied: the versions and the chunks,
    both immutable, hold them. Deleted with its changeset (a purge)."""

    __tablename__ = "writer_views"
    __table_args__ = (
        tenant_key("changeset_id"),
        # Co-located with its changeset: the tenant on both sides.
        ForeignKeyConstraint(
            ["tenant_id", "changeset_id"], ["changesets.tenant_id", "changesets.id"], ondelete="CASCADE"
        ),
    )

    changeset_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    # [{"local_id": 0, "memory_id": "...", "version": 3}, ...] in local-id order.
    candidates: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False, server_default="[]")
    # The writer saw the scope's last `context_messages` messages before its chunk.
    context_messages: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    created_at: Mapped[datetime] = timestamp_column()
