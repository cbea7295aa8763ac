"""Row-level security: the service role sees only the tenants it is set to, and cannot rewrite history.

The tests connect as the service role exactly as the API and the workers do (`settings.database_url`),
and look at the rows as the tables' owner (the `sessionmaker` fixture) to know what is really there.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine
from app.db.tenancy import SERVICE_ROLE, TENANTS_SETTING, tenant_scope
from app.domain.audit.services import record_event
from tests.conftest import TenantKeys, make_tenant
from tests.integration.db.test_append_only import _seed

# Every table holding a tenant's rows (the migration's list, checked against the schema below).
TENANT_TABLES = (
    "api_keys",
    "audit_events",
    "audit_heads",
    "changesets",
    "chunks",
    "graph_scopes",
    "memories",
    "memory_versions",
    "reviews",
    "scopes",
    "webhook_deliveries",
    "webhook_endpoints",
    "webhook_events",
    "writer_views",
)
WEBHOOK_TABLES = ("webhook_deliveries", "webhook_endpoints", "webhook_events")  # the fixture fills none


async def _service(settings: Settings) -> asyncpg.Connection:
    url = make_url(settings.database_url or "")
    return await asyncpg.connect(
        user=url.username, host=url.query.get("host") or url.host, port=url.port, database=url.database
    )


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A raw connection as the service role, with no tenant set."""
    conn = await _service(settings)
    assert await conn.fetchval("SELECT current_user") == SERVICE_ROLE
    yield conn
    await conn.close()


@pytest.fixture
async def two_banks(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys, other_tenant: TenantKeys
) -> dict[uuid.UUID, dict[str, int]]:
    """Both tenants with a memory, its version, a changeset, a chunk, audit events, a sealed chain
    head and a graph request; what each has in every tenant table, as the owner counts it."""
    for keys in (tenant, other_tenant):
        async with sessionmaker() as session, session.begin():
            await _seed(session, keys.tenant_id)
            await record_event(session, tenant_id=keys.tenant_id, actor="test", action="seeded")
            await session.execute(
                text(
                    "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, body_hash)"
                    " VALUES (gen_random_uuid(), :t, 'u1', 1, '[]', 'h')"
                ),
                {"t": keys.tenant_id},
            )
            await session.execute(
                text("INSERT INTO scopes (tenant_id, user_id, last_seq) VALUES (:t, 'u1', 1)"),
                {"t": keys.tenant_id},
            )
            await session.execute(
                text("INSERT INTO audit_heads (tenant_id, seq, hash) VALUES (:t, 0, repeat('0', 64))"),
                {"t": keys.tenant_id},
            )
            await session.execute(
                text("INSERT INTO graph_scopes (tenant_id, user_id) VALUES (:t, '')"), {"t": keys.tenant_id}
            )
    counts: dict[uuid.UUID, dict[str, int]] = {}
    async with sessionmaker() as session:
        for keys in (tenant, other_tenant):
            counts[keys.tenant_id] = {
                table: int(
                    await session.scalar(
                        text(f"SELECT count(*) FROM {table} WHERE tenant_id = :t"),
                        {"t": keys.tenant_id},
                    )
                    or 0
                )
                for table in TENANT_TABLES
            }
    return counts


async def set_tenant(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> None:
    """Set the connection to one tenant, as `app.db.tenancy` does for the service."""
    await conn.execute(f"SELECT set_config('{TENANTS_SETTING}', $1, false)", str(tenant_id))


async def _counts(conn: asyncpg.Connection) -> dict[str, dict[uuid.UUID, int]]:
    """Rows per table and tenant as `conn` sees them, with no tenant predicate in the query."""
    seen: dict[str, dict[uuid.UUID, int]] = {}
    for table in TENANT_TABLES:
        rows = await conn.fetch(f"SELECT tenant_id, count(*) AS n FROM {table} GROUP BY tenant_id")
        seen[table] = {r["tenant_id"]: r["n"] for r in rows}
    return seen


async def test_without_the_tenant_setting_the_service_sees_no_tenant_rows(
    service: asyncpg.Connection, two_banks: dict[uuid.UUID, dict[str, int]]
) -> None:
    # The owner sees both tenants' rows in every table the fixture fills.
    assert all(
        counts[table] > 0
        for counts in two_banks.values()
        for table in TENANT_TABLES
        if table not in ("reviews", "writer_views", *WEBHOOK_TABLES)
    )
    assert await _counts(service) == {table: {} for table in TENANT_TABLES}
    assert await service.fetchval("SELECT count(*) FROM tenants") == 0


async def test_set_to_one_tenant_the_service_sees_all_of_its_rows_and_none_of_the_others(
    service: asyncpg.Connection,
    two_banks: dict[uuid.UUID, dict[str, int]],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    for keys in (tenant, other_tenant):
        await set_tenant(service, keys.tenant_id)
        expected = {table: {keys.tenant_id: n} if n else {} for table, n in two_banks[keys.tenant_id].items()}
        assert await _counts(service) == expected
        assert [r["id"] for r in await service.fetch("SELECT id FROM tenants")] == [keys.tenant_id]


async def test_the_service_cannot_write_rows_of_a_tenant_it_is_not_set_to(
    service: asyncpg.Connection,
    sessionmaker: async_sessionmaker[AsyncSession],
    two_banks: dict[uuid.UUID, dict[str, int]],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    await set_tenant(service, tenant.tenant_id)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
        await service.execute(
            "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, body_hash)"
            " VALUES (gen_random_uuid(), $1, 'u1', 2, '[]', 'h')",
            other_tenant.tenant_id,
        )
    # Rows of another tenant are not there to update; its own cannot be moved to another tenant.
    assert (
        await service.execute(
            "UPDATE memories SET content = 'owned' WHERE tenant_id = $1", other_tenant.tenant_id
        )
        == "UPDATE 0"
    )
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
        await service.execute("UPDATE memories SET tenant_id = $1", other_tenant.tenant_id)
    async with sessionmaker() as session:
        contents = (await session.scalars(text("SELECT content FROM memories ORDER BY tenant_id"))).all()
        chunks = await session.scalar(text("SELECT count(*) FROM chunks"))
    assert contents == ["The user lives in Lyon.", "The user lives in Lyon."]
    assert chunks == 2


@pytest.mark.parametrize(
    ("statement", "refusal"),
    [
        ("ALTER TABLE memory_versions DISABLE TRIGGER memory_versions_append_only", "must be owner"),
        ("ALTER TABLE audit_events DISABLE TRIGGER ALL", "must be owner"),
        ("DROP TRIGGER changesets_status_only ON changesets", "must be owner"),
        ("ALTER TABLE memories DISABLE ROW LEVEL SECURITY", "must be owner"),
        ("DROP POLICY tenant_isolation ON chunks", "must be owner"),
        ("SET session_replication_role = replica", "permission denied"),
        ("SET row_security = off; SELECT count(*) FROM memories", "row-level security"),
        ("TRUNCATE memory_versions", "permission denied"),
        ("DELETE FROM changesets", "permission denied"),
        ("UPDATE memory_versions SET content = 'rewritten'", "permission denied"),
    ],
)
async def test_the_service_cannot_turn_the_walls_off(
    service: asyncpg.Connection,
    two_banks: dict[uuid.UUID, dict[str, int]],
    tenant: TenantKeys,
    statement: str,
    refusal: str,
) -> None:
    await set_tenant(service, tenant.tenant_id)
    await service.execute("SELECT set_config('memstore.purge', 'on', false)")
    with pytest.raises(asyncpg.PostgresError, match=refusal):
        await service.execute(statement)


async def test_the_purge_switch_is_honoured_only_for_the_tables_owner(
    servers: object,
    owner_database_url: str,
    sessionmaker: async_sessionmaker[AsyncSession],
    two_banks: dict[uuid.UUID, dict[str, int]],
    tenant: TenantKeys,
) -> None:
    """Even a role granted DELETE on the history tables, with the switch on, deletes nothing: only the
    owner (through `memstore_purge_user`) may."""
    intruder = f"memstore_intruder_{uuid.uuid4().hex[:8]}"
    async with sessionmaker() as session, session.begin():
        await session.execute(text(f"CREATE ROLE {intruder} LOGIN IN ROLE {SERVICE_ROLE}"))
        await session.execute(
            text(f"GRANT DELETE ON memory_versions, audit_events, changesets TO {intruder}")
        )
    url = make_url(owner_database_url)
    conn = await asyncpg.connect(
        user=intruder, host=url.query.get("host") or url.host, port=url.port, database=url.database
    )
    try:
        await set_tenant(conn, tenant.tenant_id)
        async with conn.transaction():
            await conn.execute("SELECT set_config('memstore.purge', 'on', true)")
            assert await conn.fetchval("SELECT memstore_purging('memory_versions'::regclass)") is False
            for table in ("memory_versions", "audit_events", "changesets"):
                with pytest.raises(asyncpg.RestrictViolationError, match="append-only"):
                    async with conn.transaction():
                        await conn.execute(f"DELETE FROM {table}")
    finally:
        await conn.close()
        async with sessionmaker() as session, session.begin():
            await session.execute(
                text(f"REVOKE ALL ON memory_versions, audit_events, changesets FROM {intruder}")
            )
            await session.execute(text(f"DROP ROLE {intruder}"))
    async with sessionmaker() as session:
        left = await session.scalar(
            text("SELECT count(*) FROM memory_versions WHERE tenant_id = :t"), {"t": tenant.tenant_id}
        )
    assert left == two_banks[tenant.tenant_id]["memory_versions"]


async def test_the_service_purges_only_a_tenant_it_is_set_to(
    service: asyncpg.Connection,
    sessionmaker: async_sessionmaker[AsyncSession],
    two_banks: dict[uuid.UUID, dict[str, int]],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    await set_tenant(service, tenant.tenant_id)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="not set to tenant"):
        await service.fetchval("SELECT memstore_purge_user($1, 'u1')", other_tenant.tenant_id)
    erased = await service.fetchval("SELECT memstore_purge_user($1, 'u1')::text", tenant.tenant_id)
    assert '"versions": 1' in erased
    async with sessionmaker() as session:
        left = {
            keys.tenant_id: await session.scalar(
                text("SELECT count(*) FROM memory_versions WHERE tenant_id = :t"), {"t": keys.tenant_id}
            )
            for keys in (tenant, other_tenant)
        }
    assert left == {tenant.tenant_id: 0, other_tenant.tenant_id: 1}
    # Outside the function the switch is off again, and the service cannot delete at all.
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await service.execute("DELETE FROM memory_versions")


async def test_a_pooled_connection_never_carries_one_tenant_into_the_next_checkout(
    settings: Settings,
    two_banks: dict[uuid.UUID, dict[str, int]],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    engine: AsyncEngine = create_engine(settings.model_copy(update={"db_pool_size": 1}), "memstore-tests")
    query = text("SELECT tenant_id FROM memories")
    try:
        for expected in ([tenant.tenant_id], [other_tenant.tenant_id], [], [tenant.tenant_id], []):
            with tenant_scope(expected):
                async with AsyncSession(engine) as session:
                    assert list((await session.scalars(query)).all()) == expected
        # A rolled-back transaction does not bring an earlier tenant back either.
        with tenant_scope([tenant.tenant_id]):
            async with AsyncSession(engine) as session:
                await session.execute(query)
                await session.rollback()
        async with AsyncSession(engine) as session:
            assert (await session.scalars(query)).all() == []
    finally:
        await engine.dispose()


async def test_every_transaction_carries_its_tenants_itself(
    settings: Settings,
    two_banks: dict[uuid.UUID, dict[str, int]],
    tenant: TenantKeys,
) -> None:
    """Each BEGIN sets the tenants for its transaction (`SET LOCAL`, the copy a Citus cluster passes on
    to its shards): with the session's copy emptied, a transaction still sees its tenant's rows, and
    the statement after it (autocommit, the session's copy) sees none."""
    engine: AsyncEngine = create_engine(settings.model_copy(update={"db_pool_size": 1}), "memstore-tests")
    try:
        with tenant_scope([tenant.tenant_id]):
            async with engine.connect() as conn:
                await conn.execute(text(f"SELECT set_config('{TENANTS_SETTING}', '', false)"))
                await conn.commit()
                seen = (await conn.execute(text("SELECT DISTINCT tenant_id FROM memories"))).scalars().all()
                assert seen == [tenant.tenant_id]
                await conn.commit()
                autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
                assert (await autocommit.execute(text("SELECT count(*) FROM memories"))).scalar() == 0
                await autocommit.invalidate()  # its session copy is not what the pool believes
    finally:
        await engine.dispose()


async def test_a_shadow_bank_is_seen_with_its_tenant_and_alone_without_it(
    service: asyncpg.Connection,
    sessionmaker: async_sessionmaker[AsyncSession],
    two_banks: dict[uuid.UUID, dict[str, int]],
    tenant: TenantKeys,
) -> None:
    bank = uuid.uuid4()
    async with sessionmaker() as session, session.begin():
        await session.execute(
            text("INSERT INTO tenants (id, name, shadow_of) VALUES (:b, :n, :t)"),
            {"b": bank, "n": f"shadow:{tenant.tenant_id}:x", "t": tenant.tenant_id},
        )
        await _seed(session, bank)
    await set_tenant(service, tenant.tenant_id)
    seen = await service.fetch("SELECT tenant_id FROM memories ORDER BY tenant_id")
    assert sorted(r["tenant_id"] for r in seen) == sorted([tenant.tenant_id, bank])
    await set_tenant(service, bank)
    assert [r["tenant_id"] for r in await service.fetch("SELECT tenant_id FROM memories")] == [bank]


async def test_every_tenant_table_has_its_policy_and_the_service_its_grants_and_no_more(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """A table added later with a `tenant_id` and no policy, or one the service cannot use, fails here."""
    async with sessionmaker() as session:
        tables = (
            await session.execute(
                text(
                    """
                    SELECT c.relname, c.relrowsecurity,
                           EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid
                                   AND a.attname = 'tenant_id' AND NOT a.attisdropped) AS has_tenant,
                           EXISTS (SELECT FROM pg_policy p WHERE p.polrelid = c.oid) AS has_policy,
                           has_table_privilege(:role, c.oid, 'SELECT') AS can_read,
                           has_table_privilege(:role, c.oid, 'INSERT') AS can_insert,
                           has_table_privilege(:role, c.oid, 'DELETE') AS can_delete,
                           has_table_privilege(:role, c.oid, 'TRUNCATE') AS can_truncate
                    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = 'public' AND c.relkind = 'r'
                    ORDER BY c.relname
                    """
                ),
                {"role": SERVICE_ROLE},
            )
        ).all()
    with_tenant = sorted(t.relname for t in tables if t.has_tenant)
    assert with_tenant == sorted(TENANT_TABLES)
    for table in tables:
        if table.has_tenant or table.relname == "tenants":
            assert table.relrowsecurity, f"{table.relname} has no row-level security"
            assert table.has_policy, f"{table.relname} has no policy"
        assert table.can_read, f"the service cannot read {table.relname}"
        assert table.can_insert or table.relname == "alembic_version", table.relname
        assert not table.can_delete, f"the service may DELETE from {table.relname}"
        assert not table.can_truncate, f"the service may TRUNCATE {table.relname}"


async def test_the_service_reads_across_tenants_only_what_its_functions_give(
    service: asyncpg.Connection, two_banks: dict[uuid.UUID, dict[str, int]], tenant: TenantKeys
) -> None:
    """The sweeper, the sealer and /metrics see every tenant's figures without any tenant's rows."""
    unsealed = {r[0] for r in await service.fetch("SELECT memstore_unsealed_audit_tenants(100)")}
    assert unsealed == set(two_banks)
    backlog = await service.fetchrow("SELECT * FROM memstore_backlog()")
    assert backlog["queued"] == 2
    assert await service.fetchval("SELECT count(*) FROM chunks") == 0


async def test_another_tenant_created_by_the_owner_is_invisible_to_the_first_tenants_work(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    late = await make_tenant(sessionmaker, "late")
    engine = create_engine(settings, "memstore-tests")
    try:
        with tenant_scope([tenant.tenant_id]):
            async with AsyncSession(engine) as session:
                names = (await session.scalars(text("SELECT name FROM tenants"))).all()
                with pytest.raises(DBAPIError, match="row-level security"):
                    await session.execute(
                        text(
                            "INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash, roles)"
                            " VALUES (gen_random_uuid(), :t, 'x', 'x', 'x', '{admin}')"
                        ),
                        {"t": late.tenant_id},
                    )
    finally:
        await engine.dispose()
    assert names == ["acme"]
