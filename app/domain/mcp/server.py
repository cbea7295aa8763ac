"""`/mcp`: the MCP server (streamable HTTP, stateless, JSON answers) behind the API's own key middleware.

A request to /mcp passes the same middleware as a REST request — its key resolved to a principal (401
`unauthorized` without one), its rate charged, its body checked — and reaches the MCP SDK's session
manager with the caller in a context variable (`_CALL`). Stateless mode serves each HTTP request on
its own, in a task started from the request's task, so the tools see that request's caller and never
another's: no MCP session outlives the request, and none is shared between keys.

A tool's refusal or failure is an MCP tool error (`isError`) whose structured content is the REST
error body, `{"error": {"code", "message", "details"}}`, built by the API's own exception handlers
(`app.lib.errors.EXCEPTION_HANDLERS`), so an agent reads the same `code` a REST client would.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from typing import Any

import msgspec
import structlog
from litestar import Litestar
from litestar.handlers import ASGIRouteHandler, asgi
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from app.domain.accounts.services import Caller, Principal
from app.domain.mcp.schemas import tool_input_schema
from app.domain.mcp.tools import (
    TOOLS,
    USER_MEMORIES_TEMPLATE,
    McpCall,
    McpServices,
    read_user_memories,
    user_of_memories_uri,
)
from app.lib.errors import EXCEPTION_HANDLERS, InvalidField, Unauthorized
from app.lib.validation import Moment, encode_moment, parse_moment

log = structlog.get_logger(__name__)

MCP_PATH = "/mcp"
SERVER_NAME = "memstore"
INSTRUCTIONS = (
    "Memstore keeps versioned memories of each user (user_id), written asynchronously from the "
    "conversations stored with add_memory. Read them with search_memories, get_memories and get_memory; "
    "explain_memory and memory_history say where a memory came from. A refused call's error names the "
    "REST error code (forbidden: the API key lacks the role)."
)

# The caller of the HTTP request being served (set by the mount, read by the handlers).
_CALL: ContextVar[McpCall | None] = ContextVar("memstore_mcp_call", default=None)


def error_body(exc: BaseException) -> dict[str, Any]:
    """The REST error body the API would answer for `exc` (its handlers, by the exception's class)."""
    for kind in type(exc).__mro__:
        handler = EXCEPTION_HANDLERS.get(kind)
        if handler is not None:
            body: dict[str, Any] = handler(None, exc).content  # the handlers read nothing of the request
            return body
    raise exc  # not an Exception (a cancellation): not an answer of the tool's


def _decode_hook(kind: type, value: Any) -> Any:
    """Times as the routes decode them (`TYPE_DECODERS`: a `Moment` is RFC 3339 with a zone)."""
    if kind is Moment:
        return parse_moment(value)
    msg = f"cannot decode {kind.__name__}"
    raise NotImplementedError(msg)


def decode_arguments(args: type[msgspec.Struct], arguments: Mapping[str, Any]) -> Any:
    """A tool's arguments by the route's own struct; a mismatch is the route's 422 (`validation_error`)."""
    try:
        return msgspec.convert(dict(arguments), args, dec_hook=_decode_hook)
    except msgspec.ValidationError as exc:
        reason = str(exc)
        field = reason.rpartition(" - at `$.")[2].rstrip("`") if " - at `$." in reason else None
        details = {"reason": reason} | ({"field": field} if field else {})
        raise InvalidField("The arguments do not match the tool's schema.", details=details) from exc


def _json(value: Any) -> Any:
    return msgspec.to_builtins(value, enc_hook=encode_moment)


def _text(data: Any) -> list[types.TextContent]:
    return [types.TextContent(type="text", text=msgspec.json.encode(data).decode())]


def _current_call() -> McpCall:
    call = _CALL.get()
    if call is None:  # only the mount serves the SDK, and it always sets the caller first
        raise Unauthorized("A valid API key is required (Authorization: Bearer <key>).")
    return call


def build_server(facts: Mapping[str, Mapping[str, Any]]) -> Server[Any]:
    """The MCP server of one app: the seven tools, with the deployment's `facts` (its writers, the
    largest `top_k`) in their input schemas, and the resource template of a user's memories."""
    listed = [
        types.Tool(
            name=tool.name,
            description=tool.description,
            input_schema=tool_input_schema(tool.args, facts),
            annotations=types.ToolAnnotations(
                read_only_hint=tool.read_only,
                destructive_hint=tool.destructive,
                idempotent_hint=tool.read_only,
                open_world_hint=False,
            ),
        )
        for tool in TOOLS.values()
    ]

    async def list_tools(
        _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        _ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = TOOLS.get(params.name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        try:
            call = _current_call()
            await tool.authorize(call.caller)  # before the arguments, as a route's guards run first
            result = await tool.run(call, decode_arguments(tool.args, params.arguments or {}))
        except Exception as exc:  # noqa: BLE001  (every fault is answered, as the REST handlers answer it)
            body = error_body(exc)
            log.info("mcp.tool_refused", tool=tool.name, code=body["error"]["code"])
            return types.CallToolResult(content=_text(body), structured_content=body, is_error=True)
        data = _json(result)
        log.info("mcp.tool_called", tool=tool.name)
        return types.CallToolResult(content=_text(data), structured_content=data)

    async def list_resources(
        _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])  # users are named by the agent, not enumerated

    async def list_resource_templates(
        _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            name="user_memories",
            uri_template=USER_MEMORIES_TEMPLATE,
            description="A user's active memories, oldest first (the first page of get_memories). "
            "Needs the `read` role.",
            mime_type="application/json",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def read_resource(
        _ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        user_id = user_of_memories_uri(str(params.uri))
        if user_id is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown resource: {params.uri}")
        try:
            memories = await read_user_memories(_current_call(), user_id)
        except Exception as exc:
            body = error_body(exc)
            raise MCPError(types.INVALID_REQUEST, body["error"]["message"], data=body) from exc
        text = msgspec.json.encode(_json(memories)).decode()
        contents = types.TextResourceContents(uri=str(params.uri), mime_type="application/json", text=text)
        return types.ReadResourceResult(contents=[contents])

    return Server(
        SERVER_NAME,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
    )


class McpMount:
    """The MCP server of one app, mounted at `/mcp`: its route handler and the lifespan of its session
    manager (which holds the task group that serves requests; one per start of the app)."""

    def __init__(
        self, facts: Mapping[str, Mapping[str, Any]], services_of: Callable[[Any], McpServices]
    ) -> None:
        self.server = build_server(facts)
        self.services_of = services_of  # the running app's services, from its state
        self.manager: StreamableHTTPSessionManager | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()
        self._stop_event = asyncio.Event()
        self.route_handler: ASGIRouteHandler = asgi(MCP_PATH, copy_scope=True)(self._serve)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Litestar) -> AsyncIterator[None]:
        """The app's lifespan: the session manager starts with the first /mcp request (an app that
        serves none pays nothing for it) and stops with the app."""
        try:
            yield
        finally:
            await self._stop()

    async def _started(self) -> StreamableHTTPSessionManager:
        """The running session manager, started on first use. Its task group lives in a task of its
        own: it is entered and left there, and the cancellation it sends its tasks when it stops
        cannot reach the request that started it or the app's other lifespans."""
        async with self._starting:
            if self.manager is not None:
                return self.manager
            manager = StreamableHTTPSessionManager(
                app=self.server,
                stateless=True,
                json_response=True,
                # The SDK's DNS-rebinding guard checks Host and Origin against a list of local names; a
                # request here must carry an API key in its Authorization header, which a page that
                # rebinds a name cannot supply, and the API is served under whatever name it is deployed.
                security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            )
            running, stop = asyncio.Event(), asyncio.Event()
            self._stop_event = stop

            async def serve() -> None:
                async with manager.run():
                    running.set()
                    await stop.wait()

            # In a context of its own: the manager serves every later request, not this one.
            task = asyncio.create_task(serve(), name="mcp-session-manager", context=contextvars.Context())
            started = asyncio.ensure_future(running.wait())
            await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
            started.cancel()
            if not running.is_set():
                task.result()  # it failed to start: its error
            self._task, self.manager = task, manager
            return manager

    async def _stop(self) -> None:
        """Stop the manager if it runs; a manager that does not stop within seconds is cancelled, so a
        stuck client connection cannot hold the app's shutdown."""
        task, self._task, self.manager = self._task, None, None
        if task is None:
            return
        self._stop_event.set()
        done, _ = await asyncio.wait([task], timeout=5.0)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get("user")
        if not isinstance(principal, Principal):  # OPTIONS, which the key middleware lets through
            if scope.get("method") == "OPTIONS":
                start: HTTPResponseStartEvent = {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": [(b"allow", b"POST")],  # stateless: every message is a POST
                }
                end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": b"", "more_body": False}
                await send(start)
                await send(end)
                return
            raise Unauthorized("A valid API key is required (Authorization: Bearer <key>).")
        manager = self.manager or await self._started()
        state = scope.get("state") or {}
        caller = Caller(principal, state.get("request_id"))
        token = _CALL.set(McpCall(caller, self.services_of(scope["app"].state)))
        try:
            await manager.handle_request(scope, receive, send)  # type: ignore[arg-type]
        finally:
            _CALL.reset(token)
