"""Async Alembic environment.

The URL comes, in order, from a connection handed in by the caller (tests, `memstore migrate`),
the `sqlalchemy.url` option, or `MEMSTORE_DATABASE_URL`; it is read as the service reads it
(`app.db.engine`), so `postgresql://…?sslmode=require` migrates the database the service uses.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

import app.db.models  # noqa: F401  (registers every table)
from app.config import get_settings
from app.db.base import metadata
from app.db.engine import create_engine, postgres_target

config = context.config
target_metadata = metadata


def _url() -> str:
    # Migrations run as the tables' owner (MEMSTORE_ADMIN_DATABASE_URL), never as the service role.
    url = config.get_main_option("sqlalchemy.url") or get_settings().owner_database_url
    if not url:
        msg = "set MEMSTORE_DATABASE_URL (or run `memstore migrate`, which starts the embedded stack)"
        raise RuntimeError(msg)
    return url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        compare_server_default=False,
    )


def _run_sync(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    settings = get_settings().model_copy(update={"database_url": _url()})
    engine = create_engine(settings, application_name="memstore-migrate", pre_ping=False)
    async with engine.connect() as connection:
        await connection.run_sync(_run_sync)
    await engine.dispose()


def run_migrations_offline() -> None:
    """Emit SQL to stdout (`alembic upgrade head --sql`)."""
    context.configure(url=postgres_target(_url()).url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against a live database, reusing a connection the caller provides if there is one."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_sync(connection)
    else:
        asyncio.run(_run_async())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
