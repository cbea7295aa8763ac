"""writer_views: what a writer was shown for each changeset it wrote; an index of failed chunks

One row per writer changeset: the candidate memories under their local ids (memory and version) and
how many earlier messages of the scope the writer was given, so `GET /v1/memories/{id}/explain` can
show a decision next to what it was made from. Rows go with their changeset (ON DELETE CASCADE: a
purge). Like every tenant table, its rows are visible to the service role only for the tenants it is
set to (the policy of migration 0008). `ix_chunks_failed` serves the admin's list of failed chunks.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "writer_views",
        sa.Column("changeset_id", sa.UUID(), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column(
            "candidates",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default="[]",
            nullable=False,
        ),
        sa.Column("context_messages", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["changeset_id"],
            ["changesets.id"],
            name=op.f("fk_writer_views_changeset_id_changesets"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_writer_views_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("changeset_id", name=op.f("pk_writer_views")),
    )
    op.execute("ALTER TABLE writer_views ENABLE ROW LEVEL SECURITY")
    visible = "tenant_id = ANY ((SELECT memstore_visible_tenants())::uuid[])"
    op.execute(f"CREATE POLICY tenant_isolation ON writer_views USING ({visible}) WITH CHECK ({visible})")
    op.create_index(
        "ix_chunks_failed",
        "chunks",
        ["tenant_id", "received_at"],
        unique=False,
        postgresql_where=sa.text("status = 'failed'"),
    )


def downgrade() -> None:
    op.drop_index("ix_chunks_failed", table_name="chunks", postgresql_where=sa.text("status = 'failed'"))
    op.drop_table("writer_views")
