"""The one way a process builds its database engine and sessions.

The engine connects where `MEMSTORE_DATABASE_URL` says, in whichever spelling it is given
(`app.config.database_url.postgres_target`, which the settings check it with too).
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import event, text
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.config.database_url import postgres_target
from app.db import tenancy
from app.lib import tracing

if TYPE_CHECKING:
    from collections.abc import Callable

    from app.config import Settings

log = structlog.get_logger(__name__)


def create_engine(
    settings: Settings,
    application_name: str,
    *,
    pre_ping: bool = True,
    overflow: bool = True,
) -> AsyncEngine:
    """An asyncpg engine tagged with `application_name`, so `pg_stat_activity` shows who is connected.

    `pre_ping` checks a connection that has been idle in the pool for `PING_AFTER_IDLE_S` or more as
    it leaves (one round trip, `;`), so one that died with a Postgres restart is replaced instead of
    failing a request. A connection in steady use is not checked: SQLAlchemy's own pre-ping costs three
    round trips on every checkout (BEGIN, `;`, ROLLBACK), a third of a group commit's. Should a
    connection die between two uses less than a second apart, the work on it fails (a group commit
    answers 503, nothing acknowledged) and the disconnect makes the pool replace every connection older
    than it. Workers go without: they borrow a connection several times per chunk, and a job that
    meets a dead one is retried.

    `overflow` allows `db_max_overflow` connections beyond the pool in a burst; each is opened and
    closed again, which costs Postgres a backend start and asyncpg's type introspection (~10 ms of
    server CPU). Workers, busy for long stretches, wait for a pooled connection instead.

    Both ends of every connection drop it `db_keepalive_s` after its peer went silent
    (`keepalive_settings`, `_keepalive`).
    """
    if settings.database_url is None:
        msg = "MEMSTORE_DATABASE_URL is not set (run `memstore up` for the embedded stack)"
        raise RuntimeError(msg)
    target = postgres_target(settings.database_url)
    connect_args = target.connect_args(application_name, settings.db_connect_timeout_s)
    if settings.db_keepalive_s > 0:  # the URL's own settings (`options`, …) win over ours
        server_side = keepalive_settings(settings.db_keepalive_s)
        connect_args["server_settings"] = server_side | connect_args["server_settings"]
    engine = create_async_engine(
        target.url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow if overflow else 0,
        pool_pre_ping=False,  # `_ping_if_idle` instead
        # A statement's bound values (memory text, key hashes) never appear in an error or a log line.
        hide_parameters=True,
        connect_args=connect_args,
    )
    # Each checkout carries the tenants of the work in progress to Postgres's row-level security.
    tenancy.install(engine)
    tracing.instrument_engine(engine)  # with tracing on: each statement a span of the trace it serves
    if settings.db_keepalive_s > 0:
        event.listen(engine.sync_engine, "connect", _keepalive(settings.db_keepalive_s))
    if pre_ping:  # after the tenants' listener: a connection it just used needs no ping
        event.listen(engine.sync_engine, "connect", _alive)
        event.listen(engine.sync_engine, "checkin", _alive)
        event.listen(engine.sync_engine, "checkout", _ping_if_idle)
    return engine


def keepalive_settings(keepalive_s: float) -> dict[str, str]:
    """Postgres's end of `MEMSTORE_DB_KEEPALIVE_S`, as startup parameters: a backend whose client went
    silent (its host lost, the link cut without a word) is ended about `keepalive_s` later, and its
    transaction and advisory locks with it, rather than after the system's two hours of TCP keepalive.
    Idle half of it, then probes a fifth of it apart, and `tcp_user_timeout` the whole of it, which also
    bounds data the client never acknowledges. (Postgres ignores them on a Unix socket.)"""
    idle, interval, user_timeout_ms = _keepalive_times(keepalive_s)
    return {
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": str(KEEPALIVE_PROBES),
        "tcp_user_timeout": str(user_timeout_ms),
    }


KEEPALIVE_PROBES = 3


def _keepalive_times(keepalive_s: float) -> tuple[int, int, int]:
    """Idle and probe interval (whole seconds, as TCP takes them) and the user timeout (ms)."""
    return max(1, int(keepalive_s / 2)), max(1, int(keepalive_s / 5)), int(keepalive_s * 1000)


def _keepalive(keepalive_s: float) -> Callable[[Any, Any], None]:
    """Connect event: the same keepalive on this end's socket, so a statement sent to a server that went
    silent fails (the connection is lost, a database outage) about `keepalive_s` later instead of
    waiting out TCP's retransmissions (a quarter of an hour), and an idle connection to it is found
    dead. A worker cut from Postgres learns so this way, and gives its turns back (`workers.wakeable`).
    Nothing to do on a Unix socket."""
    idle, interval, user_timeout_ms = _keepalive_times(keepalive_s)
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", user_timeout_ms),  # Linux
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))

    def set_options(_dbapi_connection: Any, record: Any) -> None:
        # asyncpg keeps its transport to itself; without one (another driver, a later asyncpg) the
        # system's defaults stand, as with `MEMSTORE_DB_KEEPALIVE_S=0`.
        transport = getattr(record.driver_connection, "_transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        for level, option, value in options:
            sock.setsockopt(level, option, value)

    return set_options


PING_AFTER_IDLE_S = 1.0


def _alive(_dbapi_connection: Any, record: Any) -> None:
    record.info[tenancy.ALIVE_AT] = time.monotonic()


def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """Checkout event: a round trip on a connection unused for `PING_AFTER_IDLE_S`; the pool replaces
    one that fails it (`DisconnectionError`), as it does for SQLAlchemy's pre-ping."""
    now = time.monotonic()
    if now - record.info.get(tenancy.ALIVE_AT, -math.inf) < PING_AFTER_IDLE_S:
        return
    try:
        dbapi_connection.run_async(lambda conn: conn.execute(";"))
    except Exception as exc:
        raise DisconnectionError(f"a pooled connection failed its ping: {exc}") from exc
    record.info[tenancy.ALIVE_AT] = now


async def why_unreachable(settings: Settings, application_name: str, timeout_s: float) -> str | None:
    """None if Postgres answers a new connection of its own (`SELECT 1`) within `timeout_s`, else what
    stopped it. The pool is left alone: its connections may all be busy, or dead without knowing it."""
    engine = create_engine(
        settings.model_copy(update={"db_pool_size": 1}), application_name, pre_ping=False, overflow=False
    )
    try:
        async with asyncio.timeout(timeout_s), engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, OSError) as exc:  # TimeoutError is an OSError
        return type(exc).__name__
    finally:
        await engine.dispose()
    return None


async def warn_if_bypassing_row_security(engine: AsyncEngine) -> None:
    """Log a warning when the service connects as the tables' owner: row-level security, the wall that
    holds when a query forgets its tenant, does not apply to it (see docs/security.md). Silent when the
    database cannot be asked yet; readiness reports that."""
    try:
        async with asyncio.timeout(5):
            bypassing = await tenancy.bypasses_row_security(engine)
    except (SQLAlchemyError, OSError, TimeoutError):
        return
    if bypassing:
        log.warning(
            "db.row_security_bypassed",
            detail="MEMSTORE_DATABASE_URL connects as the tables' owner; connect as the service role "
            "(memstore_service) and give the owner's URL as MEMSTORE_ADMIN_DATABASE_URL",
        )


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded objects usable after commit (responses are built after it)."""
    return async_sessionmaker(engine, expire_on_commit=False)
