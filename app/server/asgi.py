"""`create_app()`: the one place the HTTP application is assembled."""

from __future__ import annotations

from litestar import Litestar
from litestar.middleware import DefineMiddleware

from app.config import Settings, get_settings
from app.domain.accounts.auth import PUBLIC_PATHS, ApiKeyAuthenticationMiddleware
from app.domain.accounts.controllers import ApiKeyController, TenantSettingsController
from app.domain.answer.controllers import AnswerController
from app.domain.audit.controllers import AuditController
from app.domain.console.controllers import ConsoleReadsController, console_router
from app.domain.history.controllers import AdminHistoryController
from app.domain.ingest.controllers import ChunkController
from app.domain.mcp.server import McpMount
from app.domain.mem0.controllers import mem0_paths, mem0_router
from app.domain.memories.controllers import MemoryController
from app.domain.pipeline.controllers import ChunkAdminController
from app.domain.provenance.controllers import ProvenanceController
from app.domain.reviews.controllers import ReviewController
from app.domain.search.controllers import SearchController
from app.domain.shadows.controllers import ShadowController
from app.domain.system.controllers import SystemController
from app.domain.transfer.controllers import TransferController
from app.domain.usage.controllers import UsageController
from app.domain.webhooks.controllers import WebhookController
from app.lib import tracing
from app.lib.errors import EXCEPTION_HANDLERS
from app.lib.logging import configure_logging
from app.lib.ratelimit import Limit
from app.lib.validation import TYPE_DECODERS, Moment, MomentSchemaPlugin
from app.server.dependencies import DEPENDENCIES, resolve_dependencies_in_order
from app.server.lifespan import app_services, services_lifespan
from app.server.middleware import (
    RateLimitGuard,
    RequestInputGuard,
    allow_every_method,
    methods_by_route,
    request_context_middleware,
    stamp_response,
)
from app.server.openapi import ExactStructSchemaPlugin, deployment_facts, openapi_config
from app.server.strict import StrictRequest

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
    UsageController,
    SearchController,
    ShadowController,
    ReviewController,
    AnswerController,
    ConsoleReadsController,
    TransferController,
    WebhookController,
    console_router(),
]


def create_app(settings: Settings | None = None, *, configure_logs: bool = True) -> Litestar:
    """Build the API for `settings` (default: from the environment)."""
    settings = settings or get_settings()
    default_limit = Limit(settings.rate_limit_per_s, settings.rate_limit_burst)
    if configure_logs:
        configure_logging(settings.log_level, settings.log_format, process="api")
    tracing.configure("api")  # off unless OTEL_TRACES_EXPORTER asks (app/lib/tracing.py)

    resolve_dependencies_in_order()
    allowed: dict[str, bytes] = {}  # filled once the routes exist
    facts = deployment_facts(settings)
    # The MCP server (docs/mcp.md): an ASGI mount, not a REST route, so not in the OpenAPI document.
    mcp = McpMount(facts, app_services)
    handlers = [*ROUTE_HANDLERS, mcp.route_handler]
    app = Litestar(
        # Mem0's paths only when asked for (MEMSTORE_MEM0_COMPAT, docs/mem0.md).
        route_handlers=[*handlers, mem0_router()] if settings.mem0_compat else handlers,
        lifespan=[services_lifespan(settings, default_limit), mcp.lifespan],
        dependencies=DEPENDENCIES,
        middleware=[
            *tracing.server_middleware(),  # the request's span, around everything else
            request_context_middleware,
            RequestInputGuard(settings.max_body_bytes),
            DefineMiddleware(ApiKeyAuthenticationMiddleware, exclude=PUBLIC_PATHS),
            RateLimitGuard(default_limit),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        type_decoders=TYPE_DECODERS,
        type_encoders={Moment: Moment.plain},
        plugins=[MomentSchemaPlugin(), ExactStructSchemaPlugin(facts)],
        request_class=StrictRequest,
        before_send=[stamp_response, allow_every_method(allowed)],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=openapi_config(),
        logging_config=None,
    )
    allowed.update(methods_by_route(app))
    if settings.mem0_compat:
        # Before routing: Mem0's trailing-slash paths go to the /mem0 routes.
        app.asgi_handler = mem0_paths(app.asgi_handler)
    return app
