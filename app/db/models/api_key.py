"""API keys: stored as a SHA-256 of the secret, never the secret itself."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, String, Text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, timestamp_column, uuid_pk


class ApiKey(Base):
    """One bearer key of a tenant with its roles (`ingest`, `read`, `write`, `admin`)."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = uuid_pk()
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False, index=True
    )
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    # The first characters of the key, shown in listings so an operator can tell keys apart.
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    key_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    roles: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    created_at: Mapped[datetime] = timestamp_column()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Written when a process resolves the key afresh, at most once a minute: "used within a minute".
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The key this one was made to replace (`POST /v1/admin/keys/{id}/rotate`); both stay valid until
    # the old one is revoked.
    rotated_from: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
