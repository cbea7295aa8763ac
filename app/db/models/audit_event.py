"""Audit events: append-only and hash-chained per tenant, so a changed row breaks the chain."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Identity, Index, String, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, tenant_key


class AuditEvent(Base):
    """Who did what to which target.

    Events are written without a lock (so audited writes never queue behind each other) and sealed
    into the tenant's hash chain shortly after by the sealer: it fills `seq`, `prev_hash` and `hash`
    exactly once, in commit-visible `id` order. Nothing else about an event can ever change.
    """

    __tablename__ = "audit_events"
    __table_args__ = (
        tenant_key(),
        Index("uq_audit_events_tenant_seq", "tenant_id", "seq", unique=True),
        Index("ix_audit_events_tenant_time", "tenant_id", "created_at"),
        Index("ix_audit_events_unsealed", "tenant_id", "id", postgresql_where=text("hash IS NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    # Position in the tenant's chain: 1, 2, 3 ... without gaps (NULL until sealed).
    seq: Mapped[int | None] = mapped_column(BigInteger)
    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    action: Mapped[str] = mapped_column(String(100), nullable=False)
    target_type: Mapped[str | None] = mapped_column(String(50))
    target_id: Mapped[str | None] = mapped_column(String(200))
    request_id: Mapped[str | None] = mapped_column(String(100))
    summary: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    # Set by the application (not the DB clock) because it is part of the hashed payload.
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    prev_hash: Mapped[str | None] = mapped_column(String(64))
    hash: Mapped[str | None] = mapped_column(String(64))


class AuditHead(Base):
    """The end of each tenant's sealed chain; its row lock serialises sealers of one tenant."""

    __tablename__ = "audit_heads"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    hash: Mapped[str] = mapped_column(String(64), nullable=False)
