"""lexemes: each memory's English lexemes, stored, for BM25 ranking of the lexical half of search

`memories.lexemes` is `to_tsvector('english', content)`, a stored generated column: the lexical ranking
(BM25) reads term frequencies and document lengths of every memory it scores, and computing them from
the text on each search costs ~25 µs per memory. English stemming lets "hiking" find "hikes"; names and
numbers stay searchable. The GIN index over it replaces the 'simple' expression index of 0002.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "memories",
        sa.Column(
            "lexemes",
            postgresql.TSVECTOR(),
            sa.Computed("to_tsvector('english'::regconfig, content)", persisted=True),
            nullable=True,
        ),
    )
    op.drop_index("ix_memories_content_fts", table_name="memories")
    op.create_index(
        "ix_memories_lexemes",
        "memories",
        ["lexemes"],
        unique=False,
        postgresql_using="gin",
        postgresql_where=sa.text("status = 'active'"),
    )


def downgrade() -> None:
    op.drop_index("ix_memories_lexemes", table_name="memories")
    op.create_index(
        "ix_memories_content_fts",
        "memories",
        [sa.text("to_tsvector('simple'::regconfig, content)")],
        unique=False,
        postgresql_using="gin",
        postgresql_where=sa.text("status = 'active'"),
    )
    op.drop_column("memories", "lexemes")
