"""Scopes: one row per (tenant, user_id), holding the per-scope sequence counter of chunks."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, timestamp_column


class Scope(Base):
    """A user's memory bank within a tenant; chunks are numbered by `last_seq` in acceptance order."""

    __tablename__ = "scopes"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    created_at: Mapped[datetime] = timestamp_column()
