"""Chunks: the durable inbox. A chunk is acknowledged only once its row is committed."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, tenant_key, timestamp_column, uuid_id

CHUNK_STATUSES = ("queued", "processing", "applied", "failed")


class Chunk(Base):
    """Messages posted for one scope, numbered by `seq`, and where the worker got with them."""

    __tablename__ = "chunks"
    __table_args__ = (
        tenant_key(),
        # Per-scope order: `seq` is assigned at acceptance and never reused.
        Index("uq_chunks_scope_seq", "tenant_id", "user_id", "seq", unique=True),
        Index(
            "uq_chunks_tenant_idempotency_key",
            "tenant_id",
            "idempotency_key",
            unique=True,
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
        # The sweeper and the workers only ever look for unfinished chunks; keep that index small.
        # A worker takes the oldest unfinished chunk of its scope; applied chunks stay out of this index.
        Index(
            "ix_chunks_scope_pending",
            "tenant_id",
            "user_id",
            "seq",
            postgresql_where=text("status IN ('queued', 'processing')"),
        ),
        Index(
            "ix_chunks_pending",
            "updated_at",
            postgresql_where=text("status IN ('queued', 'processing')"),
        ),
        # The admin's list of failed chunks, newest first; failed chunks are few, so is this index.
        Index(
            "ix_chunks_failed",
            "tenant_id",
            "received_at",
            postgresql_where=text("status = 'failed'"),
        ),
        CheckConstraint(f"status IN {CHUNK_STATUSES!r}", name="status"),
    )

    id: Mapped[uuid.UUID] = uuid_id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    user_id: Mapped[str] = mapped_column(String(200), nullable=False)
    agent_id: Mapped[str | None] = mapped_column(String(200))
    run_id: Mapped[str | None] = mapped_column(String(200))
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    messages: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, nullable=False, server_default="{}")
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    # Hash of the request body, to tell a replay (same body) from a conflict (different body).
    body_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    writer: Mapped[str | None] = mapped_column(String(100))
    # Posted as a backfill (an import, a `priority: backfill` batch): its scope waits behind the
    # tenant's live ones (`app.domain.pipeline.scheduler`).
    backfill: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="queued")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    # The writer's raw output of the last failed attempt, kept for inspection.
    raw_output: Mapped[str | None] = mapped_column(Text)
    # Token usage of the writer calls of failed attempts (an applied chunk's is on its changeset).
    usage: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    changeset_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # Not to be taken before this time (backoff after a failed attempt).
    available_at: Mapped[datetime] = timestamp_column()
    received_at: Mapped[datetime] = timestamp_column()
    applied_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = timestamp_column()
    # The W3C `traceparent` of the request that posted it, when tracing is on (`app.lib.tracing`): the
    # worker continues that trace.
    trace_parent: Mapped[str | None] = mapped_column(String(128))
