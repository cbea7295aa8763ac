"""graph_where_searched: the vector graph holds the memories whose searches go through it, no others

Only a search over all users of a tenant, or of a scope above `search_hnsw_min_scope` active
memories, goes through the cross-scope HNSW graph; every other search is exact on the scope's B-tree.
Yet every memory cost the indexer a graph insert (m 32: a few milliseconds of Postgres CPU, the
largest share of a chunk's cost). Now such a search records what it wants in `graph_scopes` (a tenant,
`user_id` '' for all its users, or one scope) and the indexer adds those memories alone. Until they
are in, they are the graph's tail, which search reads exactly (migration 0011): a first search of an
unindexed tenant is slower, never different.

`memstore_index_graph(p_batch, p_everything)` replaces 0011's: it marks the tail of the wanted scopes,
or, with `p_everything` (the setting `MEMSTORE_GRAPH_INDEX_ALL`), every active memory as before. The
tenants with memories in the graph now are recorded as wanting it, so an upgrade keeps what it has.
A purge (`memstore_purge_user`) erases a user's row here too.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 20:00:00
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLE = "memstore_service"
VISIBLE = "tenant_id = ANY ((SELECT memstore_visible_tenants())::uuid[])"

# Marks up to `p_batch` active memories not in the graph, which inserts each into it: of the wanted
# scopes (one scope through `ix_memories_graph_tail`'s (tenant, user); a whole tenant through its
# tenant prefix), or of every tenant with `p_everything`. Rows a writer holds are skipped; the mark of a
# row written since it was read is not set (the UPDATE re-checks `NOT in_graph` on the row as it is).
INDEX_GRAPH = """
CREATE FUNCTION memstore_index_graph(p_batch integer, p_everything boolean) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n integer;
BEGIN
    IF p_everything THEN
        UPDATE memories m SET in_graph = true
        FROM (
            SELECT id FROM memories WHERE status = 'active' AND NOT in_graph
            LIMIT p_batch FOR UPDATE SKIP LOCKED
        ) todo
        WHERE m.id = todo.id AND m.status = 'active' AND NOT m.in_graph;
    ELSE
        UPDATE memories m SET in_graph = true
        FROM (
            SELECT t.id FROM graph_scopes g CROSS JOIN LATERAL (
                SELECT id FROM memories
                WHERE tenant_id = g.tenant_id AND user_id = g.user_id AND status = 'active' AND NOT in_graph
                LIMIT p_batch FOR UPDATE SKIP LOCKED
            ) t
            WHERE g.user_id <> ''
            UNION ALL
            SELECT t.id FROM graph_scopes g CROSS JOIN LATERAL (
                SELECT id FROM memories
                WHERE tenant_id = g.tenant_id AND status = 'active' AND NOT in_graph
                LIMIT p_batch FOR UPDATE SKIP LOCKED
            ) t
            WHERE g.user_id = ''
            LIMIT p_batch
        ) todo
        WHERE m.id = todo.id AND m.status = 'active' AND NOT m.in_graph;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
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


def _purge_user(*, graph_scopes: bool) -> str:
    """Migration 0008's purge, replaced: with `graph_scopes`, it also erases the user's row there (not
    counted: the counts a purge reports are those of the user's content)."""
    sql: str = _sibling("0008_row_level_security").PURGE_USER
    sql = sql.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    if graph_scopes:
        switch_off = "    PERFORM set_config('memstore.purge', 'off', true);"
        assert switch_off in sql
        erase = "    DELETE FROM graph_scopes WHERE tenant_id = p_tenant AND user_id = p_user;\n"
        sql = sql.replace(switch_off, erase + switch_off)
    return sql


def _grant(signature: str) -> None:
    op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO {SERVICE_ROLE}")


def upgrade() -> None:
    op.create_table(
        "graph_scopes",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("user_id", sa.String(length=200), nullable=False),
        sa.Column("wanted_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_graph_scopes_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "user_id", name=op.f("pk_graph_scopes")),
    )
    op.execute("ALTER TABLE graph_scopes ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON graph_scopes USING ({VISIBLE}) WITH CHECK ({VISIBLE})")
    op.execute(
        "INSERT INTO graph_scopes (tenant_id, user_id) "
        "SELECT DISTINCT tenant_id, '' FROM memories WHERE in_graph"
    )
    op.execute("DROP FUNCTION memstore_index_graph(integer)")
    op.execute(INDEX_GRAPH)
    _grant("memstore_index_graph(integer, boolean)")
    op.execute(_purge_user(graph_scopes=True))


def downgrade() -> None:
    op.execute(_purge_user(graph_scopes=False))
    op.execute("DROP FUNCTION memstore_index_graph(integer, boolean)")
    op.execute(_sibling("0011_graph_off_the_write_path").INDEX_GRAPH)
    _grant("memstore_index_graph(integer)")
    op.drop_table("graph_scopes")
