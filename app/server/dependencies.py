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
from litestar.di import NamedDependency, Provide
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.services import Caller, Principal
from app.embeddings import Embedder
from app.server.lifespan import app_services


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


def _service(name: str) -> Provide:
    def provide(state: State) -> Any:
        return getattr(app_services(state), name)

    return Provide(provide, sync_to_thread=False)


# The app's services a handler may name: `AppServices`' fields (and `embedder`, the caller's tenant's:
# `provide_embedder`). `reader` is None when no read model is configured.
SERVICES = (
    "settings",
    "engine",
    "sessionmaker",
    "searcher",
    "job_queue",
    "writers",
    "ingest_batcher",
    "reader",
    "key_events",
    "finished_chunks",
)


async def provide_embedder(
    state: State, caller: NamedDependency[Caller], db_session: NamedDependency[AsyncSession]
) -> Embedder:
    """The caller's tenant's embedder (`Searcher.tenant_embedder`), which its new and edited memories
    are embedded with."""
    return await app_services(state).searcher.tenant_embedder(db_session, caller.tenant_id)


DEPENDENCIES: dict[str, Provide] = {
    "db_session": Provide(provide_db_session),
    "caller": Provide(provide_caller, sync_to_thread=False),
    "embedder": Provide(provide_embedder),
    **{name: _service(name) for name in SERVICES},
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
