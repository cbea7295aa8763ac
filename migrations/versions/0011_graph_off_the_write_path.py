"""graph_off_the_write_path: memories join the HNSW graph in batches, after they are written

Every memory written used to be inserted into the HNSW graph by the statement that wrote it: 5-8 ms of
Postgres per memory on the write path, and a restore of a bank paid it for every head it moved. Now the
graph holds only rows marked `in_graph`. Every write of a head (`memories.version_writer`) leaves the
mark false, so the new row version joins no graph: the statement that writes it pays for B-trees only.
The workers' indexer (`memstore_index_graph`, below) then marks batches of active memories, which
inserts them into the graph, off the write path and outside anyone's transaction.

Search loses nothing meanwhile: the graph's rows are searched through the graph, and the rows not yet
in it (the tail, found through the small partial index `ix_memories_graph_tail`) exactly, in the same
statement (`search.repositories`).

`memstore_index_graph` is a SECURITY DEFINER function of the tables' owner, like the other
cross-tenant functions of migration 0008: it marks rows of every tenant and returns only how many.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVICE_ROLE = "memstore_service"
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 128

# Marks up to `p_batch` active memories not in the graph, which inserts each into it. Rows a writer
# holds are skipped (they will be written again, unmarked); the mark of a row written since it was
# read is not set (the UPDATE re-checks `NOT in_graph` on the row as it is then).
INDEX_GRAPH = """
CREATE FUNCTION memstore_index_graph(p_batch integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n integer;
BEGIN
    UPDATE memories m SET in_graph = true
    FROM (
        SELECT id FROM memories WHERE status = 'active' AND NOT in_graph
        LIMIT p_batch FOR UPDATE SKIP LOCKED
    ) todo
    WHERE m.id = todo.id AND m.status = 'active' AND NOT m.in_graph;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
"""


def _create_graph(where: str) -> None:
    """The HNSW graph over the memories matching `where` (its parameters are migration 0002's)."""
    op.create_index(
        "ix_memories_embedding_hnsw",
        "memories",
        ["embedding"],
        unique=False,
        postgresql_using="hnsw",
        postgresql_with={"m": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION},
        postgresql_ops={"embedding": "vector_cosine_ops"},
        postgresql_where=sa.text(where),
    )


def upgrade() -> None:
    op.add_column(
        "memories", sa.Column("in_graph", sa.Boolean(), server_default=sa.text("false"), nullable=False)
    )
    op.drop_index("ix_memories_embedding_hnsw", table_name="memories")
    # The rows there are now are marked before the graph is built, so it is built once, in bulk.
    op.execute("UPDATE memories SET in_graph = true WHERE status = 'active'")
    _create_graph("status = 'active' AND in_graph")
    op.create_index(
        "ix_memories_graph_tail",
        "memories",
        ["tenant_id", "user_id"],
        unique=False,
        postgresql_where=sa.text("status = 'active' AND NOT in_graph"),
    )
    op.execute(INDEX_GRAPH)
    op.execute("REVOKE ALL ON FUNCTION memstore_index_graph(integer) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION memstore_index_graph(integer) TO {SERVICE_ROLE}")


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS memstore_index_graph(integer)")
    op.drop_index("ix_memories_graph_tail", table_name="memories")
    op.drop_index("ix_memories_embedding_hnsw", table_name="memories")
    _create_graph("status = 'active'")
    op.drop_column("memories", "in_graph")
