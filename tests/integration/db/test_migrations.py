"""The migrations build the schema the models describe, and can be walked down and up again."""

from __future__ import annotations

import asyncio

import asyncpg
from sqlalchemy.engine import make_url

from app.db import migrate
from tests.conftest import Servers, _admin_connect

EXPECTED_TABLES = {
    "tenants",
    "api_keys",
    "scopes",
    "chunks",
    "memories",
    "memory_versions",
    "changesets",
    "audit_events",
    "audit_heads",
    "embedding_config",
    "reviews",
    "writer_views",
    "graph_scopes",
    "webhook_endpoints",
    "webhook_events",
    "webhook_deliveries",
}


async def _tables(url: str) -> set[str]:
    u = make_url(url)
    conn = await asyncpg.connect(
        user=u.username, host=u.query.get("host") or u.host, port=u.port, database=u.database
    )
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    return {r["tablename"] for r in rows} - {"alembic_version"}


async def test_upgrade_downgrade_upgrade_and_check(servers: Servers) -> None:
    conn = await _admin_connect(servers)
    await conn.execute('DROP DATABASE IF EXISTS "memstore_migrations" WITH (FORCE)')
    await conn.execute('CREATE DATABASE "memstore_migrations"')
    await conn.close()
    url = servers.url_for("memstore_migrations")

    await asyncio.to_thread(migrate.upgrade, url)
    assert await _tables(url) == EXPECTED_TABLES
    await asyncio.to_thread(migrate.check, url)  # raises if models and migrations drifted

    await asyncio.to_thread(migrate.downgrade, url, "base")
    assert await _tables(url) == set()

    await asyncio.to_thread(migrate.upgrade, url)
    assert await _tables(url) == EXPECTED_TABLES
    await asyncio.to_thread(migrate.check, url)


def test_single_head() -> None:
    assert migrate.head_revision() == "0022"
