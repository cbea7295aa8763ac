"""memory_expiry: memories that expire: expires_at on memories and their versions

A memory whose `expires_at` has passed is hidden from list, search, answer and the writer's candidates
(unless a read asks for expired ones), never deleted: the head keeps its status, and the time is part
of each version's state, so undo brings back an earlier one like any other field. NULL: never expires.

No index: every read that hides expired memories already narrows to a scope's active rows (the scope
B-tree, the HNSW graph, the lexemes' GIN index) and checks the time on the rows it reads.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("memories", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("memory_versions", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("memory_versions", "expires_at")
    op.drop_column("memories", "expires_at")
