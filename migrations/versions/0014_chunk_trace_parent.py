"""chunk_trace_parent: the W3C `traceparent` of the request that posted a chunk

With tracing on (`app.lib.tracing`), the API stores the request's trace context with each chunk it
accepts, and the worker that takes the chunk up, however much later, continues that trace: one trace
per chunk across processes. NULL when tracing was off. No index: it is read with the chunk's row.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("chunks", sa.Column("trace_parent", sa.String(128), nullable=True))


def downgrade() -> None:
    op.drop_column("chunks", "trace_parent")
