"""Traces (OpenTelemetry): one trace per chunk, from `POST /v1/chunks` to its changeset.

Off unless `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, or `console` to read spans on stderr);
then the SDK is set up from the standard variables it reads itself (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*` ...). Off, every helper here is one
test of a module flag: no span object is made, no context is touched, nothing is stored.

How a chunk's trace crosses processes: the API stores the W3C `traceparent` of the request's span on
the chunk's row (`chunks.trace_parent`), and the worker that takes the chunk up continues that trace
(`continued`), however much later and on whatever machine. Work that is about a chunk without being
its processing (a shadow writer's run of it) starts a trace of its own linked to the chunk's.

Names follow the conventions: the writer's model call is a GenAI client span (`chat {model}`, with
`gen_ai.*` model, token and finish-reason attributes), the embedder's runs are `embeddings` spans, and
the memory operations are named by the GenAI memory conventions (`search_memory`, `update_memory`,
`delete_memory`) with `gen_ai.memory.store.id` (the tenant) and `gen_ai.memory.record.id`. Content
(messages, memories, queries) goes on spans only when `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`
is true, the variable the GenAI instrumentations read. Postgres, Redis and outgoing HTTP spans come
from the maintained instrumentations (SQLAlchemy, redis-py, aiohttp), the HTTP server's from Litestar's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import structlog

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanKind, Tracer
    from sqlalchemy.ext.asyncio import AsyncEngine

log = structlog.get_logger(__name__)

# Set once per process by `configure`; read on hot paths.
ENABLED = False
CAPTURE_CONTENT = False
_tracer: Tracer | None = None
_clients: TracerProvider | None = None  # the client libraries' spans (`_instrument_clients`)
_EXPORTERS = ("otlp", "console")
_TRUE = ("1", "true", "yes", "on")

# A value attributes may not hold: the SDK drops None, so helpers leave such keys out.
Attributes = Mapping[str, Any]


def wanted() -> bool:
    """Whether the environment asks for traces (`OTEL_TRACES_EXPORTER` names an exporter)."""
    names = {name.strip().lower() for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    return bool(names & set(_EXPORTERS))


def configure(service: str) -> bool:
    """Set up tracing for this process (`service`: `api`, `worker`, ...) if the environment asks for
    it; True when on. Idempotent; the providers flush at exit."""
    global ENABLED, CAPTURE_CONTENT, _tracer, _clients  # noqa: PLW0603  (set once, at start-up)
    if ENABLED or not wanted():
        return ENABLED
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    attributes: dict[str, str] = {"service.namespace": "memstore", "memstore.process": service}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = f"memstore-{service}"
    resource = Resource.create(attributes)
    names = {name.strip().lower() for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")}

    def exporting(provider: TracerProvider) -> TracerProvider:
        if "otlp" in names:
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
        if "console" in names:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        return provider

    # Memstore's own spans: the sampler from OTEL_TRACES_SAMPLER (parent-based, always on by default).
    trace.set_tracer_provider(exporting(TracerProvider(resource=resource)))
    # The client libraries' spans only inside a trace already sampled: the workers' polls of Redis and
    # the sweeper's statements would otherwise each be a trace of one span.
    _clients = exporting(TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_OFF)))
    _instrument_clients(_clients)
    _tracer = trace.get_tracer("memstore")
    CAPTURE_CONTENT = (
        os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower() in _TRUE
    )
    ENABLED = True
    log.info(
        "tracing.on", service=service, exporters=sorted(names & set(_EXPORTERS)), content=CAPTURE_CONTENT
    )
    return True


def _otlp_exporter() -> SpanExporter:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            msg = (
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc installed; "
                "or use http/protobuf (the default, installed with Memstore)"
            )
            raise RuntimeError(msg) from exc
        return OTLPSpanExporter()  # type: ignore[no-any-return]
    if protocol != "http/protobuf":
        msg = f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported: use http/protobuf or grpc"
        raise RuntimeError(msg)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter()


def _instrument_clients(provider: TracerProvider) -> None:
    """Redis and outgoing HTTP (the writer's and the embedder's model servers, which get the
    `traceparent` too) as spans of whatever is current; Postgres per engine (`instrument_engine`)."""
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    RedisInstrumentor().instrument(tracer_provider=provider)
    AioHttpClientInstrumentor().instrument(tracer_provider=provider)


def instrument_engine(engine: AsyncEngine) -> None:
    """Every statement `engine` sends as a span of whatever is current (the SQLAlchemy
    instrumentation's listeners on this engine; statement text only, never its values)."""
    if not ENABLED:
        return
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
    from opentelemetry.metrics import get_meter

    assert _clients is not None
    tracer = _clients.get_tracer("opentelemetry.instrumentation.sqlalchemy")
    usage = get_meter("memstore").create_up_down_counter("db.client.connections.usage")
    EngineTracer(tracer, engine.sync_engine, usage)  # type: ignore[no-untyped-call]


def server_middleware() -> list[Any]:
    """The HTTP server's span for each request (Litestar's OpenTelemetry middleware): it continues a
    client's `traceparent`. Empty when tracing is off, so the app has no extra layer."""
    if not ENABLED:
        return []
    from litestar.plugins.opentelemetry import OpenTelemetryConfig

    config = OpenTelemetryConfig(
        exclude=["^/metrics", "^/health", "^/ready"], exclude_spans=["receive", "send"]
    )
    return [config.middleware]


# --- spans ---------------------------------------------------------------------------------------


def _kind(name: str) -> SpanKind:
    from opentelemetry.trace import SpanKind

    return SpanKind[name]


@contextlib.contextmanager
def _span(
    name: str,
    kind: str,
    attributes: Attributes,
    context: Context | None,
    links: Sequence[Any],
    start_ns: int | None,
) -> Iterator[Span]:
    assert _tracer is not None
    with _tracer.start_as_current_span(
        name,
        context=context,
        kind=_kind(kind),
        attributes=_clean(attributes),
        links=links,
        start_time=start_ns or None,
        record_exception=False,  # `fail` records it, once, where it is known to be a failure
    ) as span:
        yield span


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    kind: str = "INTERNAL",
    context: Context | None = None,
    links: Sequence[Any] = (),
    start_ns: int | None = None,
) -> contextlib.AbstractContextManager[Span | None]:
    """A span around a block, current inside it (None when tracing is off: test before setting
    attributes). `kind` names a `SpanKind` member; `context` a parent other than the current span;
    `start_ns` a start earlier than now (`now_ns`), for work begun before its trace was known."""
    if not ENABLED:
        return contextlib.nullcontext()
    return _span(name, kind, attributes or {}, context, links, start_ns)


def record(
    name: str,
    started_ns: int,
    attributes: Attributes | None = None,
    *,
    ended_ns: int | None = None,
    context: Context | None = None,
) -> None:
    """A span already over (from `started_ns`, a `time.time_ns()`, to now or `ended_ns`): for a piece
    of work shared by many traces, such as the group commit, recorded in each afterwards."""
    if not ENABLED:
        return
    assert _tracer is not None
    done = _tracer.start_span(
        name, context=context, attributes=_clean(attributes or {}), start_time=started_ns
    )
    done.end(end_time=ended_ns or time.time_ns())


def now_ns() -> int:
    """The clock `record` takes (0 when off, so callers pay nothing for it)."""
    return time.time_ns() if ENABLED else 0


def set_attributes(attributes: Attributes) -> None:
    """Attributes on the current span, if tracing is on and a span is recording."""
    if not ENABLED:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(_clean(attributes))


def add_event(name: str, attributes: Attributes | None = None) -> None:
    """An event on the current span (a guard that fired, a retry)."""
    if not ENABLED:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(name, _clean(attributes or {}))


def fail(span: Span | None, exc: BaseException | str) -> None:
    """Mark `span` as failed (an exception, or a reason)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    if isinstance(exc, BaseException):
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:300]))
    else:
        span.set_status(Status(StatusCode.ERROR, exc[:300]))


def fail_current(reason: str) -> None:
    """Mark the current span as failed (a chunk's failed attempt: the writer's error)."""
    if not ENABLED:
        return
    from opentelemetry import trace

    fail(trace.get_current_span(), reason)


P = ParamSpec("P")
R = TypeVar("R")
# The arguments that name the store and the record an operation is about.
_STORE_ARGUMENT = "tenant_id"
_RECORD_ARGUMENTS = ("memory_id", "changeset_id", "review_id")


def operation(
    name: str, *, memory_operation: str | None = None
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """A span around each call of an async service function (`name`; `memory_operation`: its
    `gen_ai.operation.name` in the GenAI memory conventions, e.g. `search_memory`), with the tenant as
    `gen_ai.memory.store.id` and the memory, changeset or review it names as `gen_ai.memory.record.id`
    (read from the call's arguments of those names). Off, the call goes straight through."""

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        signature = inspect.signature(function)

        @functools.wraps(function)
        async def traced(*args: P.args, **kwargs: P.kwargs) -> R:
            if not ENABLED:
                return await function(*args, **kwargs)
            arguments = signature.bind_partial(*args, **kwargs).arguments
            record = next((arguments[a] for a in _RECORD_ARGUMENTS if arguments.get(a) is not None), None)
            attributes = {
                "gen_ai.operation.name": memory_operation,
                "gen_ai.memory.store.id": _text(arguments.get(_STORE_ARGUMENT)),
                "gen_ai.memory.record.id": _text(record),
            }
            with span(name, attributes) as current:
                try:
                    result = await function(*args, **kwargs)
                except Exception as exc:
                    fail(current, exc)
                    raise
                if current is not None and isinstance(result, list):
                    current.set_attribute("gen_ai.memory.record.count", len(result))
                return result

        return traced

    return decorate


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _clean(attributes: Attributes) -> dict[str, Any]:
    return {key: value for key, value in attributes.items() if value is not None}


# --- across processes ------------------------------------------------------------------------------


def current_context() -> Context | None:
    """The current context, to record spans under it later (`record`); None when off."""
    if not ENABLED:
        return None
    from opentelemetry import context

    return context.get_current()


def current_ids() -> dict[str, str]:
    """The current span's trace and span ids, in hex, for a log line; empty outside any trace."""
    from opentelemetry import trace

    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return {}
    return {"trace_id": f"{span_context.trace_id:032x}", "span_id": f"{span_context.span_id:016x}"}


def traceparent(context: Context | None = None) -> str | None:
    """The W3C `traceparent` of the current span (or of `context`'s), to store with a chunk; None when
    tracing is off or nothing is being traced."""
    if not ENABLED:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=context)
    return carrier.get("traceparent")


def continued(stored: str | None) -> Context | None:
    """The context a stored `traceparent` names, to parent a chunk's processing under; None when off
    or when there is none (the processing then starts a trace of its own)."""
    if not ENABLED or not stored:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": stored})


def link_to(stored: str | None) -> list[Any]:
    """A link to the trace a stored `traceparent` names (for work about a chunk that is not its
    processing: a shadow writer's run, a replay); empty when off or none."""
    if not ENABLED or not stored:
        return []
    from opentelemetry import trace
    from opentelemetry.trace import Link

    parent = continued(stored)
    span_context = trace.get_current_span(parent).get_span_context()
    return [Link(span_context)] if span_context.is_valid else []
