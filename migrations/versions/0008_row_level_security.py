"""row_level_security: the service role sees only its tenants' rows, and cannot rewrite history

A second wall behind the tenant predicate every query carries. Every table holding a tenant's rows gets
a row-level security policy: a role that does not own the tables sees, and may write, only rows of the
tenants named in the setting `memstore.tenant_ids` (comma-separated, set by the service for the work
in progress; `app/db/tenancy.py`) and of those tenants' shadow banks. Without the setting it sees no
tenant's rows at all. The owner (who runs these migrations and the operator's commands) is not subject
to the policies.

The service role `memstore_service` (made here if it does not exist) gets SELECT, INSERT and UPDATE,
never DELETE or TRUNCATE, and no UPDATE of `memory_versions`. Not owning the tables, it cannot disable
their triggers. The purge switch `memstore.purge` is honoured only for the tables' owner (any role may
set a custom setting; only the owner, or a superuser, is a member of the owner role): a GDPR purge goes
through `memstore_purge_user`, a SECURITY DEFINER function owned by the owner that erases only a tenant
the connection is set to.

Four other SECURITY DEFINER functions give the service what it must read across tenants, and no more:
the tenant of a key hash (authentication, before the tenant is known), the scopes whose chunks wait
unnoticed (the sweeper), the tenants with unsealed audit events (the sealer), and the backlog figures of
`/metrics`.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLE = "memstore_service"
# Tables whose rows belong to a tenant, and the column that says which.
TENANT_TABLES = {
    "api_keys": "tenant_id",
    "audit_events": "tenant_id",
    "audit_heads": "tenant_id",
    "changesets": "tenant_id",
    "chunks": "tenant_id",
    "memories": "tenant_id",
    "memory_versions": "tenant_id",
    "reviews": "tenant_id",
    "scopes": "tenant_id",
}
ALL_TABLES = (*TENANT_TABLES, "tenants", "embedding_config")

CREATE_ROLE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{SERVICE_ROLE}') THEN
        CREATE ROLE {SERVICE_ROLE} LOGIN;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION 'role {SERVICE_ROLE} does not exist and this role may not create it'
        USING HINT = 'create it first (CREATE ROLE {SERVICE_ROLE} LOGIN PASSWORD ...), or grant it to '
                     'the login role the API and the workers use; see docs/security.md';
END
$$;
"""

# The tenants the connection is set to, with their shadow banks. Called once per reference to a tenant
# table in a statement (an InitPlan: the policies wrap it in a scalar subquery), as the owner, so reading
# `tenants` does not recurse into that table's own policy. PL/pgSQL, so its query is planned once per
# connection, not at every call as a SQL function's body would be.
VISIBLE_TENANTS = """
CREATE FUNCTION memstore_visible_tenants() RETURNS uuid[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    own uuid[] := coalesce(
        string_to_array(nullif(current_setting('memstore.tenant_ids', true), ''), ',')::uuid[], '{}'::uuid[]);
BEGIN
    IF cardinality(own) = 0 THEN
        RETURN own;
    END IF;
    RETURN own || coalesce((SELECT array_agg(t.id) FROM tenants t WHERE t.shadow_of = ANY (own)), '{}'::uuid[]);
END
$$;
"""
VISIBLE = "(SELECT memstore_visible_tenants())::uuid[]"

# The purge switch, honoured only for the owner of the table being changed (or a superuser).
PURGING = """
CREATE FUNCTION memstore_purging(tab oid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce(current_setting('memstore.purge', true), '') = 'on'
       AND pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = tab), 'MEMBER')
$$;
"""

# The append-only triggers of migrations 0001 and 0005, with the switch asked of `memstore_purging`.
TRIGGER_FUNCTIONS = {
    "memstore_forbid_history_change": """
BEGIN
    IF TG_OP = 'DELETE' AND {purging} THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END
""",
    "memstore_changeset_status_only": """
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF {purging} THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'changesets are append-only: DELETE is not allowed'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF (to_jsonb(NEW) - 'status') IS DISTINCT FROM (to_jsonb(OLD) - 'status') THEN
        RAISE EXCEPTION 'changesets: only status may change'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NOT (OLD.status = 'applied' AND NEW.status = 'reverted') AND NEW.status IS DISTINCT FROM OLD.status THEN
        RAISE EXCEPTION 'changesets: status may only go from applied to reverted'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
""",
    "memstore_audit_seal_only": """
BEGIN
    IF TG_OP = 'UPDATE'
       AND OLD.hash IS NULL AND OLD.seq IS NULL AND OLD.prev_hash IS NULL
       AND NEW.hash IS NOT NULL AND NEW.seq IS NOT NULL AND NEW.prev_hash IS NOT NULL
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' AND {purging} THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_events is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'restrict_violation';
END
""",
    "memstore_review_decided_once": """
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF {purging} THEN
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
""",
}
NEW_PURGING = "memstore_purging(TG_RELID)"
OLD_PURGING = "current_setting('memstore.purge', true) = 'on'"

# GDPR erasure of one user of a tenant the connection is set to, or of any tenant by the owner (see `HistoryRepository.purge_user`
# for why the scope row is locked first), with the rows deleted per kind.
PURGE_USER = """
CREATE FUNCTION memstore_purge_user(p_tenant uuid, p_user text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    counts jsonb := '{}'::jsonb;
    kind text;
    n bigint;
BEGIN
    -- The service erases only a tenant it is set to; the owner (who logged in as it) any tenant.
    IF p_tenant IS NULL OR NOT (
        p_tenant = ANY (memstore_visible_tenants())
        OR pg_has_role(session_user, (SELECT relowner FROM pg_class WHERE oid = 'memories'::regclass), 'MEMBER')
    ) THEN
        RAISE EXCEPTION 'memstore_purge_user: the connection is not set to tenant %', p_tenant
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM 1 FROM scopes WHERE tenant_id = p_tenant AND user_id = p_user FOR UPDATE;
    PERFORM set_config('memstore.purge', 'on', true);
    FOREACH kind IN ARRAY ARRAY['reviews', 'versions', 'memories', 'changesets', 'chunks', 'scopes'] LOOP
        EXECUTE format('DELETE FROM %I WHERE tenant_id = $1 AND user_id = $2',
                       CASE kind WHEN 'versions' THEN 'memory_versions' ELSE kind END)
            USING p_tenant, p_user;
        GET DIAGNOSTICS n = ROW_COUNT;
        counts := counts || jsonb_build_object(kind, n);
    END LOOP;
    PERFORM set_config('memstore.purge', 'off', true);
    RETURN counts;
END
$$;
"""

# Authentication: the tenant of a key, found by its hash before the tenant is known.
KEY_TENANT = """
CREATE FUNCTION memstore_key_tenant(p_key_hash text) RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT tenant_id FROM api_keys WHERE key_hash = p_key_hash
$$;
"""

# The sweeper: scopes with unfinished chunks untouched for `p_min_age_s` whose backoff has passed.
STRANDED_SCOPES = """
CREATE FUNCTION memstore_stranded_scopes(p_min_age_s double precision, p_limit integer)
RETURNS TABLE (tenant_id uuid, user_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT c.tenant_id, c.user_id::text FROM chunks c
    WHERE c.status IN ('queued', 'processing')
      AND c.updated_at < now() - make_interval(secs => p_min_age_s)
      AND c.available_at <= now()
    GROUP BY c.tenant_id, c.user_id
    LIMIT p_limit
$$;
"""

# The sealer: tenants with audit events not yet in their chain.
UNSEALED_TENANTS = """
CREATE FUNCTION memstore_unsealed_audit_tenants(p_limit integer) RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT e.tenant_id FROM audit_events e WHERE e.hash IS NULL GROUP BY e.tenant_id LIMIT p_limit
$$;
"""

# `/metrics`: the tenants' backlog (shadow banks' chunks are their own), and each bank's.
BACKLOG = """
CREATE FUNCTION memstore_backlog()
RETURNS TABLE (queued bigint, processing bigint, oldest_age_s double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT count(*) FILTER (WHERE status = 'queued'),
           count(*) FILTER (WHERE status = 'processing'),
           coalesce(extract(epoch FROM now() - min(received_at)), 0)::double precision
    FROM chunks
    WHERE status IN ('queued', 'processing')
      AND tenant_id NOT IN (SELECT id FROM tenants WHERE shadow_of IS NOT NULL)
$$;
"""
SHADOW_BACKLOG = """
CREATE FUNCTION memstore_shadow_backlog()
RETURNS TABLE (bank text, writer text, pending bigint, oldest_age_s double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT t.settings -> 'shadow' ->> 'name', t.settings -> 'shadow' ->> 'writer', count(*),
           coalesce(extract(epoch FROM now() - min(c.received_at)), 0)::double precision
    FROM chunks c JOIN tenants t ON t.id = c.tenant_id
    WHERE c.status IN ('queued', 'processing') AND t.shadow_of IS NOT NULL
    GROUP BY 1, 2
$$;
"""

SERVICE_FUNCTIONS = {
    "memstore_purge_user(uuid, text)": PURGE_USER,
    "memstore_key_tenant(text)": KEY_TENANT,
    "memstore_stranded_scopes(double precision, integer)": STRANDED_SCOPES,
    "memstore_unsealed_audit_tenants(integer)": UNSEALED_TENANTS,
    "memstore_backlog()": BACKLOG,
    "memstore_shadow_backlog()": SHADOW_BACKLOG,
}


def _trigger_functions(purging: str) -> None:
    for name, body in TRIGGER_FUNCTIONS.items():
        op.execute(
            f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$"
            f"{body.format(purging=purging)}$$;"
        )


def upgrade() -> None:
    op.execute(CREATE_ROLE)
    op.execute(VISIBLE_TENANTS)
    op.execute(PURGING)
    _trigger_functions(NEW_PURGING)

    for signature, definition in SERVICE_FUNCTIONS.items():
        op.execute(definition)
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {SERVICE_ROLE}")

    op.execute(f"GRANT USAGE ON SCHEMA public TO {SERVICE_ROLE}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {', '.join(ALL_TABLES)} TO {SERVICE_ROLE}")
    op.execute(f"REVOKE UPDATE ON memory_versions FROM {SERVICE_ROLE}")
    op.execute(f"GRANT SELECT ON alembic_version TO {SERVICE_ROLE}")
    op.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {SERVICE_ROLE}")
    # Tables and sequences later migrations create are the service's to use too; each new tenant table
    # still needs its policy (tests/integration/db/test_row_level_security.py checks that it has one).
    op.execute(
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE ON TABLES TO {SERVICE_ROLE}"
    )
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {SERVICE_ROLE}")

    for table, column in TENANT_TABLES.items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} "
            f"USING ({column} = ANY ({VISIBLE})) WITH CHECK ({column} = ANY ({VISIBLE}))"
        )
    # A bank is created by its tenant (`shadow_of`); a new tenant by the owner, or a connection set to it.
    op.execute("ALTER TABLE tenants ENABLE ROW LEVEL SECURITY")
    # (An INSERT ... ON CONFLICT checks the new row against the read policy too: the same condition.)
    tenant_row = f"id = ANY ({VISIBLE}) OR shadow_of = ANY ({VISIBLE})"
    op.execute(f"CREATE POLICY tenant_isolation ON tenants USING ({tenant_row}) WITH CHECK ({tenant_row})")


def downgrade() -> None:
    for table in (*TENANT_TABLES, "tenants"):
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute(
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON SEQUENCES FROM {SERVICE_ROLE}"
    )
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON TABLES FROM {SERVICE_ROLE}")
    op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {SERVICE_ROLE}")
    op.execute(f"REVOKE ALL ON {', '.join(ALL_TABLES)}, alembic_version FROM {SERVICE_ROLE}")
    op.execute(f"REVOKE USAGE ON SCHEMA public FROM {SERVICE_ROLE}")
    for signature in SERVICE_FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    _trigger_functions(OLD_PURGING)
    op.execute("DROP FUNCTION IF EXISTS memstore_purging(oid)")
    op.execute("DROP FUNCTION IF EXISTS memstore_visible_tenants()")
    # The role stays: roles belong to the cluster, and another database may use it.
