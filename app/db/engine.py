"""The one way a process builds its database engine and sessions.

`MEMSTORE_DATABASE_URL` may be spelt as libpq and managed providers spell it (`postgresql://` or
`postgres://`, with `?sslmode=`, `sslrootcert`, `connect_timeout`, `application_name`, `options`,
`host=/socket/dir`) or as SQLAlchemy does (`postgresql+asyncpg://`, with asyncpg's own `?ssl=`).
`postgres_target` reads every spelling into what SQLAlchemy and asyncpg take; the settings, every
engine and Alembic go through it, so a URL that works for one works for all.
"""

from __future__ import annotations

import asyncio
import math
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.db import tenancy
from app.lib import tracing

if TYPE_CHECKING:
    from app.config import Settings

log = structlog.get_logger(__name__)

_SCHEMES = ("postgresql", "postgres", "postgresql+asyncpg")
# libpq options that asyncpg reads only from a DSN (it builds the TLS context from them itself).
_DSN_OPTIONS = frozenset(
    {
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "service",
        "dbname",
    }
)
# libpq startup parameters, which asyncpg sends as `server_settings`.
_SERVER_SETTINGS = frozenset({"application_name", "options"})
# Options SQLAlchemy's asyncpg dialect hands to `asyncpg.connect` under the same name.
_ASYNCPG_OPTIONS = frozenset(
    {
        "host",
        "port",
        "user",
        "password",
        "passfile",
        "ssl",
        "direct_tls",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
        "command_timeout",
        "statement_cache_size",
        "max_cached_statement_lifetime",
        "max_cacheable_statement_size",
        "prepared_statement_cache_size",
    }
)
# libpq options asyncpg cannot honour: harmless unless the URL insists on them.
_OPTIONAL_FEATURES = {"channel_binding": "channel binding", "gssencmode": "GSSAPI encryption"}


@dataclass(frozen=True)
class PostgresTarget:
    """Where and how to connect, in the form SQLAlchemy's asyncpg dialect and asyncpg take it."""

    url: URL  # postgresql+asyncpg://…, its query holding only options asyncpg takes by name
    dsn_options: dict[str, str] = field(default_factory=dict)
    server_settings: dict[str, str] = field(default_factory=dict)
    connect_timeout_s: float | None = None

    def connect_args(self, application_name: str, connect_timeout_s: float) -> dict[str, Any]:
        """`asyncpg.connect` keywords; the URL's own application name and timeout win over ours."""
        args: dict[str, Any] = {
            "server_settings": {"application_name": application_name, **self.server_settings},
            "timeout": self.connect_timeout_s or connect_timeout_s,
        }
        if self.dsn_options:
            # Host, user and database come from the URL as keywords; asyncpg takes the rest from here.
            args["dsn"] = "postgresql://?" + urllib.parse.urlencode(self.dsn_options)
        return args


def postgres_target(database_url: str) -> PostgresTarget:
    """Read a Postgres URL in any usual spelling; ValueError names what cannot be used."""
    try:
        url = make_url(database_url)
    except ArgumentError as exc:
        msg = f"MEMSTORE_DATABASE_URL is not a URL: {exc}"
        raise ValueError(msg) from exc
    if url.drivername not in _SCHEMES:
        msg = (
            f"MEMSTORE_DATABASE_URL must be a PostgreSQL URL (postgresql://, postgres:// or "
            f"postgresql+asyncpg://), not {url.drivername}://; Memstore connects through asyncpg"
        )
        raise ValueError(msg)
    kept: dict[str, str | tuple[str, ...]] = {}
    dsn_options: dict[str, str] = {}
    server_settings: dict[str, str] = {}
    timeout_s: float | None = None
    for name, value in url.query.items():
        last = value if isinstance(value, str) else value[-1]
        if name in _ASYNCPG_OPTIONS:
            kept[name] = value  # `host` may repeat (several hosts)
        elif name in _DSN_OPTIONS:
            dsn_options[name] = last
        elif name in _SERVER_SETTINGS:
            server_settings[name] = last
        elif name == "connect_timeout":
            timeout_s = _seconds(last)
        elif name in _OPTIONAL_FEATURES:
            if last not in ("disable", "allow", "prefer"):
                msg = (
                    f"MEMSTORE_DATABASE_URL asks for {name}={last}; asyncpg has no {_OPTIONAL_FEATURES[name]}"
                )
                raise ValueError(msg)
        else:
            msg = f"MEMSTORE_DATABASE_URL has an option asyncpg does not know: {name}"
            raise ValueError(msg)
    if "ssl" in kept and "sslmode" in dsn_options:
        msg = "MEMSTORE_DATABASE_URL has both ssl and sslmode; keep one"
        raise ValueError(msg)
    return PostgresTarget(
        url.set(drivername="postgresql+asyncpg", query=kept),
        dsn_options,
        server_settings,
        timeout_s,
    )


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        msg = f"MEMSTORE_DATABASE_URL has connect_timeout={value}; give a number of seconds above 0"
        raise ValueError(msg)
    return seconds


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
    """
    if settings.database_url is None:
        msg = "MEMSTORE_DATABASE_URL is not set (run `memstore up` for the embedded stack)"
        raise RuntimeError(msg)
    target = postgres_target(settings.database_url)
    engine = create_async_engine(
        target.url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow if overflow else 0,
        pool_pre_ping=False,  # `_ping_if_idle` instead
        # A statement's bound values (memory text, key hashes) never appear in an error or a log line.
        hide_parameters=True,
        connect_args=target.connect_args(application_name, settings.db_connect_timeout_s),
    )
    # Each checkout carries the tenants of the work in progress to Postgres's row-level security.
    tenancy.install(engine)
    tracing.instrument_engine(engine)  # with tracing on: each statement a span of the trace it serves
    if pre_ping:  # after the tenants' listener: a connection it just used needs no ping
        event.listen(engine.sync_engine, "connect", _alive)
        event.listen(engine.sync_engine, "checkin", _alive)
        event.listen(engine.sync_engine, "checkout", _ping_if_idle)
    return engine


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
