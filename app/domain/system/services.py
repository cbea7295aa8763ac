"""Readiness: can this process reach what it needs, and is the schema at the code's migration head?"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.migrate import head_revision
from app.lib.queue import JobQueue


@dataclass(frozen=True)
class Readiness:
    postgres: str
    migrations: str
    redis: str

    @property
    def ok(self) -> bool:
        return self.postgres == "ok" and self.migrations == "ok" and self.redis == "ok"


async def _schema_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        revision = await conn.scalar(text("SELECT version_num FROM alembic_version"))
    return None if revision is None else str(revision)


async def check_readiness(engine: AsyncEngine, queue: JobQueue, timeout_s: float = 2.0) -> Readiness:
    """Check Postgres, the migration head and Redis, each bounded by `timeout_s`."""
    postgres, migrations = "ok", "ok"
    try:
        async with asyncio.timeout(timeout_s):
            revision = await _schema_revision(engine)
        if revision != head_revision():
            migrations = f"at {revision}, expected {head_revision()}"
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        postgres, migrations = f"unreachable ({type(exc).__name__})", "unknown"
    redis = "ok" if await queue.ping() else "unreachable"
    return Readiness(postgres=postgres, migrations=migrations, redis=redis)
