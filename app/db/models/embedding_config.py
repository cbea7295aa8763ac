"""The embedder that made the stored vectors: one row, so a change of embedder is noticed, not mixed in."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CheckConstraint, DateTime, Integer, SmallInteger, String, func
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base


class EmbeddingConfig(Base):
    """Name and dimension of the embedder behind `memories.embedding`, and a re-embedding in progress."""

    __tablename__ = "embedding_config"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, default=1)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    dim: Mapped[int] = mapped_column(Integer, nullable=False)
    # While `memstore reembed` runs: the embedder it moves to, and the last memory it finished, its
    # tenant and id (memories are walked tenant by tenant in id order, so an interrupted run resumes
    # after it).
    target_name: Mapped[str | None] = mapped_column(String(200))
    cursor_tenant_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    cursor: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # When a re-embedding last finished: vectors written before it are another model's (NULL: never).
    changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
