"""reviews: a writer's destructive ops held for a human under the `review` policy

`reviews` keeps each held op with the versions of the memories it was shown; a trigger lets a row be
decided once (pending -> approved | rejected) and be deleted only by a purge. Changesets gain the
kind `review`: the one an approval writes, with the writer's provenance and the approver as actor.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 18:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS = "('writer', 'rollback', 'revert', 'restore', 'manual')"
KINDS_WITH_REVIEW = "('writer', 'rollback', 'revert', 'restore', 'manual', 'review')"

REVIEW_FUNCTION = """
CREATE FUNCTION memstore_review_decided_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF current_setting('memstore.purge', true) = 'on' THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'reviews are append-only: DELETE is not allowed'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF OLD.status <> 'pending' OR NEW.status = 'pending' THEN
        RAISE EXCEPTION 'reviews: a review is decided once, from pending'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF (to_jsonb(NEW) - ARRAY['status', 'decided_by', 'decided_at', 'decision_reason', 'decision_changeset_id'])
       IS DISTINCT FROM
       (to_jsonb(OLD) - ARRAY['status', 'decided_by', 'decided_at', 'decision_reason', 'decision_changeset_id']) THEN
        RAISE EXCEPTION 'reviews: only the decision may change'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;
"""


def upgrade() -> None:
    op.create_table(
        "reviews",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("user_id", sa.String(length=200), nullable=False),
        sa.Column("agent_id", sa.String(length=200), nullable=True),
        sa.Column("run_id", sa.String(length=200), nullable=True),
        sa.Column("changeset_id", sa.UUID(), nullable=False),
        sa.Column("chunk_id", sa.UUID(), nullable=True),
        sa.Column("op_index", sa.Integer(), nullable=False),
        sa.Column("op", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("targets", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("memory_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("writer", sa.String(length=100), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("profile", sa.String(length=50), nullable=True),
        sa.Column("prompt_hash", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("decided_by", sa.String(length=200), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decision_reason", sa.Text(), nullable=True),
        sa.Column("decision_changeset_id", sa.UUID(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('pending', 'approved', 'rejected')", name=op.f("ck_reviews_status")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_reviews_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reviews")),
    )
    op.create_index("ix_reviews_queue", "reviews", ["tenant_id", "status", "created_at", "id"])
    op.create_index("ix_reviews_scope", "reviews", ["tenant_id", "user_id", "created_at"])
    op.execute(REVIEW_FUNCTION)
    op.execute(
        "CREATE TRIGGER reviews_decided_once BEFORE UPDATE OR DELETE ON reviews "
        "FOR EACH ROW EXECUTE FUNCTION memstore_review_decided_once()"
    )
    op.execute(
        "CREATE TRIGGER reviews_no_truncate BEFORE TRUNCATE ON reviews "
        "FOR EACH STATEMENT EXECUTE FUNCTION memstore_forbid_history_change()"
    )
    op.drop_constraint(op.f("ck_changesets_kind"), "changesets", type_="check")
    op.create_check_constraint(op.f("ck_changesets_kind"), "changesets", f"kind IN {KINDS_WITH_REVIEW}")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_changesets_kind"), "changesets", type_="check")
    # Approved reviews' changesets stay (their versions point at them); the old check holds for new rows.
    op.execute(f"ALTER TABLE changesets ADD CONSTRAINT ck_changesets_kind CHECK (kind IN {KINDS}) NOT VALID")
    op.execute("DROP TRIGGER IF EXISTS reviews_no_truncate ON reviews")
    op.execute("DROP TRIGGER IF EXISTS reviews_decided_once ON reviews")
    op.execute("DROP FUNCTION IF EXISTS memstore_review_decided_once()")
    op.drop_index("ix_reviews_scope", table_name="reviews")
    op.drop_index("ix_reviews_queue", table_name="reviews")
    op.drop_table("reviews")
