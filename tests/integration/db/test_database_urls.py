"""A libpq-style URL (`postgresql://`, `postgres://`, `?sslmode=` …) connects and migrates for real."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.config import Settings
from app.db.engine import create_engine
from app.db.migrate import head_revision, upgrade
from tests.conftest import Servers, _admin_connect


def _libpq(url: str, scheme: str, **options: str) -> str:
    """The test server's URL as a provider would hand it out: another scheme, libpq's options."""
    parsed = make_url(url)
    return parsed.set(drivername=scheme, query={**parsed.query, **options}).render_as_string(
        hide_password=False
    )


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
async def test_a_libpq_url_connects_with_its_options(database_url: str, scheme: str) -> None:
    url = _libpq(
        database_url,
        scheme,
        sslmode="prefer",
        connect_timeout="7",
        application_name="billing-report",
        options="-c statement_timeout=4321",
    )
    engine = create_engine(Settings(database_url=url), application_name="memstore-tests")
    try:
        async with engine.connect() as conn:
            shown = await conn.execute(
                text("SELECT current_setting('application_name'), current_setting('statement_timeout')")
            )
            assert tuple(shown.one()) == ("billing-report", "4321ms")
    finally:
        await engine.dispose()


async def test_tls_options_reach_the_driver(database_url: str) -> None:
    """asyncpg reads sslrootcert itself: a certificate that is not there fails, it is not ignored."""
    url = _libpq(database_url, "postgresql", sslmode="verify-full", sslrootcert="/nonexistent/root.crt")
    engine = create_engine(Settings(database_url=url), application_name="memstore-tests")
    try:
        with pytest.raises(FileNotFoundError):
            async with engine.connect():
                pass
    finally:
        await engine.dispose()


async def test_a_libpq_url_migrates_an_empty_database(servers: Servers) -> None:
    name = f"memstore_test_url_{uuid.uuid4().hex[:8]}"
    admin = await _admin_connect(servers)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        url = _libpq(servers.url_for(name), "postgres", sslmode="disable", connect_timeout="10")
        await asyncio.to_thread(upgrade, url)
        engine = create_engine(Settings(database_url=url), application_name="memstore-tests")
        try:
            async with engine.connect() as conn:
                version = await conn.scalar(text("SELECT version_num FROM alembic_version"))
        finally:
            await engine.dispose()
        assert version == head_revision()
    finally:
        admin = await _admin_connect(servers)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
