"""webhooks: webhook endpoints, their outbox of events and its deliveries

Three tenant tables (`app/db/models/webhook.py`), each under the tenant policy of migration 0008:

- `webhook_endpoints`: a tenant's URLs, the event types each wants, its `whsec_` secret (and the one
  it replaced, still signing until the rotation's overlap ends). The service still deletes nothing
  itself: an admin removes an endpoint (and, by cascade, its deliveries) through
  `memstore_delete_webhook(p_endpoint)`, a SECURITY DEFINER function that removes only an endpoint
  of a tenant the connection is set to.
- `webhook_events`: the outbox, written in the transaction of the change it announces; `seq` orders
  a user's events.
- `webhook_deliveries`: one row per (endpoint, event), pending until delivered or given up, with the
  log of its attempts.

`memstore_webhook_due_tenants(p_limit)` (SECURITY DEFINER, like the sealer's) names the tenants with
deliveries due, through the partial index of pending ones, so the delivery job can take each tenant
in turn. A purge (`memstore_purge_user`, as 0012 left it) also erases the user's events and
deliveries, pending or not: they may quote the user's memories.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 11:00:00
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLE = "memstore_service"
VISIBLE = "tenant_id = ANY ((SELECT memstore_visible_tenants())::uuid[])"
TABLES = ("webhook_endpoints", "webhook_events", "webhook_deliveries")

DUE_TENANTS = """
CREATE FUNCTION memstore_webhook_due_tenants(p_limit integer) RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT d.tenant_id FROM webhook_deliveries d
    WHERE d.status = 'pending' AND d.next_attempt_at <= now()
    GROUP BY d.tenant_id LIMIT p_limit
$$;
"""

# The service deletes nothing itself (migration 0008): an admin's removal of an endpoint goes through
# this function of the owner's, for an endpoint of a tenant the connection is set to; its deliveries go
# with it (ON DELETE CASCADE).
DELETE_ENDPOINT = """
CREATE FUNCTION memstore_delete_webhook(p_endpoint uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    DELETE FROM webhook_endpoints
    WHERE id = p_endpoint AND tenant_id = ANY (memstore_visible_tenants());
    RETURN FOUND;
END
$$;
"""
FUNCTIONS = {
    "memstore_webhook_due_tenants(integer)": DUE_TENANTS,
    "memstore_delete_webhook(uuid)": DELETE_ENDPOINT,
}


def _sibling(name: str) -> ModuleType:
    """An earlier migration of this directory, for the SQL it defined."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _purge_user(*, webhooks: bool) -> str:
    """0012's purge; with `webhooks`, it also erases the user's events and deliveries (not counted: the
    counts a purge reports are those of the user's content)."""
    sql: str = _sibling("0012_graph_where_searched")._purge_user(graph_scopes=True)
    if webhooks:
        switch_off = "    PERFORM set_config('memstore.purge', 'off', true);"
        assert switch_off in sql
        erase = (
            "    DELETE FROM webhook_deliveries WHERE tenant_id = p_tenant AND user_id = p_user;\n"
            "    DELETE FROM webhook_events WHERE tenant_id = p_tenant AND user_id = p_user;\n"
        )
        sql = sql.replace(switch_off, erase + switch_off)
    return sql


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=True),
        sa.Column(
            "event_types", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'::text[]"), nullable=False
        ),
        sa.Column("include_content", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("previous_secret", sa.Text(), nullable=True),
        sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_webhook_endpoints_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_webhook_endpoints")),
    )
    op.create_index("ix_webhook_endpoints_tenant", "webhook_endpoints", ["tenant_id", "created_at"])
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("user_id", sa.String(length=200), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_webhook_events_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_webhook_events")),
        sa.UniqueConstraint("tenant_id", "seq", name=op.f("uq_webhook_events_tenant_id_seq")),
    )
    op.create_index("ix_webhook_events_scope", "webhook_events", ["tenant_id", "user_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.UUID(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("endpoint_id", sa.UUID(), nullable=False),
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("user_id", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "next_attempt_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "log",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')", name=op.f("ck_webhook_deliveries_status")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_webhook_deliveries_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "endpoint_id"],
            ["webhook_endpoints.tenant_id", "webhook_endpoints.id"],
            name=op.f("fk_webhook_deliveries_tenant_id_webhook_endpoints"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "event_id"],
            ["webhook_events.tenant_id", "webhook_events.id"],
            name=op.f("fk_webhook_deliveries_tenant_id_webhook_events"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(
        "ix_webhook_deliveries_order",
        "webhook_deliveries",
        ["endpoint_id", "user_id", "event_seq"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index("ix_webhook_deliveries_endpoint", "webhook_deliveries", ["endpoint_id", "created_at"])
    op.create_index("ix_webhook_deliveries_scope", "webhook_deliveries", ["tenant_id", "user_id"])

    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({VISIBLE}) WITH CHECK ({VISIBLE})")
        op.execute(f"GRANT SELECT, INSERT, UPDATE ON {table} TO {SERVICE_ROLE}")
    op.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {SERVICE_ROLE}")

    for signature, definition in FUNCTIONS.items():
        op.execute(definition)
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {SERVICE_ROLE}")
    op.execute(_purge_user(webhooks=True))


def downgrade() -> None:
    op.execute(_purge_user(webhooks=False))
    for signature in FUNCTIONS:
        op.execute(f"DROP FUNCTION {signature}")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_events")
    op.drop_table("webhook_endpoints")
