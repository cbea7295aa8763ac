"""embedder_changed_at: when the stored vectors last moved to another embedder

`memstore reembed` sets it when it finishes. A version whose vector was written before it holds
another model's vector; an undo that brings such a version's text back embeds it again. NULL: the
vectors have never been re-embedded, so every stored vector is the recorded embedder's.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 15:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("embedding_config", sa.Column("changed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("embedding_config", "changed_at")
