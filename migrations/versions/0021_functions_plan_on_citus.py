"""functions_plan_on_citus: the functions a Citus cluster could not run, rewritten so it can

Two kinds, both found on a cluster (Citus 13.2, Postgres 16), both unchanged in what they return on
one Postgres:

- SQL functions with parameters that read distributed tables: Citus cannot plan the statement of such
  a function ("could not create distributed plan ... parameters in SQL functions") and names PL/pgSQL
  instead, whose statements it plans with the parameters' values. Each of `FUNCTIONS` becomes PL/pgSQL
  returning its statement as it was (`RETURN QUERY`); `#variable_conflict use_column` keeps the
  statement's column names meaning columns where they share a name with an output column.
- `memstore_tenant_backlog` (0019) also summed each budgeted tenant's tokens of the day in two
  subqueries correlated on the tenant, which Citus cannot run from a reference table's row ("complex
  joins are only supported when all distributed tables are co-located"): the sums are now a `GROUP BY
  tenant_id` over each table for the waiting tenants with a budget, joined to them after.
- `memstore_purge_user` turned the purge switch on with `set_config('memstore.purge', 'on', true)`,
  which changes the setting on the node that runs the function only: the append-only triggers on the
  shards never saw it and refused the purge's DELETEs. It now says `SET LOCAL memstore.purge`, which a
  cluster passes on to the shards its transaction reaches (`citus.propagate_set_commands = 'local'`, set
  by `memstore db distribute`) — when called inside a transaction block, as the service calls it.

The statements are the ones migration 0020 left (read back from the catalog, so they cannot drift from
it): the change is their wrapping alone. Downgrade unwraps them.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 12:00:00
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op
from sqlalchemy import text

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The SQL functions with parameters that read distributed tables, wrapped as they are.
FUNCTIONS = (
    "memstore_graph_tails(boolean)",
    "memstore_stranded_scopes(double precision, integer)",
    "memstore_unsealed_audit_tenants(integer)",
    "memstore_webhook_due_tenants(integer)",
    "memstore_writer_stats(double precision, text)",
)
TENANT_BACKLOG = "memstore_tenant_backlog(integer, timestamp with time zone)"
TOKENS = (
    "coalesce((usage ->> 'prompt_tokens')::bigint, 0) + coalesce((usage ->> 'completion_tokens')::bigint, 0)"
)
TENANT_BACKLOG_BODY = f"""
CREATE OR REPLACE FUNCTION memstore_tenant_backlog(p_limit integer, p_day timestamptz)
RETURNS TABLE (
    tenant_id uuid, tenant text, queued bigint, oldest_queued_age_s double precision,
    daily_token_budget bigint, tokens_today bigint
)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH waiting AS MATERIALIZED (
        SELECT c.tenant_id, count(*) AS queued,
               greatest(extract(epoch FROM now() - min(c.received_at)), 0)::double precision AS age
        FROM chunks c WHERE c.status IN ('queued', 'processing')
        GROUP BY c.tenant_id
        ORDER BY age DESC
        LIMIT p_limit
    ),
    budgeted AS MATERIALIZED (
        SELECT w.tenant_id, w.queued, w.age, t.name::text AS name,
               (t.settings ->> 'daily_token_budget')::bigint AS budget
        FROM waiting w JOIN tenants t ON t.id = w.tenant_id AND t.shadow_of IS NULL
    ),
    written AS MATERIALIZED (
        SELECT s.tenant_id, sum({TOKENS}) AS tokens FROM changesets s
        WHERE s.tenant_id IN (SELECT b.tenant_id FROM budgeted b WHERE b.budget IS NOT NULL)
          AND s.kind = 'writer' AND s.created_at >= p_day
        GROUP BY s.tenant_id
    ),
    unwritten AS MATERIALIZED (
        SELECT c.tenant_id, sum({TOKENS}) AS tokens FROM chunks c
        WHERE c.tenant_id IN (SELECT b.tenant_id FROM budgeted b WHERE b.budget IS NOT NULL)
          AND c.status IN ('queued', 'processing', 'failed')
          AND c.updated_at >= p_day AND c.usage <> '{{}}'::jsonb
        GROUP BY c.tenant_id
    )
    SELECT b.tenant_id, b.name, b.queued, b.age, b.budget,
           CASE WHEN b.budget IS NULL THEN NULL
                ELSE coalesce(wr.tokens, 0) + coalesce(un.tokens, 0) END::bigint
    FROM budgeted b
    LEFT JOIN written wr ON wr.tenant_id = b.tenant_id
    LEFT JOIN unwritten un ON un.tenant_id = b.tenant_id
    ORDER BY b.age DESC;
END
$$;
"""
PURGE_USER = "memstore_purge_user(uuid, text)"
_OPEN = "\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY\n"
_CLOSE = ";\nEND\n"
_SWITCH = {
    "PERFORM set_config('memstore.purge', 'on', true);": "SET LOCAL memstore.purge = 'on';",
    "PERFORM set_config('memstore.purge', 'off', true);": "SET LOCAL memstore.purge = 'off';",
}


def _definition(signature: str) -> str:
    """The function's `CREATE OR REPLACE FUNCTION` statement as the catalog holds it."""
    found = op.get_bind().scalar(
        text("SELECT pg_get_functiondef(CAST(:f AS regprocedure))"), {"f": signature}
    )
    assert found is not None, signature
    return str(found)


def _body(definition: str) -> tuple[str, str, str]:
    """(what comes before the body, the body, what comes after), split at its `$function$` quotes."""
    head, body, tail = definition.split("$function$")
    return head, body, tail


def _as_plpgsql(signature: str) -> str:
    head, body, tail = _body(_definition(signature))
    assert " LANGUAGE sql\n" in head, signature
    statement = body.strip().rstrip(";")
    head = head.replace(" LANGUAGE sql\n", " LANGUAGE plpgsql\n")
    return f"{head}$function${_OPEN}{statement}{_CLOSE}$function${tail}"


def _as_sql(signature: str) -> str:
    head, body, tail = _body(_definition(signature))
    assert body.startswith(_OPEN) and body.endswith(_CLOSE), signature
    statement = body.removeprefix(_OPEN).removesuffix(_CLOSE)
    head = head.replace(" LANGUAGE plpgsql\n", " LANGUAGE sql\n")
    return f"{head}$function$\n{statement}\n$function${tail}"


def _purge(*, local: bool) -> str:
    definition = _definition(PURGE_USER)
    for old, new in _SWITCH.items():
        before, after = (old, new) if local else (new, old)
        assert before in definition, before
        definition = definition.replace(before, after)
    return definition


def upgrade() -> None:
    for signature in FUNCTIONS:
        op.execute(_as_plpgsql(signature))
    op.execute(TENANT_BACKLOG_BODY)
    op.execute(_purge(local=True))


def downgrade() -> None:
    op.execute(_purge(local=False))
    # 0019's statement; CREATE OR REPLACE keeps the function's grants.
    backlog = _sibling("0019_fair_shares").TENANT_BACKLOG_BODY
    op.execute(backlog.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    for signature in FUNCTIONS:
        op.execute(_as_sql(signature))


def _sibling(name: str) -> ModuleType:
    """An earlier migration of this directory, for the SQL it defined."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
