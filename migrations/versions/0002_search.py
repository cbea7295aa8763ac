"""search: HNSW over current memories, full-text index, and the embedder record

The HNSW index is partial (`status = 'active'`), so superseded and deleted memories are not in the
graph; exact scoped search keeps using `ix_memories_scope`. `embedding_config` records which
embedder made the stored vectors, so changing it is caught and re-embedded instead of mixed in.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 07:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "embedding_config",
        sa.Column("id", sa.SmallInteger(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("target_name", sa.String(length=200), nullable=True),
        sa.Column("cursor", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_embedding_config_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_embedding_config")),
    )
    op.create_index(
        "ix_memories_embedding_hnsw",
        "memories",
        ["embedding"],
        unique=False,
        postgresql_using="hnsw",
        postgresql_with={"m": 32, "ef_construction": 128},
        postgresql_ops={"embedding": "vector_cosine_ops"},
        postgresql_where=sa.text("status = 'active'"),
    )
    op.create_index(
        "ix_memories_content_fts",
        "memories",
        [sa.text("to_tsvector('simple'::regconfig, content)")],
        unique=False,
        postgresql_using="gin",
        postgresql_where=sa.text("status = 'active'"),
    )


def downgrade() -> None:
    op.drop_index("ix_memories_content_fts", table_name="memories")
    op.drop_index("ix_memories_embedding_hnsw", table_name="memories")
    op.drop_table("embedding_config")
