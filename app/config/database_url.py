"""A Postgres URL in any usual spelling, read into what SQLAlchemy and asyncpg take.

`MEMSTORE_DATABASE_URL` may be spelt as libpq and managed providers spell it (`postgresql://` or
`postgres://`, with `?sslmode=`, `sslrootcert`, `connect_timeout`, `application_name`, `options`,
`host=/socket/dir`) or as SQLAlchemy does (`postgresql+asyncpg://`, with asyncpg's own `?ssl=`).
`postgres_target` reads every spelling; the settings (to refuse at start-up a URL no engine could
use), every engine (`app.db.engine`) and Alembic go through it, so a URL that works for one works
for all. It lives with the settings, which the database plumbing reads, and imports nothing of it.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

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
