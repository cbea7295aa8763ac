"""valid_time: when each memory's fact held, beside when it was written

`valid_from` / `valid_to` on memories and on every version: the time the fact began and stopped being
true in the user's world (either may be unknown: NULL), as the writer read it from the conversation; a
SUPERSEDE closes the replaced fact's `valid_to`. Transaction time stays what the versions' `created_at`
records, so a bank is bi-temporal: `as_of` asks what was believed then, `valid_at` what held then.

No index: a read by valid time narrows to a scope first (the scope B-tree) and checks the times on the
rows it reads, as expiry does.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("memories", "memory_versions"):
        op.add_column(table, sa.Column("valid_from", sa.DateTime(timezone=True), nullable=True))
        op.add_column(table, sa.Column("valid_to", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for table in ("memory_versions", "memories"):
        op.drop_column(table, "valid_to")
        op.drop_column(table, "valid_from")
