"""An OTLP/HTTP trace receiver for tests and benchmarks: what the processes under test export, as
plain spans.

It decodes `POST /v1/traces` (protobuf, as the SDK's exporter sends it) with the OpenTelemetry
protocol's own message types, so a span that reaches it went through the real exporter and wire."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.live import free_port
from tests.support.waiting import wait_for

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: str
    service: str
    attributes: dict[str, Any]
    links: list[str]  # the trace ids linked to
    status: int  # 0 unset, 1 ok, 2 error
    events: list[str] = field(default_factory=list)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class OtlpReceiver:
    """`async with OtlpReceiver() as otlp:` serves on `otlp.endpoint` (OTEL_EXPORTER_OTLP_ENDPOINT)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            service=str(resource.get("service.name")),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=[link.trace_id.hex() for link in span.links],
                            status=span.status.code,
                            events=[event.name for event in span.events],
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.trace_id == trace_id]

    async def wait_for(self, trace_id: str, names: set[str], timeout_s: float = 30) -> list[ReceivedSpan]:
        """The trace's spans once it holds a span of each name (or whatever it holds at the timeout)."""
        with contextlib.suppress(AssertionError):  # the caller asserts on what the trace holds
            await wait_for(
                lambda: {span.name for span in self.trace(trace_id)},
                lambda seen: names <= seen,
                timeout_s=timeout_s,
                what=f"spans {sorted(names)} of trace {trace_id}",
                interval_s=0.1,
            )
        return self.trace(trace_id)

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as receiver:
        yield receiver


async def _serve() -> None:
    """A sink for benchmarks: it answers as a collector does and counts what it got, decoding nothing
    (a collector runs elsewhere; its work must not be counted as tracing's cost on the machine
    measured)."""
    received = {"requests": 0, "bytes": 0}

    async def traces(request: web.Request) -> web.Response:
        received["requests"] += 1
        received["bytes"] += len(await request.read())
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"PORT {port}", flush=True)
    while True:
        await asyncio.sleep(10)  # a report every 10 s, for as long as it runs: time itself
        print(f"RECEIVED {received}", flush=True)


if __name__ == "__main__":
    # `python -m tests.support.otlp` prints `PORT <n>` and takes traces until killed (bench/ uses it as
    # the collector when it measures tracing's cost).
    asyncio.run(_serve())
