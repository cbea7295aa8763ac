"""keys_hold_the_tenant: every key of a tenant's rows holds `tenant_id`, and no function reaches across
tenants in one statement where it need not

Citus enforces a primary key or unique index of a distributed table only if it contains the
distribution column, and a foreign key between two distributed tables only if both sides pair it.
The ten keys that did not (docs/operations.md, "Past one Postgres") now lead with the tenant:

- `pk_audit_events`, `pk_changesets`, `pk_chunks`, `pk_memories`, `pk_memory_versions`, `pk_reviews`:
  `(tenant_id, id)`; `pk_writer_views`: `(tenant_id, changeset_id)`;
- `uq_changesets_writer_chunk`: `(tenant_id, chunk_id) WHERE kind = 'writer'`;
  `uq_memory_versions_memory_version`: `(tenant_id, memory_id, version)`;
- writer_views' foreign key to its changeset: `(tenant_id, changeset_id) → changesets (tenant_id, id)`
  (`fk_writer_views_tenant_id_changesets`, replacing `fk_writer_views_changeset_id_changesets`,
  which had to go before `pk_changesets` could change).

Ids are random (uuid) or drawn from one identity, so every row already here is unique under the wider
key; each key is rebuilt in this transaction, its table locked meanwhile (seconds per million rows).

The functions that changed rows of several tenants in one statement, or read a tenant's rows in a
probe per tenant, now do neither:

- `memstore_index_graph(p_tenant, p_user, p_batch)` replaces `(p_batch, p_everything)`: it marks one
  tenant's tail (of one user, or of all its users with `p_user` ''), joined on `(tenant_id, id)`;
  `memstore_graph_tails(p_everything)` says which (tenant, user) pairs have a tail to add, and the
  indexer (`search.graph`) loops over them.
- `memstore_operator_status`, `memstore_failed_chunks`, `memstore_operator_gauges`: each count is a
  `GROUP BY tenant_id` over one table, joined to `tenants` after (same rows as 0013's lateral probes).
  `ix_reviews_pending` keeps the reviews' count reading pending reviews only, as the probes of
  `ix_reviews_queue`'s (tenant, status) prefix did.
- `memstore reembed` walks the memories tenant by tenant: `embedding_config.cursor_tenant_id` says
  whose memories the cursor is in. A run under way when the walk order changes (this migration, up or
  down) starts its walk over.

Downgrade restores the old keys, which holds while no id is used by two tenants.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 09:00:00
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLE = "memstore_service"

# Each table's primary key before the tenant was put in front of it.
PRIMARY_KEYS = {
    "audit_events": "id",
    "changesets": "id",
    "chunks": "id",
    "memories": "id",
    "memory_versions": "id",
    "reviews": "id",
    "writer_views": "changeset_id",
}
OLD_VIEW_FK = "fk_writer_views_changeset_id_changesets"
VIEW_FK = "fk_writer_views_tenant_id_changesets"

# Marks up to `p_batch` active memories of one tenant (of one of its users, or all of them with
# `p_user` '') not in the graph, which inserts each into it, through `ix_memories_graph_tail`. Rows a
# writer holds are skipped; the mark of a row written since it was read is not set (the UPDATE
# re-checks `NOT in_graph` on the row as it is then).
INDEX_GRAPH = """
CREATE FUNCTION memstore_index_graph(p_tenant uuid, p_user text, p_batch integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n integer;
BEGIN
    IF p_user = '' THEN
        UPDATE memories m SET in_graph = true
        FROM (
            SELECT id FROM memories
            WHERE tenant_id = p_tenant AND status = 'active' AND NOT in_graph
            LIMIT p_batch FOR UPDATE SKIP LOCKED
        ) todo
        WHERE m.tenant_id = p_tenant AND m.id = todo.id AND m.status = 'active' AND NOT m.in_graph;
    ELSE
        UPDATE memories m SET in_graph = true
        FROM (
            SELECT id FROM memories
            WHERE tenant_id = p_tenant AND user_id = p_user AND status = 'active' AND NOT in_graph
            LIMIT p_batch FOR UPDATE SKIP LOCKED
        ) todo
        WHERE m.tenant_id = p_tenant AND m.id = todo.id AND m.status = 'active' AND NOT m.in_graph;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
"""

# The (tenant, user) pairs whose graph tail the indexer should add: the wanted scopes that have one
# (a user's is left out where its tenant's all users are wanted), or, with `p_everything`, every tenant
# with a tail ('' for all its users). Each is a probe of `ix_memories_graph_tail`, or a read of it.
GRAPH_TAILS = """
CREATE FUNCTION memstore_graph_tails(p_everything boolean) RETURNS TABLE (tenant_id uuid, user_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT DISTINCT m.tenant_id, ''::text FROM memories m
    WHERE p_everything AND m.status = 'active' AND NOT m.in_graph
    UNION ALL
    SELECT g.tenant_id, g.user_id::text FROM graph_scopes g
    WHERE NOT p_everything
      AND (g.user_id = '' OR NOT EXISTS (
          SELECT FROM graph_scopes a WHERE a.tenant_id = g.tenant_id AND a.user_id = ''))
      AND EXISTS (
          SELECT FROM memories m
          WHERE m.tenant_id = g.tenant_id AND (g.user_id = '' OR m.user_id = g.user_id)
            AND m.status = 'active' AND NOT m.in_graph)
$$;
"""

# Each count a GROUP BY tenant_id over one table (through the partial indexes of unfinished chunks,
# failed chunks, pending reviews and unsealed audit events), materialised, then joined to `tenants`.
OPERATOR_STATUS = """
CREATE OR REPLACE FUNCTION memstore_operator_status()
RETURNS TABLE (
    tenant_id uuid, tenant text,
    queued bigint, processing bigint, oldest_unapplied_age_s double precision,
    failed bigint,
    reviews_waiting bigint, oldest_review_age_s double precision,
    audit_unsealed bigint, oldest_unsealed_age_s double precision, audit_head_seq bigint
)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH unapplied AS MATERIALIZED (
        SELECT c.tenant_id, count(*) FILTER (WHERE c.status = 'queued') AS queued,
               count(*) FILTER (WHERE c.status = 'processing') AS processing,
               greatest(extract(epoch FROM now() - min(c.received_at)), 0)::double precision AS age_s
        FROM chunks c WHERE c.status IN ('queued', 'processing')
        GROUP BY c.tenant_id
    ), failed AS MATERIALIZED (
        SELECT c.tenant_id, count(*) AS failed FROM chunks c WHERE c.status = 'failed'
        GROUP BY c.tenant_id
    ), waiting AS MATERIALIZED (
        SELECT v.tenant_id, count(*) AS waiting,
               greatest(extract(epoch FROM now() - min(v.created_at)), 0)::double precision AS age_s
        FROM reviews v WHERE v.status = 'pending'
        GROUP BY v.tenant_id
    ), unsealed AS MATERIALIZED (
        SELECT e.tenant_id, count(*) AS unsealed,
               greatest(extract(epoch FROM now() - min(e.created_at)), 0)::double precision AS age_s
        FROM audit_events e WHERE e.hash IS NULL
        GROUP BY e.tenant_id
    ), heads AS MATERIALIZED (
        SELECT h.tenant_id, h.seq FROM audit_heads h
    )
    SELECT t.id, t.name::text,
           coalesce(q.queued, 0), coalesce(q.processing, 0), coalesce(q.age_s, 0),
           coalesce(f.failed, 0),
           coalesce(r.waiting, 0), coalesce(r.age_s, 0),
           coalesce(a.unsealed, 0), coalesce(a.age_s, 0), coalesce(h.seq, 0)
    FROM tenants t
    LEFT JOIN unapplied q ON q.tenant_id = t.id
    LEFT JOIN failed f ON f.tenant_id = t.id
    LEFT JOIN waiting r ON r.tenant_id = t.id
    LEFT JOIN unsealed a ON a.tenant_id = t.id
    LEFT JOIN heads h ON h.tenant_id = t.id
    WHERE t.shadow_of IS NULL
    ORDER BY t.name
$$;
"""

# The kind of a chunk's fault, as 0013 reads it.
FAILED_CHUNKS = """
CREATE OR REPLACE FUNCTION memstore_failed_chunks()
RETURNS TABLE (tenant_id uuid, tenant text, error text, chunks bigint, newest_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH failed AS MATERIALIZED (
        SELECT c.tenant_id,
               left(CASE WHEN e.text LIKE 'writer error:%'
                         THEN 'writer error: ' || btrim(split_part(substr(e.text, 14), ':', 1))
                         ELSE btrim(split_part(e.text, ':', 1)) END, 80) AS error,
               count(*) AS chunks, max(c.updated_at) AS newest_at
        FROM chunks c CROSS JOIN LATERAL (SELECT coalesce(c.last_error, 'unknown') AS text) e
        WHERE c.status = 'failed'
        GROUP BY c.tenant_id, 2
    )
    SELECT t.id, t.name::text, f.error, f.chunks, f.newest_at
    FROM failed f JOIN tenants t ON t.id = f.tenant_id
    WHERE t.shadow_of IS NULL
    ORDER BY f.newest_at DESC
$$;
"""

OPERATOR_GAUGES = """
CREATE OR REPLACE FUNCTION memstore_operator_gauges()
RETURNS TABLE (
    reviews_waiting bigint, review_oldest_age_s double precision, audit_unsealed_age_s double precision
)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH waiting AS MATERIALIZED (
        SELECT v.tenant_id, count(*) AS waiting,
               greatest(extract(epoch FROM now() - min(v.created_at)), 0) AS age_s
        FROM reviews v WHERE v.status = 'pending'
        GROUP BY v.tenant_id
    )
    SELECT coalesce(sum(w.waiting), 0)::bigint, coalesce(max(w.age_s), 0)::double precision,
           (SELECT greatest(coalesce(extract(epoch FROM now() - min(e.created_at)), 0), 0)::double precision
            FROM audit_events e WHERE e.hash IS NULL)
    FROM waiting w JOIN tenants t ON t.id = w.tenant_id
    WHERE t.shadow_of IS NULL
$$;
"""


def _sibling(name: str) -> ModuleType:
    """An earlier migration of this directory, for the SQL it defined."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _grant(signature: str) -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {SERVICE_ROLE}")


def _primary_keys(*, tenant: bool) -> None:
    for table, column in PRIMARY_KEYS.items():
        columns = f"tenant_id, {column}" if tenant else column
        op.execute(
            f"ALTER TABLE {table} DROP CONSTRAINT pk_{table}, "
            f"ADD CONSTRAINT pk_{table} PRIMARY KEY ({columns})"
        )


def _unique_indexes(*, tenant: bool) -> None:
    lead = ["tenant_id"] if tenant else []
    op.drop_index("uq_changesets_writer_chunk", table_name="changesets")
    op.create_index(
        "uq_changesets_writer_chunk",
        "changesets",
        [*lead, "chunk_id"],
        unique=True,
        postgresql_where=sa.text("kind = 'writer'"),
    )
    op.drop_index("uq_memory_versions_memory_version", table_name="memory_versions")
    op.create_index(
        "uq_memory_versions_memory_version", "memory_versions", [*lead, "memory_id", "version"], unique=True
    )


def upgrade() -> None:
    # The reference to a changeset goes first: its key is the one it points at.
    op.drop_constraint(OLD_VIEW_FK, "writer_views", type_="foreignkey")
    _primary_keys(tenant=True)
    op.create_foreign_key(
        VIEW_FK,
        "writer_views",
        "changesets",
        ["tenant_id", "changeset_id"],
        ["tenant_id", "id"],
        ondelete="CASCADE",
    )
    _unique_indexes(tenant=True)
    op.create_index(
        "ix_reviews_pending",
        "reviews",
        ["tenant_id", "created_at"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )

    op.execute("DROP FUNCTION memstore_index_graph(integer, boolean)")
    op.execute(INDEX_GRAPH)
    _grant("memstore_index_graph(uuid, text, integer)")
    op.execute(GRAPH_TAILS)
    _grant("memstore_graph_tails(boolean)")
    for definition in (OPERATOR_STATUS, FAILED_CHUNKS, OPERATOR_GAUGES):
        op.execute(definition)

    op.add_column("embedding_config", sa.Column("cursor_tenant_id", sa.UUID(), nullable=True))
    op.execute("UPDATE embedding_config SET cursor = NULL")


def downgrade() -> None:
    op.execute("UPDATE embedding_config SET cursor = NULL")
    op.drop_column("embedding_config", "cursor_tenant_id")

    operator_views = _sibling("0013_operator_views")
    for name in ("OPERATOR_STATUS", "FAILED_CHUNKS", "OPERATOR_GAUGES"):
        op.execute(getattr(operator_views, name).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
    op.execute("DROP FUNCTION memstore_graph_tails(boolean)")
    op.execute("DROP FUNCTION memstore_index_graph(uuid, text, integer)")
    op.execute(_sibling("0012_graph_where_searched").INDEX_GRAPH)
    _grant("memstore_index_graph(integer, boolean)")

    op.drop_index("ix_reviews_pending", table_name="reviews", postgresql_where=sa.text("status = 'pending'"))
    _unique_indexes(tenant=False)
    op.drop_constraint(VIEW_FK, "writer_views", type_="foreignkey")
    _primary_keys(tenant=False)
    op.create_foreign_key(
        OLD_VIEW_FK, "writer_views", "changesets", ["changeset_id"], ["id"], ondelete="CASCADE"
    )
