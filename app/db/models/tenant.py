"""Tenants: the unit of isolation. Every other row carries a `tenant_id`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, String, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, timestamp_column, uuid_pk


class Tenant(Base):
    """A customer or environment; API keys, chunks, memories and audit chains belong to one."""

    __tablename__ = "tenants"
    __table_args__ = (
        Index("ix_tenants_shadow_of", "shadow_of", postgresql_where=text("shadow_of IS NOT NULL")),
    )

    id: Mapped[uuid.UUID] = uuid_pk()
    name: Mapped[str] = mapped_column(String(200), unique=True, nullable=False)
    # Per-tenant options such as the default writer name; free-form so new options need no migration.
    settings: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    # Set on a shadow bank: the tenant whose chunks it receives. A bank is a tenant of its own, so every
    # read that is scoped to a tenant (all of them) keeps it apart from the bank it shadows; it has no
    # API keys. What it is (writer, kind, since) is in `settings["shadow"]`.
    shadow_of: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("tenants.id", ondelete="CASCADE")
    )
    created_at: Mapped[datetime] = timestamp_column()
