"""The schema can be distributed by tenant: every key holds `tenant_id`, or is a reference table's.

Past one Postgres the path is Citus distributed by `tenant_id` (or a managed Postgres, which needs
nothing here). Citus enforces a primary key, a unique constraint or index, or an exclusion constraint
of a distributed table only if it contains the distribution column, and a foreign key between two
distributed tables only if both sides pair it (the tables are then co-located, the row and its
referent on one node). So every such key of the migrated schema must contain `tenant_id`, or its
table is a *reference table* (small, replicated to every node). A new table or key that fits neither
fails here. (The last ten keys that did not were fixed by migration 0020.)

Functions that change rows of several tenants in one statement cannot be judged from the catalog;
every SECURITY DEFINER function (the only way the service reaches past its tenants) is listed with
what it does across tenants, so a new one is looked at before it ships.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.engine import make_url

import app.db.models  # noqa: F401  (registers every table)
from app.db.base import metadata

DISTRIBUTION_COLUMN = "tenant_id"

# Tables replicated to every node rather than distributed, and why each may be.
REFERENCE_TABLES = {
    "tenants": "the tenants themselves: one row each, read by every statement's policy",
    "api_keys": (
        "found by key hash before the tenant is known (memstore_key_tenant); a few rows per tenant, "
        "written only when a key is made, rotated or revoked"
    ),
    "embedding_config": "one row for the whole store (CHECK id = 1): the embedder of the vectors",
    "alembic_version": "Alembic's bookkeeping, one row; stays on the coordinator",
}


# Every SECURITY DEFINER function, by what it does across tenants (docs/operations.md, "Scaling").
CROSS_TENANT_FUNCTIONS = {
    "memstore_index_graph": "UPDATEs the graph tail of one tenant (or of one of its users) per call",
    "memstore_graph_tails": "reads graph_scopes and the graph tail of memories of every tenant (the indexer)",
    "memstore_purge_user": "deletes one user of one tenant: one tenant per call",
    "memstore_record_purge": "inserts the audit event of a purge of one tenant's user: one tenant per call",
    "memstore_key_tenant": "reads api_keys by key hash (a reference table)",
    "memstore_visible_tenants": "reads tenants (a reference table)",
    "memstore_stranded_scopes": "reads chunks of every tenant (the sweeper)",
    "memstore_unsealed_audit_tenants": "reads audit_events of every tenant (the sealer)",
    "memstore_backlog": "reads chunks of every tenant (/metrics)",
    "memstore_tenant_backlog": (
        "reads chunks of every tenant, then the day's changesets and chunks of the few waiting longest, "
        "grouped by tenant"
    ),
    "memstore_shadow_backlog": "reads chunks of every shadow bank (/metrics)",
    "memstore_operator_status": "reads chunks, reviews, audit_events of every tenant, grouped by tenant",
    "memstore_failed_chunks": "reads failed chunks of every tenant, grouped by tenant and error",
    "memstore_writer_stats": "reads changesets joined to chunks on (tenant_id, id), every tenant",
    "memstore_operator_gauges": "reads reviews and audit_events of every tenant",
    "memstore_webhook_due_tenants": "reads pending webhook_deliveries of every tenant (the delivery job)",
    "memstore_delete_webhook": "deletes one endpoint of the tenants the connection is set to",
}

# Keys (constraints, and unique indexes that back none) of the public schema's tables, with their
# columns in order; expressions in an index's key show as NULL.
KEYS = """
WITH tables AS (
    SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
)
SELECT t.relname AS table_name, con.conname AS name, con.contype::text AS kind,
       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY k(num, pos)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num ORDER BY k.pos) AS columns,
       ref.relname AS ref_table,
       ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY k(num, pos)
             JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.num ORDER BY k.pos)
           AS ref_columns,
       pg_get_constraintdef(con.oid) AS definition
FROM pg_constraint con JOIN tables t ON t.oid = con.conrelid
LEFT JOIN pg_class ref ON ref.oid = con.confrelid
WHERE con.contype IN ('p', 'u', 'f', 'x')
UNION ALL
SELECT t.relname, ix.relname, 'i',
       ARRAY(SELECT a.attname::text FROM unnest(i.indkey[0:i.indnkeyatts - 1]) WITH ORDINALITY k(num, pos)
             LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.num ORDER BY k.pos),
       NULL, '{}', pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN tables t ON t.oid = i.indrelid JOIN pg_class ix ON ix.oid = i.indexrelid
WHERE i.indisunique
  AND NOT EXISTS (
      SELECT FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.contype IN ('p', 'u', 'x'))
ORDER BY 1, 2
"""

TABLES = """
SELECT c.relname AS table_name,
       EXISTS (SELECT FROM pg_attribute a
               WHERE a.attrelid = c.oid AND a.attname = $1 AND a.attnum > 0 AND NOT a.attisdropped)
           AS has_tenant
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
ORDER BY 1
"""


async def distribution_findings(conn: asyncpg.Connection) -> dict[str, str]:
    """What keeps the public schema from being distributed by `tenant_id`: the offending constraint or
    index (or table) by name, with why. Reference tables are passed over."""
    findings: dict[str, str] = {}
    for row in await conn.fetch(TABLES, DISTRIBUTION_COLUMN):
        if row["table_name"] not in REFERENCE_TABLES and not row["has_tenant"]:
            findings[row["table_name"]] = f"table {row['table_name']} has no {DISTRIBUTION_COLUMN} column"
    for key in await conn.fetch(KEYS):
        table, name, columns = key["table_name"], key["name"], key["columns"]
        where = f"{table}.{name}: {key['definition']}"
        if key["kind"] != "f":
            if table not in REFERENCE_TABLES and DISTRIBUTION_COLUMN not in columns:
                findings[name] = f"{where} — a key of a distributed table without {DISTRIBUTION_COLUMN}"
            continue
        ref_table = key["ref_table"]
        if ref_table in REFERENCE_TABLES:
            continue  # a reference table is on every node: any table may refer to it
        if table in REFERENCE_TABLES:
            findings[name] = f"{where} — a reference table refers to a distributed one"
        elif DISTRIBUTION_COLUMN not in columns or (
            key["ref_columns"][columns.index(DISTRIBUTION_COLUMN)] != DISTRIBUTION_COLUMN
        ):
            findings[name] = f"{where} — not co-located: {DISTRIBUTION_COLUMN} is not paired on both sides"
    return findings


@pytest.fixture
async def owner(owner_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the test's migrated database as the tables' owner."""
    url = make_url(owner_database_url)
    conn = await asyncpg.connect(
        user=url.username, host=url.query.get("host") or url.host, port=url.port, database=url.database
    )
    yield conn
    await conn.close()


async def test_every_key_holds_the_tenant(owner: asyncpg.Connection) -> None:
    """... unless its table is a reference table."""
    findings = await distribution_findings(owner)
    assert not findings, "keys that would keep the schema from being distributed by tenant:\n" + "\n".join(
        findings.values()
    )


async def test_the_models_primary_keys_are_the_schemas(owner: asyncpg.Connection) -> None:
    """`alembic check` does not compare primary keys: the models' (the ORM's identity of a row, what
    `session.get` takes) must be the migrated schema's, column for column."""
    rows = await owner.fetch(
        "SELECT t.relname AS table_name, "
        "       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY k(num, pos) "
        "             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num "
        "             ORDER BY k.pos) AS columns "
        "FROM pg_constraint con JOIN pg_class t ON t.oid = con.conrelid "
        "JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE n.nspname = 'public' AND con.contype = 'p' AND t.relname <> 'alembic_version'"
    )
    schema = {row["table_name"]: list(row["columns"]) for row in rows}
    models = {name: [c.name for c in table.primary_key.columns] for name, table in metadata.tables.items()}
    assert models == schema


async def test_the_reference_tables_exist(owner: asyncpg.Connection) -> None:
    tables = {row["table_name"] for row in await owner.fetch(TABLES, DISTRIBUTION_COLUMN)}
    assert set(REFERENCE_TABLES) <= tables


async def test_every_security_definer_function_is_listed(owner: asyncpg.Connection) -> None:
    rows = await owner.fetch(
        "SELECT DISTINCT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'public' AND p.prosecdef"
    )
    assert {row["proname"] for row in rows} == set(CROSS_TENANT_FUNCTIONS)


# SQL functions with parameters that Citus can run, and why: it cannot plan a statement of a SQL function
# with parameters that reads a distributed table (PL/pgSQL's statements it plans with their values).
SQL_FUNCTIONS_WITH_PARAMETERS = {
    "memstore_purging": "reads pg_class: no table of the schema",
    "memstore_key_tenant": "reads api_keys, a reference table",
}


async def test_no_sql_function_with_parameters_reads_a_distributed_table(owner: asyncpg.Connection) -> None:
    rows = await owner.fetch(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " JOIN pg_language l ON l.oid = p.prolang"
        " WHERE n.nspname = 'public' AND l.lanname = 'sql' AND p.pronargs > 0"
    )
    assert {row["proname"] for row in rows} == set(SQL_FUNCTIONS_WITH_PARAMETERS)


async def test_the_purge_switch_is_set_as_a_cluster_passes_it_on(owner: asyncpg.Connection) -> None:
    """`set_config(…, true)` changes the setting on the node that runs the function only; `SET LOCAL`
    reaches the shards, where the append-only triggers read it."""
    rows = await owner.fetch(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'public' AND p.prosrc LIKE $1",
        "%set_config('memstore.purge'%",
    )
    assert [row["proname"] for row in rows] == []
    purge = await owner.fetchval("SELECT prosrc FROM pg_proc WHERE proname = 'memstore_purge_user'")
    assert "SET LOCAL memstore.purge = 'on'" in purge


async def test_a_new_table_keyed_without_the_tenant_is_flagged(owner: asyncpg.Connection) -> None:
    transaction = owner.transaction()
    await transaction.start()
    try:
        await owner.execute(
            """
            CREATE TABLE tags (name text PRIMARY KEY);
            CREATE TABLE notes (
                id uuid PRIMARY KEY,
                tenant_id uuid NOT NULL REFERENCES tenants (id),
                user_id varchar(200) NOT NULL,
                memory_id uuid NOT NULL,
                tag text NOT NULL REFERENCES tags (name),
                body text NOT NULL,
                CONSTRAINT uq_notes_body UNIQUE (body),
                CONSTRAINT fk_notes_scope FOREIGN KEY (tenant_id, user_id)
                    REFERENCES scopes (tenant_id, user_id)
            );
            CREATE UNIQUE INDEX uq_notes_memory ON notes (memory_id);
            CREATE UNIQUE INDEX uq_notes_tenant_memory ON notes (tenant_id, memory_id);
            """
        )
        findings = await distribution_findings(owner)
    finally:
        await transaction.rollback()

    # Flagged: the key on id alone, the unique text, the unique index without the tenant, the reference
    # to a tag by its name alone, and a table with no tenant at all. Passed: the reference to a tenant
    # (a reference table), the co-located reference to the scope, the index led by the tenant.
    assert set(findings) == {
        "notes_pkey",
        "uq_notes_body",
        "uq_notes_memory",
        "notes_tag_fkey",
        "tags",
        "tags_pkey",
    }
    assert "not co-located" in findings["notes_tag_fkey"]
    assert await owner.fetchval("SELECT to_regclass('notes')") is None
