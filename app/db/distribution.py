"""Past one Postgres: the schema distributed by `tenant_id` on a Citus cluster (`memstore db distribute`).

Every key of a tenant's rows holds `tenant_id` (migration 0020), so each table holding them is a
distributed table on that column, all co-located: a tenant's rows of every table live on one shard
group, and a statement naming one tenant runs on one node. The tables read before the tenant is known
or shared by all (`tenants`, `api_keys`, `embedding_config`) are reference tables, copied to every
node; `alembic_version` stays on the coordinator.

Two settings of the database go with it, for the sessions opened after:
- `citus.propagate_set_commands = 'local'`: a transaction's `SET LOCAL` (the tenants, `app.db.tenancy`)
  is passed on to the shards, where the row-level security policies read it.
- `citus.enable_unsafe_triggers = on`: the append-only triggers stay on the distributed tables (Citus
  refuses tables with triggers otherwise); each reads only its own row, so it is safe on a shard.
And one of the service role, on every node: `citus.allow_nested_distributed_execution = on`. The
policies run `memstore_visible_tenants()` on the shards, and it reads `tenants` (the shadow banks): on
a worker that is a query of a reference table from within a shard's query, which Citus refuses
otherwise. Every node holds a copy of a reference table, so the read is local and sees what the
coordinator sees. And `citus.override_table_visibility = off` for it: the service reads the catalog
(asyncpg's type introspection on every new connection) where there is no shard to hide, and hiding
them cost a second a type (`ROLE_SETTINGS`).

The row-level security policies (migration 0008) read the visible tenants through a scalar subquery,
`(SELECT memstore_visible_tenants())`, so Postgres runs the function once per statement (an InitPlan).
Citus refuses subqueries in the policies of distributed and reference tables, so each table's policy
calls the function directly before the table is distributed: the same rows, the function evaluated
where Postgres chooses (once per index scan as a runtime key, per row in a filter).

Each step is skipped when done, so a second run changes nothing. The tables are distributed in one
transaction, parents first (foreign keys): Citus moves each table's rows to its shards as it goes. A
bank restored into the coordinator (a move from one Postgres: docs/operations.md, "Moving a bank onto a
cluster") is moved with it, and the coordinator's own copy of its rows emptied in the same transaction.
`dry_run` says what would be done, rows included, and changes nothing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from app.db.tenancy import SERVICE_ROLE

REFERENCE_TABLES = ("tenants", "api_keys", "embedding_config")
DISTRIBUTION_COLUMN = "tenant_id"
# The table every other distributed table is co-located with.
COLOCATE_WITH = "chunks"
DATABASE_SETTINGS = {
    "citus.propagate_set_commands": "local",
    "citus.enable_unsafe_triggers": "on",
}


class DistributionError(RuntimeError):
    """The database cannot be distributed as it is; the message says why and what to do."""


@dataclass(frozen=True)
class Distribution:
    """How the database is laid out: one Postgres, or Citus with its workers and tables."""

    citus: str | None  # the Citus extension's version, None without it
    workers: int = 0
    distributed: tuple[str, ...] = ()
    reference: tuple[str, ...] = ()
    local: tuple[str, ...] = field(default=())  # tenant tables still on the coordinator alone

    @property
    def summary(self) -> str:
        if self.citus is None:
            return "single Postgres"
        if not self.distributed and not self.reference:
            return f"Citus {self.citus}, {self.workers} workers, not distributed (memstore db distribute)"
        line = (
            f"Citus {self.citus}, {self.workers} workers: {len(self.distributed)} tables distributed by "
            f"{DISTRIBUTION_COLUMN}, {len(self.reference)} reference"
        )
        if self.local:
            line += f", {len(self.local)} not yet distributed ({', '.join(self.local)})"
        return line

    def as_json(self) -> dict[str, object]:
        return {
            "kind": "single" if self.citus is None else "citus",
            "citus": self.citus,
            "workers": self.workers,
            "distributed": list(self.distributed),
            "reference": list(self.reference),
            "local": list(self.local),
        }


_CITUS = text("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
_WORKERS = text("SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND groupid <> 0 AND isactive")
_CITUS_TABLES = text(
    "SELECT logicalrelid::regclass::text AS name,"
    " CASE WHEN partmethod = 'h' THEN 'distributed'"
    "      WHEN repmodel = 't' THEN 'reference' ELSE 'local' END AS kind"
    " FROM pg_dist_partition"
)
# The schema's tables holding a tenant's rows, each with the tables its foreign keys point to.
_TENANT_TABLES = text(
    "SELECT c.relname AS name,"
    " coalesce(array_agg(DISTINCT p.relname) FILTER (WHERE p.relname IS NOT NULL AND p.oid <> c.oid),"
    "          '{}') AS parents"
    " FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()"
    " LEFT JOIN pg_constraint k ON k.conrelid = c.oid AND k.contype = 'f'"
    " LEFT JOIN pg_class p ON p.oid = k.confrelid"
    " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
    "   AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = :column"
    "               AND NOT a.attisdropped)"
    " GROUP BY c.relname ORDER BY c.relname"
)
_SUBQUERY_POLICIES = text(
    "SELECT tablename FROM pg_policies WHERE schemaname = current_schema() AND policyname = :policy"
    " AND (qual LIKE '%SELECT memstore_visible_tenants()%'"
    "      OR with_check LIKE '%SELECT memstore_visible_tenants()%')"
)
POLICY = "tenant_isolation"
_VISIBLE = "memstore_visible_tenants()"
_POLICY_CHECKS = {"tenants": f"id = ANY ({_VISIBLE}) OR shadow_of = ANY ({_VISIBLE})"}
# The foreign keys of `tables` to `to`, with their definitions.
_KEYS_TO = text(
    "SELECT k.conrelid::regclass::text AS table, k.conname AS name,"
    " pg_get_constraintdef(k.oid) AS definition"
    " FROM pg_constraint k"
    " WHERE k.contype = 'f' AND k.conrelid::regclass::text = ANY (:tables)"
    "   AND k.confrelid::regclass::text = ANY (:to)"
    " ORDER BY 1, 2"
)
# The service role's, on every node (Citus passes ALTER ROLE … SET on): the nested reads of its policies
# (the module's docstring), and the catalog read as it is: with `override_table_visibility` on, Citus
# checks every row of pg_class a query reads for a shard to hide, and asyncpg's type introspection,
# which every new connection runs for each type it meets first (vector, …), took 0.4-1.2 s a type on the
# coordinator, 3 ms without; the coordinator holds no shard to hide.
ROLE_SETTINGS = {
    "citus.allow_nested_distributed_execution": "on",
    "citus.override_table_visibility": "off",
}
_ROLE_SETTING = text(
    "SELECT split_part(s, '=', 2) FROM pg_db_role_setting r, unnest(r.setconfig) AS s"
    " WHERE r.setdatabase = 0 AND r.setrole = (SELECT oid FROM pg_roles WHERE rolname = :role)"
    "   AND split_part(s, '=', 1) = :name"
)
_DATABASE_SETTING = text(
    "SELECT split_part(s, '=', 2) FROM pg_db_role_setting r, unnest(r.setconfig) AS s"
    " WHERE r.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())"
    "   AND r.setrole = 0 AND split_part(s, '=', 1) = :name"
)


async def describe(conn: AsyncConnection) -> Distribution:
    """The database's layout, read from the catalog (any role may read it)."""
    version = await conn.scalar(_CITUS)
    if version is None:
        return Distribution(citus=None)
    workers = int(await conn.scalar(_WORKERS) or 0)
    kinds = {r.name: r.kind for r in await conn.execute(_CITUS_TABLES)}
    tenant_tables = [r.name for r in await conn.execute(_TENANT_TABLES, {"column": DISTRIBUTION_COLUMN})]
    wanted = [t for t in tenant_tables if t not in REFERENCE_TABLES]
    return Distribution(
        citus=str(version),
        workers=workers,
        distributed=tuple(sorted(t for t, k in kinds.items() if k == "distributed")),
        reference=tuple(sorted(t for t, k in kinds.items() if k == "reference")),
        local=tuple(t for t in wanted if kinds.get(t) != "distributed"),
    )


# A worker's group is its own; the coordinator's is 0.
_IS_COORDINATOR = text("SELECT groupid = 0 FROM pg_dist_local_group")


async def _count(conn: AsyncConnection, table: str) -> int:
    """The rows of one of the schema's tables (a name from the catalog, not user input)."""
    return int(await conn.scalar(text(f"SELECT count(*) FROM {table}")) or 0)  # noqa: S608


_HAS_DISTRIBUTED = text("SELECT EXISTS (SELECT FROM pg_dist_partition WHERE partmethod = 'h')")


async def is_distributed(engine: AsyncEngine) -> bool:
    """Whether `engine`'s database is a Citus coordinator with distributed tables: its autocommit
    statements on them reach the shards without the tenants (`app.db.tenancy`)."""
    async with engine.connect() as conn:
        if await conn.scalar(_CITUS) is None:
            return False
        return bool(await conn.scalar(_HAS_DISTRIBUTED))


# What `session_is_distributed` found, per engine (the engines of a process are few and long-lived).
_DISTRIBUTED: weakref.WeakKeyDictionary[Engine, bool] = weakref.WeakKeyDictionary()


async def session_is_distributed(session: AsyncSession) -> bool:
    """`is_distributed` for the database of `session`, asked in its transaction the first time only
    (one statement per engine on one Postgres, two on a cluster); a database distributed while the
    process runs is taken for what it was when first asked."""
    engine = session.get_bind()
    if not isinstance(engine, Engine):
        engine = engine.engine
    known = _DISTRIBUTED.get(engine)
    if known is None:
        conn = await session.connection()
        known = await conn.scalar(_CITUS) is not None and bool(await conn.scalar(_HAS_DISTRIBUTED))
        _DISTRIBUTED[engine] = known
    return known


async def _set_database_settings(conn: AsyncConnection, *, apply: bool = True) -> list[str]:
    """`DATABASE_SETTINGS` for the sessions to come, and this one; the settings changed (or, without
    `apply`, those that would be)."""
    done: list[str] = []
    database = await conn.scalar(text("SELECT current_database()"))
    for name, value in DATABASE_SETTINGS.items():
        if await conn.scalar(_DATABASE_SETTING, {"name": name}) != value:
            if apply:
                # Our own constants: names and values are not user input.
                await conn.execute(text(f"ALTER DATABASE \"{database}\" SET {name} = '{value}'"))
            done.append(f"database {database}: {name} = '{value}'")
        if apply:
            await conn.execute(text(f"SET {name} = '{value}'"))
    for name, value in ROLE_SETTINGS.items():
        if await conn.scalar(_ROLE_SETTING, {"role": SERVICE_ROLE, "name": name}) != value:
            if apply:
                # Citus passes ALTER ROLE … SET on to the workers.
                await conn.execute(text(f"ALTER ROLE {SERVICE_ROLE} SET {name} = '{value}'"))
            done.append(f"role {SERVICE_ROLE}: {name} = '{value}'")
    return done


def _parents_first(tables: dict[str, list[str]]) -> list[str]:
    """The tables in an order where each comes after the tables its foreign keys point to."""
    ordered: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in tables:
            return
        seen.add(name)
        for parent in sorted(tables[name]):
            visit(parent)
        ordered.append(name)

    for name in sorted(tables):
        visit(name)
    return ordered


# A table's own triggers that fire on TRUNCATE (`tgtype` bit 5): the append-only tables' guards.
_TRUNCATE_TRIGGERS = text(
    "SELECT tgname FROM pg_trigger WHERE tgrelid = CAST(:t AS regclass) AND NOT tgisinternal"
    " AND (tgtype & 32) <> 0 ORDER BY tgname"
)


async def _empty_local_copies(conn: AsyncConnection, tables: list[str], emptied: list[str]) -> None:
    """Empty the coordinator's own copies of `emptied`, of the `tables` Citus has just copied into their
    shards.

    `create_distributed_table` and `create_reference_table` leave the rows they copied in the
    coordinator's table, unseen by any query but on its disk: a second copy of the bank, which a purge
    would never reach. Citus's `truncate_local_data_after_distributing_table` empties one, and those
    whose foreign keys point to it with it (a reference table's, every table's). The triggers that forbid
    TRUNCATE (history is append-only) are set aside on the coordinator's copies alone for it (DDL not
    passed on to the shards), in the distribution's transaction: no other session sees them off."""
    triggers = [
        (table, trigger)
        for table in tables
        for trigger in (await conn.execute(_TRUNCATE_TRIGGERS, {"t": table})).scalars()
    ]
    await conn.execute(text("SET LOCAL citus.enable_ddl_propagation = off"))
    for table, trigger in triggers:
        await conn.execute(text(f'ALTER TABLE {table} DISABLE TRIGGER "{trigger}"'))
    for table in emptied:
        await conn.execute(
            text("SELECT truncate_local_data_after_distributing_table(CAST(:t AS regclass))"), {"t": table}
        )
    for table, trigger in triggers:
        await conn.execute(text(f'ALTER TABLE {table} ENABLE TRIGGER "{trigger}"'))
    await conn.execute(text("SET LOCAL citus.enable_ddl_propagation = on"))


async def _check_coordinator(conn: AsyncConnection) -> None:
    """Refuse (`DistributionError`) unless `conn` is a Citus coordinator with an active worker."""
    if await conn.scalar(_CITUS) is None:
        msg = (
            "this Postgres has no Citus (no `citus` extension in this database): distribute on a Citus "
            "coordinator, e.g. `memstore up --citus-workers 2` after `make citus`"
        )
        raise DistributionError(msg)
    if not await conn.scalar(_IS_COORDINATOR):
        msg = "this is a Citus worker, not the coordinator: distribute on the coordinator"
        raise DistributionError(msg)
    if not int(await conn.scalar(_WORKERS) or 0):
        msg = "the Citus coordinator has no active worker: add them first (citus_add_node)"
        raise DistributionError(msg)


async def _plan(conn: AsyncConnection, references: list[str], tables: list[str]) -> list[str]:
    """What `distribute` would do with the policies and these tables, and the rows each would move."""
    policies = (await conn.execute(_SUBQUERY_POLICIES, {"policy": POLICY})).scalars()
    plan = [f"{table}: policy {POLICY} without its subquery" for table in policies]
    for table in references:
        plan.append(f"{table}: reference table, {await _count(conn, table)} rows copied to every node")
    for table in tables:
        plan.append(
            f"{table}: distributed by {DISTRIBUTION_COLUMN}, co-located with {COLOCATE_WITH}, "
            f"{await _count(conn, table)} rows moved into its shards"
        )
    return plan


async def distribute(conn: AsyncConnection, *, dry_run: bool = False) -> list[str]:
    """Distribute the schema on the Citus cluster `conn` is the coordinator of, as the tables' owner;
    what was done, one line a step (empty when it already was). `conn` is in autocommit. With `dry_run`,
    what would be done, changing nothing: the same checks, the steps, and the rows each table would
    move (a bank restored into the coordinator)."""
    await _check_coordinator(conn)
    done = await _set_database_settings(conn, apply=not dry_run)
    kinds = {r.name: r.kind for r in await conn.execute(_CITUS_TABLES)}
    tenant_tables = {
        r.name: list(r.parents)
        for r in await conn.execute(_TENANT_TABLES, {"column": DISTRIBUTION_COLUMN})
        if r.name not in REFERENCE_TABLES
    }
    if COLOCATE_WITH not in tenant_tables:
        msg = f"no table {COLOCATE_WITH} with {DISTRIBUTION_COLUMN}: run `memstore migrate` first"
        raise DistributionError(msg)
    references = [t for t in REFERENCE_TABLES if kinds.get(t) != "reference"]
    # chunks has no foreign key to another tenant table, so it can lead.
    order = [COLOCATE_WITH, *(t for t in _parents_first(tenant_tables) if t != COLOCATE_WITH)]
    tables = [t for t in order if kinds.get(t) != "distributed"]
    if not references and not tables:
        return done
    if dry_run:
        return done + await _plan(conn, references, tables)
    # One transaction: all of it or none. Its statements one connection per node after the other
    # (`sequential`): a table's rows copied to its shards in parallel could not be read by the next
    # step of the same transaction.
    await conn.execute(text("BEGIN"))
    try:
        await conn.execute(text("SET LOCAL citus.multi_shard_modify_mode = 'sequential'"))
        for table in (await conn.execute(_SUBQUERY_POLICIES, {"policy": POLICY})).scalars():
            check = _POLICY_CHECKS.get(table, f"tenant_id = ANY ({_VISIBLE})")
            await conn.execute(text(f"ALTER POLICY {POLICY} ON {table} USING ({check}) WITH CHECK ({check})"))
            done.append(f"{table}: policy {POLICY} without its subquery")
        # A reference table made while a local table has a foreign key to it turns that table into a
        # "Citus local table", which Citus cannot distribute when it has an identity column
        # (audit_events, memory_versions, webhook_events): those keys go first and come back after.
        keys = (await conn.execute(_KEYS_TO, {"tables": tables, "to": list(REFERENCE_TABLES)})).all()
        for key in keys:
            await conn.execute(text(f'ALTER TABLE {key.table} DROP CONSTRAINT "{key.name}"'))
        # The rows already there (a bank restored into the coordinator), counted before Citus copies them.
        rows = {t: await _count(conn, t) for t in (*references, *tables)}
        for table in references:
            await conn.execute(text("SELECT create_reference_table(:t)"), {"t": table})
            done.append(f"{table}: reference table")
        for table in tables:
            colocate = "default" if table == COLOCATE_WITH else COLOCATE_WITH
            await conn.execute(
                text("SELECT create_distributed_table(:t, :column, colocate_with => :with)"),
                {"t": table, "column": DISTRIBUTION_COLUMN, "with": colocate},
            )
            done.append(f"{table}: distributed by {DISTRIBUTION_COLUMN}, co-located with {COLOCATE_WITH}")
        for key in keys:
            await conn.execute(text(f'ALTER TABLE {key.table} ADD CONSTRAINT "{key.name}" {key.definition}'))
        # Children first: a table's copy is emptied before those its foreign keys point to.
        made = [*references, *tables]
        moved = [t for t in reversed(made) if rows[t]]
        if moved:
            await _empty_local_copies(conn, made, moved)
        done += [
            f"{t}: {rows[t]} rows {'copied to every node' if t in references else 'moved into its shards'}, "
            "the coordinator's own copy emptied"
            for t in moved
        ]
        await conn.execute(text("COMMIT"))
    except BaseException:
        await conn.execute(text("ROLLBACK"))
        raise
    return done
