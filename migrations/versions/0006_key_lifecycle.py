"""key_lifecycle: when each API key was last used, and which key a rotation replaced

`api_keys.last_used_at` is written when a process resolves the key afresh (its cache expired), at
most once a minute per key; `api_keys.rotated_from` names the key a rotation was made for, which
stays valid beside it until it is revoked.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 21:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "api_keys",
        sa.Column(
            "rotated_from",
            sa.Uuid(),
            sa.ForeignKey("api_keys.id", name=op.f("fk_api_keys_rotated_from_api_keys"), ondelete="SET NULL"),
            nullable=True,
        ),
    )


def downgrade() -> None:
    op.drop_column("api_keys", "rotated_from")
    op.drop_column("api_keys", "last_used_at")
