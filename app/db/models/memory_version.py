"""Memory versions: one immutable row per write of a memory, with its provenance."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.dialects.postgresql import ARRAY, TSVECTOR, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.config import get_settings
from app.db.base import Base, Embedding, tenant_key, timestamp_column

VERSION_OPS = ("ADD", "UPDATE", "SUPERSEDE", "DELETE", "ROLLBACK", "RESTORE")


class MemoryVersion(Base):
    """The state of a memory after one write, and who wrote it, from what, and why.

    Append-only: a database trigger rejects UPDATE and DELETE (except inside an audited purge).
    """

    __tablename__ = "memory_versions"
    __table_args__ = (
        tenant_key(),
        Index("uq_memory_versions_memory_version", "tenant_id", "memory_id", "version", unique=True),
        # As-of reads: the latest version of each memory of a scope at or before a time.
        Index("ix_memory_versions_scope_time", "tenant_id", "user_id", "created_at"),
        Index("ix_memory_versions_changeset", "changeset_id"),
        CheckConstraint(f"op IN {VERSION_OPS!r}", name="op"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    user_id: Mapped[str] = mapped_column(String(200), nullable=False)
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    op: Mapped[str] = mapped_column(String(16), nullable=False)
    # The memory's full state after this write.
    content: Mapped[str] = mapped_column(Text, nullable=False)
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    owner: Mapped[str] = mapped_column(String(16), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    memory_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the fact held in the user's world (valid time, migration 0018): NULL where unknown; a fact
    # without `valid_from` is taken to hold from when it was stated (`memory_at`).
    valid_from: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    valid_to: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The text's language and lexemes as written (`memories.Memory`): undo copies them with the text, and
    # search as of a time reads them. NULL on versions written before migration 0017: English.
    language: Mapped[str | None] = mapped_column(String(8))
    lexemes: Mapped[str | None] = mapped_column(TSVECTOR, deferred=True)
    embedding: Mapped[list[float] | None] = mapped_column(Embedding(get_settings().embedding_dim))
    # Links of a SUPERSEDE: the memories this one replaced, or the one that replaced it.
    supersedes: Mapped[list[uuid.UUID] | None] = mapped_column(ARRAY(UUID(as_uuid=True)))
    superseded_by: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # Provenance (architecture invariant 6).
    changeset_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    chunk_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    writer: Mapped[str | None] = mapped_column(String(100))
    model: Mapped[str | None] = mapped_column(String(200))
    profile: Mapped[str | None] = mapped_column(String(50))
    prompt_hash: Mapped[str | None] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = timestamp_column()
