"""Where the state lives: Postgres, Redis, the embedded stack's data directory, the pool."""

from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from app.config.database_url import postgres_target


class StorageSettings(BaseModel):
    database_url: str | None = Field(
        default=None,
        description="URL of Postgres with pgvector (postgresql://, postgres:// or postgresql+asyncpg://) "
        "the API and workers connect with, as the service role; unset = embedded.",
    )
    admin_database_url: str | None = Field(
        default=None,
        description="URL as the tables' owner, for migrations and operator commands (tenants, history, "
        "eval, reembed); unset = MEMSTORE_DATABASE_URL.",
    )
    redis_url: str | None = Field(
        default=None, description="Redis URL (redis://host:port/db or unix:///path); unset = embedded."
    )
    data_dir: Path = Field(
        default=Path(".memstore"), description="Directory of the embedded Postgres and Redis data."
    )
    db_pool_size: int = Field(default=10, description="Connections kept open per process.")
    db_max_overflow: int = Field(default=10, description="Extra connections allowed under burst.")
    db_connect_timeout_s: float = Field(default=5.0, description="Seconds to wait for a new DB connection.")
    db_keepalive_s: float = Field(
        default=10.0,
        ge=0,
        description="Seconds after which a DB connection whose peer stopped answering (a host lost, a "
        "link cut without a word) is dropped, by both ends: TCP keepalives and tcp_user_timeout on the "
        "service's sockets, and the same sent to Postgres as startup parameters (tcp_keepalives_idle, "
        "tcp_keepalives_interval, tcp_keepalives_count, tcp_user_timeout), so a lost worker's backends "
        "and advisory locks go in seconds, not hours. 0 = none (the system's defaults); a pooler that "
        "refuses unknown startup parameters (PgBouncer) needs those four in its "
        "ignore_startup_parameters, or 0.",
    )

    @field_validator("database_url", "admin_database_url")
    @classmethod
    def _postgres_url(cls, url: str | None) -> str | None:
        """Refuse at start-up a URL no engine could use (another database or driver, unknown options)."""
        if url is not None:
            postgres_target(url)
        return url

    @property
    def owner_database_url(self) -> str | None:
        """Where migrations and operator commands connect: as the tables' owner if configured apart."""
        return self.admin_database_url or self.database_url

    @property
    def embedded_database(self) -> bool:
        """True when no external Postgres is configured and the embedded one is used."""
        return self.database_url is None
