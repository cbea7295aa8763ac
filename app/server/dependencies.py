"""What a handler may ask for by name: the caller, a database session, and the app's services.

A handler declares each one it uses as a parameter (`caller: Caller`, `db_session: AsyncSession`,
`searcher: Searcher`, ...); nothing else reads `request.user` or `app.state`.

They are resolved one after the other (`resolve_dependencies_in_order`): each is a lookup, or the
opening of a session, which does no I/O until used. Litestar resolves a handler's dependencies
concurrently, one task each, which costs more than all of them together: with the four of
`POST /v1/chunks`, 15 % of the API's time per chunk under load (bench/ingest.py).

The session commits at the request boundary: after the handler returned (and before the response is
sent), or rolls back if it raised. Handlers and services never commit; work that must follow the
commit (a job, a cache eviction) goes in a response background task, which runs after it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from litestar import Request
from litestar._kwargs.cleanup import DependencyCleanupGroup
from litestar._kwargs.dependencies import resolve_dependency
from litestar._kwargs.kwargs_model import KwargsModel
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import Provide
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.accounts.key_events import KeyEvents
from app.domain.accounts.services import Caller, Principal
from app.domain.answer.reader import ChatModel
from app.domain.ingest.batcher import IngestBatcher
from app.domain.search.services import Searcher
from app.embeddings.base import Embedder
from app.lib.queue import JobQueue
from app.server.lifespan import AppServices, app_services
from app.writers.registry import WriterRegistry


async def provide_db_session(state: State) -> AsyncGenerator[AsyncSession, None]:
    """The request's session: committed after the handler returns, rolled back if it raised."""
    async with app_services(state).sessionmaker() as session:
        try:
            yield session
        except Exception:
            await session.rollback()
            raise
        else:
            await session.commit()


def provide_caller(request: Request[Principal, Any, Any]) -> Caller:
    """The authenticated key and this request's id (routes outside the key middleware have none)."""
    return Caller(request.user, request.state.get("request_id"))


def _services(state: State) -> AppServices:
    return app_services(state)


def provide_settings(state: State) -> Settings:
    return _services(state).settings


def provide_engine(state: State) -> AsyncEngine:
    return _services(state).engine


def provide_sessionmaker(state: State) -> async_sessionmaker[AsyncSession]:
    """For handlers that open their own transactions (the answer's search, then its model call)."""
    return _services(state).sessionmaker


def provide_searcher(state: State) -> Searcher:
    return _services(state).searcher


def provide_embedder(state: State) -> Embedder:
    """The configured embedder: the one new and edited memories are embedded with."""
    return _services(state).searcher.embedder


def provide_job_queue(state: State) -> JobQueue:
    return _services(state).job_queue


def provide_writers(state: State) -> WriterRegistry:
    return _services(state).writers


def provide_ingest_batcher(state: State) -> IngestBatcher:
    return _services(state).ingest_batcher


def provide_reader(state: State) -> ChatModel | None:
    """The read model (MEMSTORE_READER_*), None when none is configured."""
    return _services(state).reader


def provide_key_events(state: State) -> KeyEvents:
    return _services(state).key_events


DEPENDENCIES: dict[str, Provide] = {
    "db_session": Provide(provide_db_session),
    "caller": Provide(provide_caller, sync_to_thread=False),
    "settings": Provide(provide_settings, sync_to_thread=False),
    "engine": Provide(provide_engine, sync_to_thread=False),
    "sessionmaker": Provide(provide_sessionmaker, sync_to_thread=False),
    "searcher": Provide(provide_searcher, sync_to_thread=False),
    "embedder": Provide(provide_embedder, sync_to_thread=False),
    "job_queue": Provide(provide_job_queue, sync_to_thread=False),
    "writers": Provide(provide_writers, sync_to_thread=False),
    "ingest_batcher": Provide(provide_ingest_batcher, sync_to_thread=False),
    "reader": Provide(provide_reader, sync_to_thread=False),
    "key_events": Provide(provide_key_events, sync_to_thread=False),
}


async def _resolve_in_order(
    self: KwargsModel, connection: ASGIConnection[Any, Any, Any, Any], kwargs: dict[str, Any]
) -> DependencyCleanupGroup:
    """`KwargsModel.resolve_dependencies`, without a task per dependency: a batch (dependencies that
    need nothing of each other) is resolved in order; their cleanups are the same."""
    cleanup_group = DependencyCleanupGroup()
    for batch in self.dependency_batches:
        for dependency in batch:
            await resolve_dependency(dependency, connection, kwargs, cleanup_group)
    return cleanup_group


def resolve_dependencies_in_order() -> None:
    """Resolve handlers' dependencies one after the other (see the module's docstring)."""
    KwargsModel.resolve_dependencies = _resolve_in_order  # type: ignore[method-assign]
