"""What one API process builds when it starts and closes when it stops: `AppServices`.

Handlers never reach for these through `app.state`: each one is a named dependency
(`app.server.dependencies`), so a handler's signature says what it uses.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

from litestar import Litestar
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker, warn_if_bypassing_row_security
from app.domain.accounts.auth import KeyResolver
from app.domain.accounts.key_events import KeyEvents
from app.domain.answer.reader import ChatModel, reader_from_settings
from app.domain.ingest.batcher import IngestBatcher
from app.domain.pipeline.finished import FinishedChunks
from app.domain.search.services import Searcher
from app.embeddings import embedder_from_settings
from app.embeddings.base import Embedder
from app.lib import lexical
from app.lib.queue import JobQueue, create_redis
from app.lib.ratelimit import Limit, RateLimiter
from app.writers.registry import WriterRegistry


@dataclass(frozen=True)
class AppServices:
    """The API process's long-lived clients and caches, one of each."""

    settings: Settings
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    job_queue: JobQueue
    key_resolver: KeyResolver
    key_events: KeyEvents
    rate_limiter: RateLimiter
    writers: WriterRegistry
    searcher: Searcher
    reader: ChatModel | None
    ingest_batcher: IngestBatcher
    finished_chunks: FinishedChunks

    @classmethod
    async def start(cls, settings: Settings, default_limit: Limit) -> AppServices:
        if settings.redis_url is None:
            msg = "MEMSTORE_REDIS_URL is not set (run `memstore up` for the embedded stack)"
            raise RuntimeError(msg)
        engine = create_engine(settings, application_name="memstore-api")
        await warn_if_bypassing_row_security(engine)
        await asyncio.to_thread(lexical.load)  # before the first search: every query is analysed
        sessionmaker = create_sessionmaker(engine)
        queue = JobQueue(create_redis(settings.redis_url), wake=settings.worker_wake)
        key_resolver = KeyResolver(sessionmaker, settings.auth_cache_ttl_s, default_limit)
        key_events = KeyEvents(settings.redis_url, key_resolver)
        key_events.start()
        rate_limiter = RateLimiter(queue.redis)
        finished_chunks = FinishedChunks(settings.redis_url)
        finished_chunks.start()
        return cls(
            settings=settings,
            engine=engine,
            sessionmaker=sessionmaker,
            job_queue=queue,
            key_resolver=key_resolver,
            key_events=key_events,
            rate_limiter=rate_limiter,
            writers=WriterRegistry(settings),
            searcher=Searcher(settings, embedder_from_settings(settings)),
            reader=reader_from_settings(settings),
            ingest_batcher=IngestBatcher(
                sessionmaker,
                queue,
                max_chunks=settings.ingest_max_group,
                writers=settings.ingest_writers,
                max_pending=settings.ingest_max_pending,
                max_queued_per_scope=settings.max_queued_per_scope,
                max_queued_per_tenant=settings.max_queued_per_tenant,
                limiter=rate_limiter,
                user_limit=Limit(settings.user_rate_limit_per_s, settings.user_rate_limit_burst),
            ),
            finished_chunks=finished_chunks,
        )

    @property
    def embedder(self) -> Embedder:
        """The deployment's embedder (the searcher's default; a tenant may have its own)."""
        return self.searcher.embedder

    async def aclose(self) -> None:
        """In the reverse order of their use: accepted chunks are stored before the clients go."""
        await self.ingest_batcher.close()
        await self.key_events.aclose()
        await self.finished_chunks.aclose()
        await self.job_queue.close()
        assert self.searcher.embedders is not None
        await self.searcher.embedders.aclose()
        if self.reader is not None:
            await self.reader.aclose()
        await self.writers.aclose()
        await self.engine.dispose()


def services_lifespan(
    settings: Settings, default_limit: Limit
) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """The app's lifespan: its services on `app.state.services` while it runs."""

    @asynccontextmanager
    async def lifespan(application: Litestar) -> AsyncGenerator[None, None]:
        services = await AppServices.start(settings, default_limit)
        application.state.services = services
        # What start-up made (the app, its routes and schemas, the loaded modules) lives as long as the
        # process: out of the collector's generations, a full collection under load walks only what
        # requests made, instead of pausing every request in flight for all of it (the p99's tail).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await services.aclose()

    return lifespan


def app_services(state: object) -> AppServices:
    """The running app's services (`app.state.services`), for middleware, which has no injection."""
    services: AppServices = state.services  # type: ignore[attr-defined]
    return services
