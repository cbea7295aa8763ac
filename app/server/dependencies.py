"""Per-request dependencies: one database session, committed at the request boundary, and a buffer of
jobs that are enqueued only after that commit succeeded (never from a transaction that may roll back).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import structlog
from litestar.datastructures import State
from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from app.lib.queue import JobQueue

log = structlog.get_logger(__name__)


@dataclass
class JobBuffer:
    """Jobs a request wants run; flushed by `provide_db_session` once the transaction committed."""

    jobs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def add(self, function: str, **kwargs: Any) -> None:
        self.jobs.append((function, kwargs))


async def provide_job_buffer() -> JobBuffer:
    return JobBuffer()


async def provide_db_session(
    state: State, job_buffer: NamedDependency[JobBuffer]
) -> AsyncGenerator[AsyncSession, None]:
    """The request's session: committed after the handler returns, rolled back if it raised."""
    async with state.sessionmaker() as session:
        try:
            yield session
        except Exception:
            await session.rollback()
            raise
        else:
            await session.commit()
    if job_buffer.jobs:
        queue: JobQueue = state.job_queue
        await queue.enqueue_many(job_buffer.jobs)
