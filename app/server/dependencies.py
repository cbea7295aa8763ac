"""Per-request dependencies: one database session, committed at the request boundary.

Handlers and services never commit; the session commits after the handler returned (and before the
response is sent), or rolls back if it raised. Work that must follow the commit (a job, a cache
eviction) goes in a response background task, which runs after it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from litestar.datastructures import State
from sqlalchemy.ext.asyncio import AsyncSession


async def provide_db_session(state: State) -> AsyncGenerator[AsyncSession, None]:
    """The request's session: committed after the handler returns, rolled back if it raised."""
    async with state.sessionmaker() as session:
        try:
            yield session
        except Exception:
            await session.rollback()
            raise
        else:
            await session.commit()
