"""fair_shares: what the fair scheduler rebuilds from Postgres, and what its alerts read

- `chunks.backfill`: the chunk came with a backfill (a `priority: backfill` batch, an import), so its
  scope waits behind its tenant's live scopes. Adding it with a constant default rewrites no row.
- `memstore_stranded_scopes` also says whether a scope's waiting chunks are all backfill, so the
  sweeper puts a scope it wakes (after a Redis flush, say) back in its band.
- `memstore_tenant_backlog(p_limit, p_day)`: the tenants whose chunks have waited longest, at most
  `p_limit`, with their waiting chunks, the oldest's age, and for a tenant with a daily token budget,
  the budget and the writer tokens spent since `p_day` (counts only, as 0013's views): a bounded set
  of series for `/metrics`, read through the partial index of unfinished chunks.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLE = "memstore_service"

STRANDED = "memstore_stranded_scopes(double precision, integer)"
STRANDED_BODY = """
    SELECT c.tenant_id, c.user_id::text{band} FROM chunks c
    WHERE c.status IN ('queued', 'processing')
      AND c.updated_at < now() - make_interval(secs => p_min_age_s)
      AND c.available_at <= now()
    GROUP BY c.tenant_id, c.user_id
    LIMIT p_limit
"""


def _stranded(*, band: bool) -> str:
    columns = "tenant_id uuid, user_id text" + (", backfill boolean" if band else "")
    body = STRANDED_BODY.format(band=", bool_and(c.backfill)" if band else "")
    return (
        "CREATE FUNCTION memstore_stranded_scopes(p_min_age_s double precision, p_limit integer)\n"
        f"RETURNS TABLE ({columns})\n"
        "LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$"
        f"{body}$$;"
    )


# A writer changeset's tokens, and a chunk's failed attempts' (`chunks.usage`).
TOKENS = (
    "coalesce((usage ->> 'prompt_tokens')::bigint, 0) + coalesce((usage ->> 'completion_tokens')::bigint, 0)"
)
TENANT_BACKLOG = "memstore_tenant_backlog(integer, timestamp with time zone)"
TENANT_BACKLOG_BODY = f"""
CREATE FUNCTION memstore_tenant_backlog(p_limit integer, p_day timestamptz)
RETURNS TABLE (
    tenant_id uuid, tenant text, queued bigint, oldest_queued_age_s double precision,
    daily_token_budget bigint, tokens_today bigint
)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH waiting AS (
        SELECT c.tenant_id, count(*) AS queued,
               greatest(extract(epoch FROM now() - min(c.received_at)), 0)::double precision AS age
        FROM chunks c WHERE c.status IN ('queued', 'processing')
        GROUP BY c.tenant_id
        ORDER BY age DESC
        LIMIT p_limit
    )
    SELECT t.id, t.name::text, w.queued, w.age, b.budget,
           CASE WHEN b.budget IS NULL THEN NULL ELSE
               (SELECT coalesce(sum({TOKENS}), 0) FROM changesets s
                WHERE s.tenant_id = t.id AND s.kind = 'writer' AND s.created_at >= p_day)
             + (SELECT coalesce(sum({TOKENS}), 0) FROM chunks c
                WHERE c.tenant_id = t.id AND c.status IN ('queued', 'processing', 'failed')
                  AND c.updated_at >= p_day AND c.usage <> '{{}}'::jsonb)
           END::bigint
    FROM waiting w
    JOIN tenants t ON t.id = w.tenant_id AND t.shadow_of IS NULL
    CROSS JOIN LATERAL (SELECT (t.settings ->> 'daily_token_budget')::bigint AS budget) b
    ORDER BY w.age DESC
$$;
"""


def _grant(signature: str) -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {SERVICE_ROLE}")


def upgrade() -> None:
    op.add_column("chunks", sa.Column("backfill", sa.Boolean(), nullable=False, server_default="false"))
    op.execute(f"DROP FUNCTION {STRANDED}")
    op.execute(_stranded(band=True))
    _grant(STRANDED)
    op.execute(TENANT_BACKLOG_BODY)
    _grant(TENANT_BACKLOG)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {TENANT_BACKLOG}")
    op.execute(f"DROP FUNCTION {STRANDED}")
    op.execute(_stranded(band=False))
    _grant(STRANDED)
    op.drop_column("chunks", "backfill")
