"""Migration 0021 rewrote the functions a Citus cluster could not run; on one Postgres each returns what
it did before. `memstore_tenant_backlog`'s statement changed (its per-tenant sums are grouped now), so
its rows are compared with 0019's on one bank; the others kept their statement, wrapped in PL/pgSQL."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

_MIGRATIONS = Path(__file__).resolve().parents[3] / "migrations" / "versions"


def _tenant_backlog_0019() -> str:
    """0019's statement of `memstore_tenant_backlog`, as a function of another name."""
    spec = importlib.util.spec_from_file_location("fair_shares", _MIGRATIONS / "0019_fair_shares.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    body: str = module.TENANT_BACKLOG_BODY
    return body.replace("FUNCTION memstore_tenant_backlog(", "FUNCTION tenant_backlog_0019(")


@pytest.fixture
async def owner(owner_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    url = make_url(owner_database_url)
    conn = await asyncpg.connect(
        user=url.username, host=url.query.get("host") or url.host, port=url.port, database=url.database
    )
    transaction = conn.transaction()
    await transaction.start()
    yield conn
    await transaction.rollback()
    await conn.close()


async def _bank(conn: asyncpg.Connection) -> None:
    """Tenants with and without budgets, a shadow bank, tokens spent today and yesterday, in chunks
    still waiting, failed and applied (their changesets)."""
    now = datetime.now(UTC)
    tenants = []
    for i in range(6):
        tenant_id = uuid.uuid4()
        settings = f'{{"daily_token_budget": {1000 * (i + 1)}}}' if i % 2 == 0 else "{}"
        await conn.execute(
            "INSERT INTO tenants (id, name, settings) VALUES ($1, $2, $3::jsonb)",
            tenant_id,
            f"t{i}",
            settings,
        )
        tenants.append(tenant_id)
    shadow = uuid.uuid4()
    await conn.execute(
        "INSERT INTO tenants (id, name, shadow_of, settings)"
        " VALUES ($1, 'shadow', $2, '{\"daily_token_budget\": 5}')",
        shadow,
        tenants[0],
    )
    for n, tenant_id in enumerate([*tenants, shadow]):
        for seq in range(1, 4 + n):
            status = ("queued", "processing", "failed", "applied")[seq % 4]
            usage = f'{{"prompt_tokens": {seq * 10}, "completion_tokens": {n}}}' if seq % 3 else "{}"
            at = now - timedelta(days=seq % 2, minutes=seq + n)
            chunk_id = uuid.uuid4()
            await conn.execute(
                "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, body_hash, status, writer, usage,"
                " received_at, updated_at)"
                " VALUES ($1, $2, 'u', $3, '[]', md5($3::bigint::text), $4, 'offline', $5::jsonb, $6, $6)",
                chunk_id,
                tenant_id,
                seq,
                status,
                usage,
                at,
            )
            if status == "applied":
                await conn.execute(
                    "INSERT INTO changesets (id, tenant_id, user_id, kind, actor, chunk_id, usage,"
                    " created_at) VALUES ($1, $2, 'u', 'writer', 'worker:w', $3, $4::jsonb, $5)",
                    uuid.uuid4(),
                    tenant_id,
                    chunk_id,
                    f'{{"prompt_tokens": {seq * 7}, "completion_tokens": 3}}',
                    at,
                )


async def test_the_tenant_backlog_is_what_0019s_statement_said(owner: asyncpg.Connection) -> None:
    await _bank(owner)
    await owner.execute(_tenant_backlog_0019())
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    for limit, since in ((10, day), (3, day), (10, day - timedelta(days=2))):
        query = "SELECT tenant_id, tenant, queued, daily_token_budget, tokens_today FROM {}($1, $2)"
        now = await owner.fetch(query.format("memstore_tenant_backlog"), limit, since)
        before = await owner.fetch(query.format("tenant_backlog_0019"), limit, since)
        assert [tuple(r) for r in now] == [tuple(r) for r in before]
        assert any(r["tokens_today"] for r in now), now
