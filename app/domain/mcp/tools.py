"""The seven MCP tools (names fixed: agents rely on them) and the resource of a user's memories.

Each tool is the REST route it names, reached without HTTP: its arguments are decoded by the route's
own body struct (or one mirroring its query), the route's own guards decide who may call it, and it
calls the same domain service as the route's handler, in a session of the key's tenant that commits
when the tool returns (`McpCall.session`), as a request's does. What it answers is the route's body.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import unquote

import msgspec
from litestar import Controller
from litestar.connection import ASGIConnection
from litestar.handlers import HTTPRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.tenancy import tenant_scope
from app.domain.accounts.auth import RoleGuard
from app.domain.accounts.services import Caller
from app.domain.ingest import services as ingest
from app.domain.ingest.batcher import IngestBatcher
from app.domain.ingest.controllers import ChunkController
from app.domain.ingest.schemas import ChunkAccepted
from app.domain.mcp.schemas import (
    AddMemoryArgs,
    DeleteMemoryArgs,
    GetMemoriesArgs,
    MemoryRef,
    SearchMemoriesArgs,
)
from app.domain.memories import services as memories
from app.domain.memories.controllers import MemoryController
from app.domain.memories.schemas import HistoryOut, MemoryList, MemoryOut, MemoryWritten, VersionOut
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.provenance.controllers import ProvenanceController
from app.domain.provenance.schemas import ExplainOut
from app.domain.provenance.services import Reader, explain_memory
from app.domain.search.controllers import SearchController
from app.domain.search.schemas import SearchOut, SearchResult
from app.domain.search.services import Searcher, SearchQuery
from app.embeddings.base import Embedder
from app.lib.errors import DestructiveOpRefused
from app.writers.base import OpKind
from app.writers.registry import WriterRegistry


class McpServices(Protocol):
    """What the tools use of the API process's services (`app.server.lifespan.AppServices`)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def sessionmaker(self) -> async_sessionmaker[AsyncSession]: ...
    @property
    def ingest_batcher(self) -> IngestBatcher: ...
    @property
    def searcher(self) -> Searcher: ...
    @property
    def writers(self) -> WriterRegistry: ...
    @property
    def embedder(self) -> Embedder: ...


@dataclass(frozen=True)
class McpCall:
    """Who calls a tool (the key of the HTTP request that carried it) and the services it may use."""

    caller: Caller
    services: McpServices

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A session of the caller's tenant: committed when the tool returns, rolled back if it raised
        (`app.server.dependencies.provide_db_session` for a request)."""
        with tenant_scope([self.caller.tenant_id]):
            async with self.services.sessionmaker() as session:
                try:
                    yield session
                except Exception:
                    await session.rollback()
                    raise
                else:
                    await session.commit()


class _GuardConnection:
    """What a `RoleGuard` reads of a connection: the method (never OPTIONS here) and the key."""

    def __init__(self, caller: Caller) -> None:
        self.scope = {"method": "POST"}
        self.user = caller.principal


@dataclass(frozen=True)
class Tool:
    """One MCP tool: the REST route it stands for, its arguments and what it runs."""

    name: str
    description: str
    args: type[msgspec.Struct]
    controller: type[Controller]
    route: HTTPRouteHandler
    run: Callable[[McpCall, Any], Awaitable[msgspec.Struct]]
    read_only: bool = True
    destructive: bool = False  # it may take something away (an MCP client may ask before calling it)

    def guards(self) -> list[RoleGuard]:
        """The route's role guards, the controller's and its own (every one must let the key through)."""
        # A controller that sets no guards has only the slot of the base class (not a list).
        own = getattr(self.controller, "guards", None)
        found = [*(own if isinstance(own, list | tuple) else ()), *(self.route.guards or ())]
        return [guard for guard in found if isinstance(guard, RoleGuard)]

    async def authorize(self, caller: Caller) -> None:
        """Refuse a key the route would refuse: its guards raise the route's 403 (`forbidden`)."""
        connection = cast("ASGIConnection[Any, Any, Any, Any]", _GuardConnection(caller))
        for guard in self.guards():
            await guard(connection, self.route)


def _written(caller: Caller, memory: object) -> MemoryOut | MemoryWritten:
    """The memory after a delete as the key may see it (`memories.controllers`): no text without `read`."""
    return MemoryOut.of(memory) if caller.may("read") else MemoryWritten.of(memory)


async def add_memory(call: McpCall, args: AddMemoryArgs) -> ChunkAccepted:
    services = call.services
    ingest.validate_chunks([args], services.settings, services.writers)
    [accepted] = await services.ingest_batcher.submit(
        call.caller.principal, [(args, args.idempotency_key)], call.caller.request_id
    )
    return ChunkAccepted(
        chunk_id=accepted.chunk_id, seq=accepted.seq, status=accepted.status, replayed=accepted.replayed
    )


async def search_memories(call: McpCall, args: SearchMemoriesArgs) -> SearchOut:
    # The body's fields by name, as the route hands them on: a field either side adds is carried over.
    wanted = {field.name for field in dataclasses.fields(SearchQuery)}
    values = {name: getattr(args, name) for name in args.__struct_fields__ if name in wanted}
    query = SearchQuery(**values | {"tags": tuple(args.tags)})
    async with call.session() as session:
        hits = await call.services.searcher.search(session, call.caller.tenant_id, query)
        return SearchOut(
            results=[
                SearchResult(memory=MemoryOut.of(h), score=h.score, similarity=h.similarity) for h in hits
            ]
        )


async def get_memories(call: McpCall, args: GetMemoriesArgs) -> MemoryList:
    async with call.session() as session:
        page = await memories.list_memories(
            session,
            call.caller.tenant_id,
            args.user_id,
            agent_id=args.agent_id,
            status=args.status,
            cursor=args.cursor,
            limit=args.limit,
            as_of=args.as_of,
            include_expired=args.include_expired,
            valid_at=args.valid_at,
        )
        return MemoryList(items=[MemoryOut.of(m) for m in page.items], next_cursor=page.next_cursor)


async def get_memory(call: McpCall, args: MemoryRef) -> MemoryOut:
    async with call.session() as session:
        return MemoryOut.of(await memories.get_memory(session, call.caller.tenant_id, args.memory_id))


async def explain(call: McpCall, args: MemoryRef) -> ExplainOut:
    caller = call.caller
    async with call.session() as session:
        return await explain_memory(
            session,
            caller.tenant_id,
            args.memory_id,
            raw_output=False,  # the writers' raw output is the admin API's, audited per read
            reader=Reader(caller.actor, caller.request_id),
        )


async def delete_memory(call: McpCall, args: DeleteMemoryArgs) -> MemoryOut | MemoryWritten:
    """An agent's delete meets the tenant's destructive-ops policy as a writer model's would: under
    `deny` or `review` it is refused (`destructive_op_refused`; a review holds a writer's op inside
    its changeset, which an agent's call has none of), unless DELETE is not among the tenant's
    destructive kinds."""
    caller = call.caller
    async with call.session() as session:
        options = await PipelineRepository(session).tenant_options(caller.tenant_id)
        settings = call.services.settings
        policy = options.destructive_ops or settings.destructive_ops
        kinds = options.destructive_kinds or tuple(settings.destructive_kinds)
        if policy != "allow" and OpKind.DELETE.value in kinds:
            raise DestructiveOpRefused(
                f"The tenant's destructive-ops policy ({policy}) does not let an agent delete a memory.",
                details={"policy": policy, "op": OpKind.DELETE.value},
            )
        memory = await memories.delete_memory(
            session,
            caller.tenant_id,
            args.memory_id,
            reason=args.reason,
            actor=caller.actor,
            request_id=caller.request_id,
            embedder=await call.services.searcher.tenant_embedder(session, caller.tenant_id),
        )
        return _written(caller, memory)


async def memory_history(call: McpCall, args: MemoryRef) -> HistoryOut:
    async with call.session() as session:
        versions = await memories.memory_history(session, call.caller.tenant_id, args.memory_id)
        return HistoryOut(memory_id=args.memory_id, versions=[VersionOut.of(v) for v in versions])


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            "add_memory",
            "Store conversation messages for a user (user_id; agent_id and run_id optional) as a chunk, "
            "durably, as POST /v1/chunks does; memories are written from it asynchronously. Answers the "
            "chunk's id, seq and status (queued). Needs the `ingest` role.",
            AddMemoryArgs,
            ChunkController,
            ChunkController.post_chunk,
            add_memory,
            read_only=False,
        ),
        Tool(
            "search_memories",
            "The user's active memories that best match a query, best first, with their scores "
            "(POST /v1/memories/search); with `valid_at`, those whose fact held then, replaced ones "
            "included. Needs the `read` role.",
            SearchMemoriesArgs,
            SearchController,
            SearchController.search,
            search_memories,
        ),
        Tool(
            "get_memories",
            "A page of a user's memories, oldest first (active by default; `next_cursor` for the next "
            "page; with `valid_at`, those whose fact held then), as GET /v1/memories. Needs the `read` "
            "role.",
            GetMemoriesArgs,
            MemoryController,
            MemoryController.list_memories,
            get_memories,
        ),
        Tool(
            "get_memory",
            "One memory as it stands now (GET /v1/memories/{id}). Needs the `read` role.",
            MemoryRef,
            MemoryController,
            MemoryController.get_memory,
            get_memory,
        ),
        Tool(
            "explain_memory",
            "Why a memory says what it says: every version beside the messages it was written from, the "
            "earlier messages and memories its writer was shown, and its changeset "
            "(GET /v1/memories/{id}/explain). Needs the `read` role.",
            MemoryRef,
            ProvenanceController,
            ProvenanceController.explain,
            explain,
        ),
        Tool(
            "delete_memory",
            "Delete a memory (soft: a new version with status deleted, kept in its history and undoable "
            "by an admin), as DELETE /v1/memories/{id}. Needs the `write` role.",
            DeleteMemoryArgs,
            MemoryController,
            MemoryController.delete_memory,
            delete_memory,
            read_only=False,
            destructive=True,
        ),
        Tool(
            "memory_history",
            "Every version of a memory with its provenance, oldest first "
            "(GET /v1/memories/{id}/history). Needs the `read` role.",
            MemoryRef,
            MemoryController,
            MemoryController.history,
            memory_history,
        ),
    )
}

# The resource of a user's memories: the first page of `get_memories` (active memories, oldest first).
USER_MEMORIES_TEMPLATE = "memstore://users/{user_id}/memories"
USER_MEMORIES_PAGE = 100


def user_of_memories_uri(uri: str) -> str | None:
    """The user id of a `memstore://users/{user_id}/memories` URI, percent-decoded (None for any other
    URI)."""
    prefix, suffix = "memstore://users/", "/memories"
    if not (uri.startswith(prefix) and uri.endswith(suffix)):
        return None
    user_id = uri[len(prefix) : -len(suffix)]
    return unquote(user_id) if user_id and "/" not in user_id else None


async def read_user_memories(call: McpCall, user_id: str) -> MemoryList:
    """The resource's content: `get_memories` for the user, under the same route's guards."""
    args = msgspec.convert({"user_id": user_id, "limit": USER_MEMORIES_PAGE}, GetMemoriesArgs)
    await TOOLS["get_memories"].authorize(call.caller)
    return await get_memories(call, args)
