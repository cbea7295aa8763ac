"""`create_app()`: the one place the HTTP application is assembled."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.di import Provide
from litestar.middleware import DefineMiddleware

from app.config import Settings, get_settings
from app.db.engine import create_engine, create_sessionmaker, warn_if_bypassing_row_security
from app.domain.accounts.auth import PUBLIC_PATHS, ApiKeyAuthenticationMiddleware, KeyResolver
from app.domain.accounts.controllers import ApiKeyController, TenantSettingsController
from app.domain.accounts.key_events import KeyEvents
from app.domain.answer.controllers import AnswerController
from app.domain.answer.reader import reader_from_settings
from app.domain.audit.controllers import AuditController
from app.domain.console.controllers import ConsoleReadsController, console_router
from app.domain.history.controllers import AdminHistoryController
from app.domain.ingest.batcher import IngestBatcher
from app.domain.ingest.controllers import ChunkController
from app.domain.mem0.controllers import mem0_paths, mem0_router
from app.domain.memories.controllers import MemoryController
from app.domain.pipeline.controllers import ChunkAdminController
from app.domain.provenance.controllers import ProvenanceController
from app.domain.reviews.controllers import ReviewController
from app.domain.search.controllers import SearchController
from app.domain.search.services import Searcher
from app.domain.shadows.controllers import ShadowController
from app.domain.system.controllers import SystemController
from app.domain.transfer.controllers import TransferController
from app.embeddings import embedder_from_settings
from app.lib.errors import EXCEPTION_HANDLERS
from app.lib.logging import configure_logging
from app.lib.queue import JobQueue, create_redis
from app.lib.ratelimit import Limit, RateLimiter
from app.lib.validation import TYPE_DECODERS, Moment, MomentSchemaPlugin
from app.server.dependencies import provide_db_session
from app.server.middleware import (
    RateLimitGuard,
    RequestInputGuard,
    request_context_middleware,
    stamp_response,
)
from app.server.openapi import openapi_config
from app.writers.registry import WriterRegistry

ROUTE_HANDLERS = [
    SystemController,
    ApiKeyController,
    TenantSettingsController,
    ChunkController,
    MemoryController,
    ProvenanceController,
    AdminHistoryController,
    ChunkAdminController,
    AuditController,
    SearchController,
    ShadowController,
    ReviewController,
    AnswerController,
    ConsoleReadsController,
    TransferController,
    console_router(),
]


def create_app(settings: Settings | None = None, *, configure_logs: bool = True) -> Litestar:
    """Build the API for `settings` (default: from the environment)."""
    settings = settings or get_settings()
    default_limit = Limit(settings.rate_limit_per_s, settings.rate_limit_burst)
    if configure_logs:
        configure_logging(settings.log_level, settings.log_format, process="api")

    @asynccontextmanager
    async def lifespan(application: Litestar) -> AsyncGenerator[None, None]:
        engine = create_engine(settings, application_name="memstore-api")
        await warn_if_bypassing_row_security(engine)
        sessionmaker = create_sessionmaker(engine)
        if settings.redis_url is None:
            msg = "MEMSTORE_REDIS_URL is not set (run `memstore up` for the embedded stack)"
            raise RuntimeError(msg)
        queue = JobQueue(create_redis(settings.redis_url), wake=settings.worker_wake)
        key_resolver = KeyResolver(sessionmaker, settings.auth_cache_ttl_s, default_limit)
        key_events = KeyEvents(settings.redis_url, key_resolver)
        key_events.start()
        application.state.update(
            settings=settings,
            engine=engine,
            sessionmaker=sessionmaker,
            job_queue=queue,
            key_resolver=key_resolver,
            key_events=key_events,
            rate_limiter=RateLimiter(queue.redis),
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
            ),
        )
        try:
            yield
        finally:
            await application.state.ingest_batcher.close()
            await key_events.aclose()
            await queue.close()
            await application.state.searcher.embedder.aclose()
            if application.state.reader is not None:
                await application.state.reader.aclose()
            await application.state.writers.aclose()
            await engine.dispose()

    app = Litestar(
        # Mem0's paths only when asked for (MEMSTORE_MEM0_COMPAT, docs/mem0.md).
        route_handlers=[*ROUTE_HANDLERS, mem0_router()] if settings.mem0_compat else ROUTE_HANDLERS,
        lifespan=[lifespan],
        dependencies={
            "db_session": Provide(provide_db_session),
        },
        middleware=[
            request_context_middleware,
            RequestInputGuard(settings.max_body_bytes),
            DefineMiddleware(ApiKeyAuthenticationMiddleware, exclude=PUBLIC_PATHS),
            RateLimitGuard(default_limit),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        type_decoders=TYPE_DECODERS,
        type_encoders={Moment: Moment.plain},
        plugins=[MomentSchemaPlugin()],
        before_send=[stamp_response],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=openapi_config(),
        logging_config=None,
    )
    if settings.mem0_compat:
        # Before routing: Mem0's trailing-slash paths go to the /mem0 routes.
        app.asgi_handler = mem0_paths(app.asgi_handler)
    return app
