"""Webhooks: a tenant's endpoints, the outbox of events they are told about, and one delivery per
(endpoint, event) with its attempts (`app.domain.webhooks`)."""

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
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, timestamp_column

DELIVERY_STATUSES = ("pending", "delivered", "failed")


class WebhookEndpoint(Base):
    """A URL of the tenant's that is sent the events it subscribes to, signed with its secret.

    `previous_secret` still signs (beside `secret`) until `previous_secret_expires_at`: a rotation
    overlaps, so a receiver can switch secrets without refusing a delivery."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (
        # Keys hold the tenant, so the table can be distributed by it (tests/integration/db/
        # test_distribution_ready.py).
        PrimaryKeyConstraint("tenant_id", "id"),
        Index("ix_webhook_endpoints_tenant", "tenant_id", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    description: Mapped[str | None] = mapped_column(String(200))
    # The event types it is sent; empty: every type.
    event_types: Mapped[list[str]] = mapped_column(
        ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")
    )
    # Whether memory contents (and held ops' contents) go in the bodies; otherwise ids only.
    include_content: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    secret: Mapped[str] = mapped_column(Text, nullable=False)
    previous_secret: Mapped[str | None] = mapped_column(Text)
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = timestamp_column()
    updated_at: Mapped[datetime] = timestamp_column()


class WebhookEvent(Base):
    """One event of the outbox, written in the transaction of the change it announces; `seq` orders a
    user's events. Written only while the tenant has an enabled endpoint that wants its type."""

    __tablename__ = "webhook_events"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        UniqueConstraint("tenant_id", "seq"),
        Index("ix_webhook_events_scope", "tenant_id", "user_id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), server_default=text("gen_random_uuid()"))
    seq: Mapped[int] = mapped_column(BigInteger, Identity(always=True), nullable=False)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    user_id: Mapped[str] = mapped_column(String(200), nullable=False)
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = timestamp_column()


class WebhookDelivery(Base):
    """An event on its way to one endpoint: pending (due at `next_attempt_at`), delivered, or failed
    (given up after the retry schedule); `log` holds every attempt."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        # A user's deliveries to an endpoint go in event order: the head is the lowest pending seq (the
        # index holds the pending ones alone, so finding it never reads the delivered history).
        Index(
            "ix_webhook_deliveries_order",
            "endpoint_id",
            "user_id",
            "event_seq",
            postgresql_where=text("status = 'pending'"),
        ),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
        ),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "created_at"),
        Index("ix_webhook_deliveries_scope", "tenant_id", "user_id"),
        CheckConstraint(f"status IN {DELIVERY_STATUSES!r}", name="status"),
        PrimaryKeyConstraint("tenant_id", "id"),
        # Co-located with what they point at: the tenant on both sides.
        ForeignKeyConstraint(
            ["tenant_id", "endpoint_id"],
            ["webhook_endpoints.tenant_id", "webhook_endpoints.id"],
            ondelete="CASCADE",
        ),
        ForeignKeyConstraint(
            ["tenant_id", "event_id"], ["webhook_events.tenant_id", "webhook_events.id"], ondelete="CASCADE"
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), server_default=text("gen_random_uuid()"))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    event_seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    user_id: Mapped[str] = mapped_column(String(200), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    next_attempt_at: Mapped[datetime] = timestamp_column()
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    response_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    # [{"at", "status", "error", "duration_ms"}], one per attempt.
    log: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, nullable=False, server_default=text("'[]'::jsonb")
    )
    created_at: Mapped[datetime] = timestamp_column()
