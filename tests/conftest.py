"""Test infrastructure: real Postgres + pgvector and real Redis, started once per session.

With MEMSTORE_DATABASE_URL / MEMSTORE_REDIS_URL set, those servers are used; otherwise the embedded
stack (the same code `memstore up` runs) is started in a temporary directory. The schema is built once
with the Alembic migrations into a template database; every test gets a fresh copy of it, so tests
are isolated without sharing rows or cleaning up.

Run in parallel (pytest-xdist, `-n N`), each process of the run starts its own embedded stack; on
servers named by the environment, each has a template database and a Redis database of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest
import redis.asyncio as aioredis
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.db.migrate import upgrade
from app.db.tenancy import SERVICE_ROLE
from app.domain.accounts.services import create_tenant
from app.lib.embedded import EmbeddedStack
from app.server.asgi import create_app

# The requests the fuzzer (tests/fuzz) sent, counted in each process and reported at the end of the run:
# CI's log shows how much was tried, not only that nothing failed. The hooks that count them across
# processes are here, where the process that reports (which collects nothing under pytest-xdist) has them.
FUZZ_REQUESTS = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[FUZZ_REQUESTS] = 0


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A process of a parallel run hands its count to the one that reports (`pytest_testnodedown`)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["fuzz_requests"] = session.config.stash.get(FUZZ_REQUESTS, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    sent = node.workeroutput.get("fuzz_requests", 0)  # type: ignore[attr-defined]
    config.stash[FUZZ_REQUESTS] = config.stash.get(FUZZ_REQUESTS, 0) + sent


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    sent = config.stash.get(FUZZ_REQUESTS, 0)
    if sent:
        terminalreporter.write_sep("-", f"schemathesis: {sent} generated requests sent to the API")


# Which process of a parallel run this is ("gw0", "gw1", ...; empty when the run is not parallel).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
TEMPLATE_DB = f"memstore_test_template{XDIST_WORKER}"
_db_counter = itertools.count()


def _own_redis_database(url: str) -> str:
    """On a Redis the processes of a parallel run share, a database for each (1, 2, ...), so one
    process's flush never empties another's queues."""
    if not XDIST_WORKER:
        return url
    database = str(int(XDIST_WORKER.removeprefix("gw")) + 1)
    parts = urlsplit(url)
    if parts.scheme == "unix":  # a socket's path is the URL's path: the database goes in the query
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"] + [("db", database)]
        return f"unix://{parts.path}?{urlencode(query)}"
    return urlunsplit(parts._replace(path=f"/{database}"))


@dataclass
class Servers:
    """Where the test Postgres and Redis are, and the embedded stack if we started one."""

    database_url: str  # any database on the server, as the tables' owner; tests derive their own from it
    service_url: str  # the same server as the service role (row-level security applies)
    redis_url: str
    stack: EmbeddedStack | None

    def url_for(self, database: str) -> str:
        """A database as its tables' owner (migrations, and the tests' own look at the rows)."""
        return make_url(self.database_url).set(database=database).render_as_string(hide_password=False)

    def service_url_for(self, database: str) -> str:
        """A database as the service role, as the API and the workers connect."""
        return make_url(self.service_url).set(database=database).render_as_string(hide_password=False)


async def _admin_connect(servers: Servers) -> asyncpg.Connection:
    url = make_url(servers.url_for("postgres"))
    return await asyncpg.connect(
        user=url.username,
        password=url.password,
        host=url.query.get("host") or url.host,
        port=url.port,
        database="postgres",
    )


def server_dir(prefix: str) -> Path:
    """A directory for a server that runs as another user (Postgres runs as `pgserver` under root).

    Not under pytest's temporary root: pytest makes that private (0700) whenever a session starts,
    which would lock a running server out of its own data directory.
    """
    return Path(tempfile.mkdtemp(prefix=prefix))


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    """With MEMSTORE_ADMIN_DATABASE_URL (the owner) and MEMSTORE_DATABASE_URL (the service role) set,
    those; with MEMSTORE_DATABASE_URL alone, it is the owner and the service role logs in beside it
    without a password (trust authentication); else the embedded Postgres."""
    admin_url = os.environ.get("MEMSTORE_ADMIN_DATABASE_URL")
    database_url = os.environ.get("MEMSTORE_DATABASE_URL")
    redis_url = os.environ.get("MEMSTORE_REDIS_URL")
    owner_url = admin_url or database_url
    stack, data_dir = None, None
    if owner_url is None or redis_url is None:
        data_dir = server_dir("memstore-tests-")
        stack = EmbeddedStack(data_dir, owner_url, redis_url)
        owner_url, redis_url = stack.start()
    else:
        redis_url = _own_redis_database(redis_url)
    if admin_url is not None and database_url is not None:
        service_url = database_url
    else:
        service_url = make_url(owner_url).set(username=SERVICE_ROLE, password=None).render_as_string(False)
    try:
        yield Servers(owner_url, service_url, redis_url, stack)
    finally:
        if stack is not None:
            stack.stop()
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
async def template_database(servers: Servers) -> str:
    """A database migrated to head with Alembic, copied for each test."""
    conn = await _admin_connect(servers)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
    finally:
        await conn.close()
    import asyncio

    await asyncio.to_thread(upgrade, servers.url_for(TEMPLATE_DB))
    return TEMPLATE_DB


@contextlib.asynccontextmanager
async def fresh_database(servers: Servers, template_database: str) -> AsyncIterator[str]:
    """A migrated database copied from the template, dropped afterwards; yields its URL as the owner."""
    name = f"memstore_test_{os.getpid()}_{next(_db_counter)}"
    conn = await _admin_connect(servers)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    finally:
        await conn.close()
    try:
        yield servers.url_for(name)
    finally:
        conn = await _admin_connect(servers)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@pytest.fixture
async def owner_database_url(servers: Servers, template_database: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test alone, as its tables' owner."""
    async with fresh_database(servers, template_database) as url:
        yield url


@pytest.fixture
def database_url(servers: Servers, owner_database_url: str) -> str:
    """The test's database as the service role: what the API and the workers under test connect with."""
    return servers.service_url_for(make_url(owner_database_url).database or "")


@pytest.fixture
async def redis_url(servers: Servers) -> str:
    """The test Redis, emptied before each test."""
    client = aioredis.from_url(servers.redis_url)
    await client.flushdb()
    await client.aclose()
    return servers.redis_url


@pytest.fixture
def settings(database_url: str, owner_database_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        admin_database_url=owner_database_url,
        redis_url=redis_url,
        auth_cache_ttl_s=0.0,
        log_format="console",
        rate_limit_per_s=0.0,  # tests that are about limits set their own
        user_rate_limit_per_s=0.0,
        # Most tests store vectors with HashingEmbedder directly and predict rankings from it; tests of
        # the default (onnx) embedder ask for it (tests/integration/search/test_semantic.py).
        embedder="hashing",
    )


@pytest.fixture
async def engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    """The tests' own connections, as the tables' owner: set-up and checks see every tenant's rows,
    as the service (`settings.database_url`) never does."""
    engine = create_engine(settings.as_owner(), application_name="memstore-tests")
    yield engine
    await engine.dispose()


@pytest.fixture
def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return create_sessionmaker(engine)


@pytest.fixture
def app(settings: Settings) -> Litestar:
    return create_app(settings, configure_logs=False)


@pytest.fixture
async def client(app: Litestar) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=app) as client:
        yield client


# Worker timings short enough for a test to see sweeps and retries happen.
FAST_WORKERS: dict[str, object] = {
    "sweep_interval_s": 1,
    "sweep_min_age_s": 1.0,
    "retry_backoff_s": 0.05,
    "retry_backoff_max_s": 0.2,
}


def writers_toml(writers: dict[str, dict[str, object]]) -> str:
    """A writers file (MEMSTORE_WRITERS_FILE) of these named writers and their settings."""
    return "\n".join(
        f"[writers.{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in fields.items())
        for name, fields in writers.items()
    )


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    """The settings of `api`; a folder whose tests need other settings overrides this."""
    return settings


@pytest.fixture
async def api(api_settings: Settings) -> AsyncIterator[AsyncTestClient[Litestar]]:
    """The API on `api_settings`, with its lifespan (its batcher, clients and caches) running."""
    async with AsyncTestClient(create_app(api_settings, configure_logs=False)) as client:
        yield client


@pytest.fixture
async def ingest_headers(api: AsyncTestClient[Litestar], tenant: TenantKeys) -> dict[str, str]:
    """The headers of a key such as a chat app holds: it ingests and reads."""
    response = await api.post(
        "/v1/admin/keys", json={"name": "app", "roles": ["ingest", "read"]}, headers=tenant.admin
    )
    assert response.status_code == 201, response.text
    return bearer(response.json()["key"])


@dataclass
class TenantKeys:
    tenant_id: uuid.UUID
    admin_key: str

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}


async def make_tenant(sessionmaker: async_sessionmaker[AsyncSession], name: str | None = None) -> TenantKeys:
    async with sessionmaker() as session, session.begin():
        tenant, secret = await create_tenant(session, name or f"t-{uuid.uuid4().hex[:8]}")
    return TenantKeys(tenant.id, secret)


@pytest.fixture
async def tenant(sessionmaker: async_sessionmaker[AsyncSession]) -> TenantKeys:
    """A tenant with an admin key."""
    return await make_tenant(sessionmaker, "acme")


@pytest.fixture
async def other_tenant(sessionmaker: async_sessionmaker[AsyncSession]) -> TenantKeys:
    return await make_tenant(sessionmaker, "globex")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
