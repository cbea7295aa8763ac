"""changesets_no_truncate: TRUNCATE cannot empty the changesets, as it cannot the versions or audit

Row triggers do not fire on TRUNCATE, so `changesets_status_only` alone left a way to erase every
changeset at once; the statement trigger of the other history tables now guards it too.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 22:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE TRIGGER changesets_no_truncate BEFORE TRUNCATE ON changesets "
        "FOR EACH STATEMENT EXECUTE FUNCTION memstore_forbid_history_change()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER changesets_no_truncate ON changesets")
