"""Tenants: the unit of isolation. Every other row carries a `tenant_id`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, timestamp_column, uuid_pk


class Tenant(Base):
    """A customer or environment; API keys, chunks, memories and audit chains belong to one."""

    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = uuid_pk()
    name: Mapped[str] = mapped_column(String(200), unique=True, nullable=False)
    # Per-tenant options such as the default writer name; free-form so new options need no migration.
    settings: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    created_at: Mapped[datetime] = timestamp_column()
