"""Graph scopes: where the vector graph is wanted, so the workers' indexer adds those memories alone."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, timestamp_column

# The `user_id` of a row that wants the graph for every user of its tenant (a user id is never empty).
EVERY_USER = ""


class GraphScope(Base):
    """A scope, or a whole tenant (`user_id` = `EVERY_USER`), whose searches go through the graph: a
    search over all users, or of a scope above `search_hnsw_min_scope`, asked for it (migration 0012)."""

    __tablename__ = "graph_scopes"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    wanted_at: Mapped[datetime] = timestamp_column()
