"""Migration 0020 moves the keys of a bank that has rows to `(tenant_id, …)` and back, keeps every row,
and leaves what the operators' functions answer as it was."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from app.db import migrate
from tests.conftest import Servers, _admin_connect

DATABASE = "memstore_tenant_keys"
BEFORE, AFTER = "0019", "0020"
TABLES = ("audit_events", "changesets", "chunks", "memories", "memory_versions", "reviews", "writer_views")

KEYS = """
SELECT c.conname, pg_get_constraintdef(c.oid) AS definition FROM pg_constraint c
WHERE c.conrelid = ANY ($1::regclass[]) AND c.contype IN ('p', 'f')
UNION ALL
SELECT i.indexname, i.indexdef FROM pg_indexes i
WHERE i.indexname IN ('uq_changesets_writer_chunk', 'uq_memory_versions_memory_version')
"""

OLD_KEYS = {
    "pk_audit_events": "PRIMARY KEY (id)",
    "pk_changesets": "PRIMARY KEY (id)",
    "pk_chunks": "PRIMARY KEY (id)",
    "pk_memories": "PRIMARY KEY (id)",
    "pk_memory_versions": "PRIMARY KEY (id)",
    "pk_reviews": "PRIMARY KEY (id)",
    "pk_writer_views": "PRIMARY KEY (changeset_id)",
    "fk_writer_views_changeset_id_changesets": (
        "FOREIGN KEY (changeset_id) REFERENCES changesets(id) ON DELETE CASCADE"
    ),
    "uq_changesets_writer_chunk": "(chunk_id) WHERE",
    "uq_memory_versions_memory_version": "(memory_id, version)",
}
NEW_KEYS = {
    "pk_audit_events": "PRIMARY KEY (tenant_id, id)",
    "pk_changesets": "PRIMARY KEY (tenant_id, id)",
    "pk_chunks": "PRIMARY KEY (tenant_id, id)",
    "pk_memories": "PRIMARY KEY (tenant_id, id)",
    "pk_memory_versions": "PRIMARY KEY (tenant_id, id)",
    "pk_reviews": "PRIMARY KEY (tenant_id, id)",
    "pk_writer_views": "PRIMARY KEY (tenant_id, changeset_id)",
    "fk_writer_views_tenant_id_changesets": (
        "FOREIGN KEY (tenant_id, changeset_id) REFERENCES changesets(tenant_id, id) ON DELETE CASCADE"
    ),
    "uq_changesets_writer_chunk": "(tenant_id, chunk_id) WHERE",
    "uq_memory_versions_memory_version": "(tenant_id, memory_id, version)",
}
GONE_AFTER = {"fk_writer_views_changeset_id_changesets"}
GONE_BEFORE = {"fk_writer_views_tenant_id_changesets"}

# Each row with a time well in the past, so the functions' ages are the same to the second whenever
# they are read.
PAST = "now() - interval '3 days'"


@pytest.fixture
async def bank(servers: Servers) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A database migrated to 0019 and a connection to it as the tables' owner."""
    admin = await _admin_connect(servers)
    await admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    url = servers.url_for(DATABASE)
    await asyncio.to_thread(migrate.upgrade, url, BEFORE)
    conn = await connect(url)
    try:
        yield url, conn
    finally:
        await conn.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        await admin.close()


async def connect(url: str) -> asyncpg.Connection:
    u = make_url(url)
    return await asyncpg.connect(
        user=u.username,
        password=u.password,
        host=u.query.get("host") or u.host,
        port=u.port,
        database=u.database,
    )


async def fill(conn: asyncpg.Connection) -> dict[str, list[uuid.UUID]]:
    """Two tenants (and a shadow bank of the first), each with rows in every table whose key changes,
    in every state the operators' functions count, and a third tenant with none."""
    ids: dict[str, list[uuid.UUID]] = {"tenants": [], "chunks": [], "memories": [], "changesets": []}
    for n, name in enumerate(("acme", "globex")):
        tenant = uuid.uuid4()
        ids["tenants"].append(tenant)
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", tenant, name)
        for seq, status in enumerate(("applied", "queued", "processing", "failed", "failed"), start=1):
            chunk, changeset = uuid.uuid4(), uuid.uuid4()
            ids["chunks"].append(chunk)
            await conn.execute(
                "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, body_hash, status, last_error,"
                f" received_at, updated_at) VALUES ($1, $2, 'u', $3, '[]', 'h', $4, $5, {PAST}, {PAST})",
                chunk,
                tenant,
                seq,
                status,
                f"writer error: case {seq}: details" if status == "failed" else None,
            )
            if status != "applied":
                continue
            ids["changesets"].append(changeset)
            await conn.execute(
                "INSERT INTO changesets (id, tenant_id, user_id, kind, chunk_id, actor)"
                " VALUES ($1, $2, 'u', 'writer', $3, 'worker')",
                changeset,
                tenant,
                chunk,
            )
            await conn.execute(
                "INSERT INTO writer_views (changeset_id, tenant_id) VALUES ($1, $2)", changeset, tenant
            )
            await conn.execute("UPDATE chunks SET changeset_id = $1 WHERE id = $2", changeset, chunk)
            memory = uuid.uuid4()
            ids["memories"].append(memory)
            await conn.execute(
                "INSERT INTO memories (id, tenant_id, user_id, content, changeset_id, version)"
                " VALUES ($1, $2, 'u', 'The user likes tea.', $3, 2)",
                memory,
                tenant,
                changeset,
            )
            for version in (1, 2):
                await conn.execute(
                    "INSERT INTO memory_versions (tenant_id, user_id, memory_id, version, op, content, tags,"
                    " owner, status, changeset_id, actor)"
                    " VALUES ($1, 'u', $2, $3, 'ADD', 'The user likes tea.', '{}', 'user', 'active', $4,"
                    " 'w')",
                    tenant,
                    memory,
                    version,
                    changeset,
                )
            for decision in ("pending", "approved") + ("pending",) * n:
                await conn.execute(
                    "INSERT INTO reviews (id, tenant_id, user_id, changeset_id, op_index, op, targets,"
                    f" status, created_at) VALUES ($1, $2, 'u', $3, 0, '{{}}', '[]', $4, {PAST})",
                    uuid.uuid4(),
                    tenant,
                    changeset,
                    decision,
                )
        for sealed in (False, True, False):
            await conn.execute(
                "INSERT INTO audit_events (tenant_id, actor, action, created_at, hash)"
                f" VALUES ($1, 'a', 'chunk.accepted', {PAST}, $2)",
                tenant,
                "h" if sealed else None,
            )
        await conn.execute("INSERT INTO audit_heads (tenant_id, seq, hash) VALUES ($1, 7, 'h')", tenant)
    await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 'initech')", uuid.uuid4())
    bank = uuid.uuid4()
    await conn.execute(
        "INSERT INTO tenants (id, name, shadow_of) VALUES ($1, 'acme-shadow', $2)", bank, ids["tenants"][0]
    )
    await conn.execute(
        "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, body_hash, status, last_error)"
        " VALUES ($1, $2, 'u', 1, '[]', 'h', 'failed', 'boom')",
        uuid.uuid4(),
        bank,
    )
    await conn.execute(
        "INSERT INTO embedding_config (id, name, dim, target_name, cursor) VALUES (1, 'a', 384, 'b', $1)",
        ids["memories"][0],
    )
    return ids


async def keys(conn: asyncpg.Connection) -> dict[str, str]:
    return {row["conname"]: row["definition"] for row in await conn.fetch(KEYS, list(TABLES))}


def assert_keys(found: dict[str, str], want: dict[str, str], gone: set[str]) -> None:
    for name, definition in want.items():
        assert definition in found[name], (name, found.get(name))
    assert not gone & set(found)


async def counts(conn: asyncpg.Connection) -> dict[str, int]:
    return {table: await conn.fetchval(f"SELECT count(*) FROM {table}") for table in TABLES}


async def operators_read(conn: asyncpg.Connection) -> tuple[list[Any], list[float]]:
    """What the three rewritten functions answer: every value but the ages, and the ages apart (they
    grow between two reads)."""
    ages: list[float] = []

    def plain(rows: list[asyncpg.Record]) -> list[dict[str, Any]]:
        ages.extend(v for row in rows for v in row.values() if isinstance(v, float))
        return [{k: "age" if isinstance(v, float) else v for k, v in row.items()} for row in rows]

    read = [
        plain(await conn.fetch("SELECT * FROM memstore_operator_status()")),
        plain(await conn.fetch("SELECT * FROM memstore_failed_chunks() ORDER BY tenant, error")),
        plain(await conn.fetch("SELECT * FROM memstore_operator_gauges()")),
    ]
    return read, ages


async def test_the_keys_move_to_the_tenant_and_back_on_a_bank_with_rows(
    bank: tuple[str, asyncpg.Connection],
) -> None:
    url, conn = bank
    ids = await fill(conn)
    rows = await counts(conn)
    assert all(rows.values()), rows
    assert_keys(await keys(conn), OLD_KEYS, GONE_BEFORE)
    read, ages = await operators_read(conn)
    assert all(3 * 86400 <= age < 3 * 86400 + 600 for age in ages if age), ages
    # What the fill means the operators to see: the shadow bank apart; globex with one review more.
    status = {row["tenant"]: row for row in read[0]}
    assert set(status) == {"acme", "globex", "initech"}
    assert [
        (
            r["queued"],
            r["processing"],
            r["failed"],
            r["reviews_waiting"],
            r["audit_unsealed"],
            r["audit_head_seq"],
        )
        for r in (status["acme"], status["globex"], status["initech"])
    ] == [(1, 1, 2, 1, 2, 7), (1, 1, 2, 2, 2, 7), (0, 0, 0, 0, 0, 0)]
    assert [(r["tenant"], r["error"], r["chunks"]) for r in read[1]] == [
        ("acme", "writer error: case 4", 1),
        ("acme", "writer error: case 5", 1),
        ("globex", "writer error: case 4", 1),
        ("globex", "writer error: case 5", 1),
    ]
    assert read[2][0]["reviews_waiting"] == 3

    for revision, want, gone in ((AFTER, NEW_KEYS, GONE_AFTER), (BEFORE, OLD_KEYS, GONE_BEFORE)) * 2:
        await conn.close()
        if revision == AFTER:
            await asyncio.to_thread(migrate.upgrade, url, AFTER)
        else:
            await asyncio.to_thread(migrate.downgrade, url, BEFORE)
        conn = await connect(url)
        assert_keys(await keys(conn), want, gone)
        assert await counts(conn) == rows
        read_now, ages_now = await operators_read(conn)
        assert read_now == read, revision
        assert len(ages_now) == len(ages)
        assert all(abs(a - b) < 60 for a, b in zip(ages_now, ages, strict=True)), (ages_now, ages)
        # The view still hangs off its changeset, and a re-embedding under way starts its walk over.
        joined = await conn.fetchval(
            "SELECT count(*) FROM writer_views v"
            " JOIN changesets c ON c.tenant_id = v.tenant_id AND c.id = v.changeset_id"
        )
        assert joined == len(ids["changesets"])
        assert await conn.fetchval("SELECT cursor FROM embedding_config") is None

    # On the new keys, an id is a tenant's: the same chunk id may be another tenant's too.
    await conn.close()
    await asyncio.to_thread(migrate.upgrade, url, AFTER)
    conn = await connect(url)
    try:
        inserted = await conn.fetch(
            "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, body_hash)"
            " VALUES ($1, $2, 'v', 1, $3, 'h') ON CONFLICT (tenant_id, id) DO NOTHING RETURNING id",
            ids["chunks"][0],  # acme's
            ids["tenants"][1],
            json.dumps([]),
        )
        assert len(inserted) == 1
    finally:
        await conn.close()
