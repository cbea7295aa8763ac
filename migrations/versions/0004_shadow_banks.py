"""shadow_banks: a writer on trial writes into a bank of its own, a hidden tenant of its tenant

`tenants.shadow_of` names the tenant whose chunks a shadow bank receives (live, as a shadow writer,
or once, as a replay); what the bank is (its writer, kind, since when) is in its `settings.shadow`.
A bank has no API keys, so no client can read it; deleting the tenant deletes its banks.
`chunks.usage` keeps the token usage of a chunk's failed attempts, which no changeset records.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 13:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tenants",
        sa.Column(
            "shadow_of",
            sa.UUID(),
            sa.ForeignKey("tenants.id", name="fk_tenants_shadow_of_tenants", ondelete="CASCADE"),
            nullable=True,
        ),
    )
    op.create_index(
        "ix_tenants_shadow_of", "tenants", ["shadow_of"], postgresql_where=sa.text("shadow_of IS NOT NULL")
    )
    op.add_column(
        "chunks",
        sa.Column("usage", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
    )


def downgrade() -> None:
    op.drop_column("chunks", "usage")
    op.drop_index("ix_tenants_shadow_of", table_name="tenants")
    op.drop_column("tenants", "shadow_of")
