"""Schemathesis against the app's own OpenAPI document, in-process, on the real Postgres and Redis.

One database, app and tenant serve every route's examples (a database per route would cost more than
the requests). Each request the fuzzer sends is counted, and the count is printed at the end of the
run, so CI's log shows how much was tried, not only that nothing failed.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from litestar import Litestar
from schemathesis.python import asgi
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.domain.accounts.services import create_api_key
from app.server.asgi import create_app
from tests.conftest import Servers, _admin_connect, make_tenant
from tests.support.fake_llm import FakeLLM
from tests.support.fake_reader import reader_responder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each route's test gets the id its name says (`...[GET /health]`): schemathesis names them apart
    but gives all of them the function's one node id, and pytest-xdist, which tells tests apart by id,
    ran one route's test of fifty-one."""
    for item in items:
        if getattr(item, "operation_label", None) is not None and item.parent is not None:
            item._id = item.parent.id.child(item.name)


@dataclass
class FuzzTarget:
    """The app under test and the Authorization headers to send, in turn."""

    app: Litestar
    authorizations: list[str | None]


async def _key(sessionmaker: async_sessionmaker[AsyncSession], tenant_id: object, role: str) -> str:
    async with sessionmaker() as session, session.begin():
        _, secret = await create_api_key(
            session, tenant_id=tenant_id, name=f"fuzz-{role}", roles=[role], actor="tests"
        )
    return secret


@pytest.fixture(scope="module")
def fuzz_reader() -> Iterator[FakeLLM]:
    """A read model for POST /v1/answer, so its answers are fuzzed, not only its refusals."""
    with FakeLLM(responder=reader_responder).in_thread() as server:
        yield server


@pytest.fixture(scope="module")
async def fuzz_settings(
    servers: Servers, template_database: str, fuzz_reader: FakeLLM
) -> AsyncIterator[Settings]:
    name = f"memstore_fuzz_{os.getpid()}"
    conn = await _admin_connect(servers)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    finally:
        await conn.close()
    yield Settings(
        database_url=servers.service_url_for(name),
        admin_database_url=servers.url_for(name),
        redis_url=servers.redis_url,
        auth_cache_ttl_s=0.0,
        log_format="console",
        reader_base_url=fuzz_reader.base_url,
        reader_model=fuzz_reader.model,
    )
    conn = await _admin_connect(servers)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(scope="module")
async def fuzz_target(fuzz_settings: Settings) -> AsyncIterator[FuzzTarget]:
    """Mostly the tenant's admin key; sometimes none, a read-only key or an ingest-only key."""
    engine = create_engine(fuzz_settings.as_owner(), application_name="memstore-fuzz")
    sessionmaker = create_sessionmaker(engine)
    try:
        tenant = await make_tenant(sessionmaker, "fuzz")
        read_only = await _key(sessionmaker, tenant.tenant_id, "read")
        ingest_only = await _key(sessionmaker, tenant.tenant_id, "ingest")
    finally:
        await engine.dispose()
    admin = f"Bearer {tenant.admin_key}"
    app = create_app(fuzz_settings, configure_logs=False)
    yield FuzzTarget(app, [admin] * 7 + [None, f"Bearer {read_only}", f"Bearer {ingest_only}"])
    asgi.shutdown_lifespans()  # schemathesis started the app's lifespan: its engine and Redis client
