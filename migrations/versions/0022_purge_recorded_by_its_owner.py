"""purge_recorded_by_its_owner: a purge's audit event is written by the tables' owner, as the purge is

A purge deletes through `memstore_purge_user`, a SECURITY DEFINER function: as the tables' owner. Its
audit event was then inserted by the service role in the same transaction. One Postgres does not mind;
a Citus cluster does: a transaction's statements on a tenant's shards (one group of co-located
placements) go over one connection per node, opened as one user, and it refuses a second user on
placements the first modified ("cannot perform query on placements that were modified in this
transaction by a different user"). The audit event lives on the tenant's shards as its rows do.

`memstore_record_purge(p_tenant, p_user, p_actor, p_request_id, p_deleted, p_created_at)` inserts that
event as the owner: the row `audit.services.record_event` would insert (action `user.purged`, target
the user, summary `{"deleted": …}`, unsealed), so the sealer links it into the tenant's chain as any
other. The purge and its event are still one transaction's: they commit together or not at all. The
function writes no other action, and only for a tenant the connection is set to (or any, for the
owner), as the purge erases: the service could insert that row itself, under its policy.

Downgrade drops the function (the service then writes the event itself again).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLE = "memstore_service"
SIGNATURE = "memstore_record_purge(uuid, text, text, text, jsonb, timestamp with time zone)"
RECORD_PURGE = """
CREATE FUNCTION memstore_record_purge(
    p_tenant uuid, p_user text, p_actor text, p_request_id text, p_deleted jsonb, p_created_at timestamptz
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    event_id bigint;
BEGIN
    -- As `memstore_purge_user`: the service records only for a tenant it is set to; the owner for any.
    IF p_tenant IS NULL OR NOT (
        p_tenant = ANY (memstore_visible_tenants())
        OR pg_has_role(session_user, (SELECT relowner FROM pg_class WHERE oid = 'memories'::regclass),
                       'MEMBER')
    ) THEN
        RAISE EXCEPTION 'memstore_record_purge: the connection is not set to tenant %', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO audit_events (tenant_id, actor, action, target_type, target_id, request_id, summary,
                              created_at)
    VALUES (p_tenant, p_actor, 'user.purged', 'user', p_user, p_request_id,
            jsonb_build_object('deleted', p_deleted), p_created_at)
    RETURNING id INTO event_id;
    RETURN event_id;
END
$$;
"""


def upgrade() -> None:
    op.execute(RECORD_PURGE)
    op.execute(f"REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {SERVICE_ROLE}")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
