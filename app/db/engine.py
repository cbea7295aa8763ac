"""The one way a process builds its database engine and sessions."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.config import Settings


def create_engine(
    settings: Settings,
    application_name: str,
    *,
    pre_ping: bool = True,
    overflow: bool = True,
) -> AsyncEngine:
    """An asyncpg engine tagged with `application_name`, so `pg_stat_activity` shows who is connected.

    `pre_ping` checks each connection as it leaves the pool (a round trip), so one that died with a
    Postgres restart is replaced instead of failing a request. Workers go without: they borrow a
    connection several times per chunk, and a job that meets a dead one is retried, the disconnect
    having made the pool replace every connection older than it.

    `overflow` allows `db_max_overflow` connections beyond the pool in a burst; each is opened and
    closed again, which costs Postgres a backend start and asyncpg's type introspection (~10 ms of
    server CPU). Workers, busy for long stretches, wait for a pooled connection instead.
    """
    if settings.database_url is None:
        msg = "MEMSTORE_DATABASE_URL is not set (run `memstore up` for the embedded stack)"
        raise RuntimeError(msg)
    return create_async_engine(
        settings.database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow if overflow else 0,
        pool_pre_ping=pre_ping,
        connect_args={
            "server_settings": {"application_name": application_name},
            "timeout": settings.db_connect_timeout_s,
        },
    )


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded objects usable after commit (responses are built after it)."""
    return async_sessionmaker(engine, expire_on_commit=False)
