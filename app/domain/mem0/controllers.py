"""Mem0's REST paths (those the `mem0ai` 2.2 `MemoryClient` calls), served by Memstore's own services.

Mounted under `/mem0` (`mem0_router`) when `MEMSTORE_MEM0_COMPAT=true`; `mem0_paths` also routes Mem0's
own paths at the root there — `GET /v1/memories/{id}/` with its trailing slash is Mem0's, without it
Memstore's — so `MemoryClient(host="http://memstore:8000")` works unchanged. docs/mem0.md has the table.
Error bodies carry Memstore's `error` plus Mem0's `detail`, the text the client raises with.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import date
from typing import Annotated, Any

import msgspec
from litestar import Controller, Response, Router, delete, get, post, put
from litestar.di import NamedDependency
from litestar.enums import ScopeType
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, HeaderParameter, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK, HTTP_202_ACCEPTED
from litestar.types import ASGIApp, Receive, Scope, Send
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.domain.accounts.auth import requires_any_role, requires_role
from app.domain.accounts.services import Caller
from app.domain.audit.services import record_event
from app.domain.ingest import services as ingest
from app.domain.ingest.batcher import IngestBatcher
from app.domain.ingest.controllers import REPLAYED
from app.domain.mem0 import services
from app.domain.mem0.filters import compile_filters
from app.domain.mem0.repositories import Mem0Repository
from app.domain.mem0.schemas import (
    AddAccepted,
    AddIn,
    BatchDeleteIn,
    BatchUpdateIn,
    Entity,
    EntityList,
    EventOut,
    FeedbackIn,
    HistoryEntry,
    ListIn,
    Mem0Hit,
    Mem0Memory,
    MemoryPage,
    Message,
    Ping,
    SearchIn,
    SearchOut,
    UpdateIn,
)
from app.domain.memories import services as memories
from app.domain.memories.expiry import after_day
from app.domain.search.services import Searcher, SearchQuery
from app.embeddings.base import Embedder
from app.lib.errors import (
    EmbedderMismatch,
    IdempotencyConflict,
    InvalidField,
    InvalidFilters,
    MemoryChanged,
    MemoryNotActive,
    NotFoundError,
    Overloaded,
    QueueFull,
    Unavailable,
    error_responses,
)
from app.writers.registry import WriterRegistry

PREFIX = "/mem0"
MAX_PAGE_SIZE = 1_000

IdempotencyKey = Annotated[
    str | None, HeaderParameter(name="Idempotency-Key", required=False, max_length=200, min_length=1)
]


def _writing(caller: Caller, embedder: Embedder) -> dict[str, Any]:
    """What a hand edit is attributed to, and the embedder it embeds with (the configured one)."""
    return {"actor": caller.actor, "request_id": caller.request_id, "embedder": embedder}


class Mem0Controller(Controller):
    tags = ["mem0"]

    @get("/v1/ping", summary="Mem0: check the key (what MemoryClient calls when it is made)")
    async def ping(self, caller: NamedDependency[Caller]) -> Ping:
        principal = caller.principal
        return Ping(
            status="ok",
            org_id=str(principal.tenant_id),
            project_id=str(principal.tenant_id),
            user_email=None,
            tenant_id=principal.tenant_id,
            key_name=principal.name,
            roles=sorted(principal.roles),
        )

    @post(
        "/v3/memories/add",
        guards=[requires_role("ingest")],
        status_code=HTTP_202_ACCEPTED,
        summary="Mem0: add messages (a chunk, durable when this returns; its event is the chunk)",
        responses={
            200: ResponseSpec(AddAccepted, description=REPLAYED),
            **error_responses(InvalidField, IdempotencyConflict, QueueFull, Overloaded, Unavailable),
        },
    )
    async def add(
        self,
        data: JSONBody[AddIn],
        caller: NamedDependency[Caller],
        settings: NamedDependency[Settings],
        writers: NamedDependency[WriterRegistry],
        ingest_batcher: NamedDependency[IngestBatcher],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[AddAccepted]:
        chunk = services.chunk_of(data)
        ingest.validate_chunks([chunk], settings, writers)
        [result] = await ingest_batcher.submit(
            caller.principal, [(chunk, idempotency_key)], caller.request_id
        )
        accepted = AddAccepted(
            event_id=result.chunk_id,
            status="PENDING",
            message="Memory processing has been queued for background execution",
        )
        return Response(accepted, status_code=HTTP_200_OK if result.replayed else HTTP_202_ACCEPTED)

    @get(
        "/v1/event/{event_id:uuid}",
        guards=[requires_any_role("ingest", "read")],
        summary="Mem0: an add's progress and, once applied, the memories it wrote",
        responses=error_responses(NotFoundError),
    )
    async def event(
        self,
        event_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
    ) -> EventOut:
        return await services.event(db_session, caller.tenant_id, event_id, may_read=caller.may("read"))

    @post(
        "/v3/memories",
        guards=[requires_role("read")],
        status_code=HTTP_200_OK,
        summary="Mem0: active memories matching filters, newest first, a page at a time",
        responses=error_responses(InvalidFilters, InvalidField),
    )
    async def list_memories(
        self,
        data: JSONBody[ListIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        page: Annotated[int, QueryParameter(ge=1, le=1_000_000)] = 1,
        page_size: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE_SIZE)] = 100,
    ) -> MemoryPage:
        total, found = await services.page(
            db_session,
            caller.tenant_id,
            data.filters,
            page=page,
            page_size=page_size,
            show_expired=bool(data.show_expired),
        )
        at = f"{PREFIX}/v3/memories/?page_size={page_size}&page="
        return MemoryPage(
            count=total,
            next=f"{at}{page + 1}" if page * page_size < total else None,
            previous=f"{at}{page - 1}" if page > 1 else None,
            results=[Mem0Memory.of(m) for m in found],
        )

    @post(
        "/v3/memories/search",
        guards=[requires_role("read")],
        status_code=HTTP_200_OK,
        summary="Mem0: the memories best matching a query among those the filters allow",
        responses=error_responses(InvalidFilters, InvalidField, EmbedderMismatch, Unavailable),
    )
    async def search(
        self,
        data: JSONBody[SearchIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        searcher: NamedDependency[Searcher],
        settings: NamedDependency[Settings],
    ) -> SearchOut:
        compiled = compile_filters(data.filters)
        one_user = next(iter(compiled.user_ids)) if len(compiled.user_ids) == 1 else None
        # The search ranks a pool as large as it serves; the filters then keep those they allow.
        hits = await searcher.search(
            db_session,
            caller.tenant_id,
            SearchQuery(
                query=data.query,
                user_id=one_user,
                all_users=one_user is None,
                top_k=settings.search_max_top_k,
                threshold=data.threshold if data.threshold is not None else 0.0,
                mode="vector" if data.keyword_search is False else "hybrid",
                include_expired=bool(data.show_expired),
            ),
        )
        allowed = await Mem0Repository(db_session).matching_ids(
            caller.tenant_id, [h.id for h in hits], compiled.condition
        )
        kept = [h for h in hits if h.id in allowed][: data.top_k]
        return SearchOut(
            results=[Mem0Hit(**{**_fields(Mem0Memory.of(h)), "score": round(h.score, 6)}) for h in kept]
        )

    @get(
        "/v1/memories/{memory_id:uuid}",
        guards=[requires_role("read")],
        summary="Mem0: one memory (a deleted one is 404, as in Mem0)",
        responses=error_responses(NotFoundError),
    )
    async def get_memory(
        self,
        memory_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
    ) -> Mem0Memory:
        return Mem0Memory.of(await services.live_memory(db_session, caller.tenant_id, memory_id))

    @put(
        "/v1/memories/{memory_id:uuid}",
        guards=[requires_role("write")],
        summary="Mem0: new text for a memory (a hand edit: a new version, revertible)",
        responses=error_responses(NotFoundError, InvalidField, MemoryNotActive, MemoryChanged),
    )
    async def update_memory(
        self,
        memory_id: FromPath[uuid.UUID],
        data: JSONBody[UpdateIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        settings: NamedDependency[Settings],
    ) -> Mem0Memory:
        if data.metadata is not None:
            raise InvalidField(
                "Memstore's memories hold no metadata; send text or an expiration_date.",
                details={"field": "metadata"},
            )
        expiry = data.expiration_date
        if data.text is None and expiry is msgspec.UNSET:
            raise InvalidField("text or expiration_date is required.", details={"field": "text"})
        await services.live_memory(db_session, caller.tenant_id, memory_id)
        memory = await memories.edit_memory(
            db_session,
            caller.tenant_id,
            memory_id,
            content=data.text,
            tags=None,
            reason="mem0 update",
            limits=memories.ApplyLimits(max_chars=settings.max_memory_chars),
            expires_at=after_day(expiry) if isinstance(expiry, date) else None,
            clears_expiry=expiry is None,
            **_writing(caller, embedder),
        )
        return Mem0Memory.of(memory)

    @delete(
        "/v1/memories/{memory_id:uuid}",
        guards=[requires_role("write")],
        status_code=HTTP_200_OK,
        summary="Mem0: delete a memory (soft: a new version with status deleted, revertible)",
        responses=error_responses(NotFoundError, MemoryNotActive, MemoryChanged),
    )
    async def delete_memory(
        self,
        memory_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        delete_linked: Annotated[bool, QueryParameter()] = False,
    ) -> Message:
        # Superseded memories are already out of every search: `delete_linked` has nothing to add.
        await services.live_memory(db_session, caller.tenant_id, memory_id)
        await memories.delete_memory(
            db_session, caller.tenant_id, memory_id, reason="mem0 delete", **_writing(caller, embedder)
        )
        return Message(message="Memory deleted successfully!")

    @get(
        "/v1/memories/{memory_id:uuid}/history",
        guards=[requires_role("read")],
        summary="Mem0: a memory's versions, oldest first",
        responses=error_responses(NotFoundError),
    )
    async def history(
        self,
        memory_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
    ) -> list[HistoryEntry]:
        versions = await memories.memory_history(db_session, caller.tenant_id, memory_id)
        return services.history_entries(versions)

    @delete(
        "/v1/memories",
        guards=[requires_role("write")],
        status_code=HTTP_200_OK,
        summary="Mem0: delete every active memory of a user, agent or run (soft, revertible)",
        responses=error_responses(InvalidField, MemoryChanged),
    )
    async def delete_all(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        user_id: Annotated[str | None, QueryParameter(min_length=1, max_length=200)] = None,
        agent_id: Annotated[str | None, QueryParameter(min_length=1, max_length=200)] = None,
        run_id: Annotated[str | None, QueryParameter(min_length=1, max_length=200)] = None,
    ) -> Message:
        named = {k: v for k, v in (("user_id", user_id), ("agent_id", agent_id), ("run_id", run_id)) if v}
        if not named:
            raise InvalidField(
                "Name what to delete: user_id, agent_id or run_id.",
                details={"field": "user_id"},
            )
        found = await Mem0Repository(db_session).active(caller.tenant_id, compile_filters(named).condition)
        deleted = await services.delete_many(
            db_session, found, reason="mem0 delete_all", **_writing(caller, embedder)
        )
        return Message(message=f"{deleted} memories deleted successfully!")

    @put(
        "/v1/batch",
        guards=[requires_role("write")],
        summary="Mem0: new text for up to 1,000 memories",
        responses=error_responses(NotFoundError, InvalidField, MemoryNotActive, MemoryChanged),
    )
    async def batch_update(
        self,
        data: JSONBody[BatchUpdateIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        settings: NamedDependency[Settings],
    ) -> Message:
        tenant_id = caller.tenant_id
        await services.memories_by_ids(db_session, tenant_id, [m.memory_id for m in data.memories])
        limits = memories.ApplyLimits(max_chars=settings.max_memory_chars)
        for item in data.memories:  # one transaction: all of them, or (an error) none
            await memories.edit_memory(
                db_session,
                tenant_id,
                item.memory_id,
                content=item.text,
                tags=None,
                reason="mem0 batch update",
                limits=limits,
                **_writing(caller, embedder),
            )
        return Message(message=f"Successfully updated {len(data.memories)} memories")

    @delete(
        "/v1/batch",
        guards=[requires_role("write")],
        status_code=HTTP_200_OK,
        summary="Mem0: delete up to 1,000 memories (soft, one revertible changeset per user)",
        responses=error_responses(NotFoundError, InvalidField, MemoryChanged),
    )
    async def batch_delete(
        self,
        data: JSONBody[BatchDeleteIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
    ) -> Message:
        found = await services.memories_by_ids(
            db_session, caller.tenant_id, [m.memory_id for m in data.memories]
        )
        deleted = await services.delete_many(
            db_session, found, reason="mem0 batch delete", **_writing(caller, embedder)
        )
        return Message(message=f"Successfully deleted {deleted} memories")

    @get("/v1/entities", guards=[requires_role("read")], summary="Mem0: users, agents and runs with memories")
    async def entities(
        self, caller: NamedDependency[Caller], db_session: NamedDependency[AsyncSession]
    ) -> EntityList:
        repo = Mem0Repository(db_session)
        results = [
            Entity(id=name, name=name, type=kind, total_memories=n, created_at=first, updated_at=last)  # type: ignore[arg-type]
            for kind in services.ENTITY_KINDS
            for name, n, first, last in await repo.entities(caller.tenant_id, kind)
        ]
        return EntityList(count=len(results), results=results)

    @delete(
        "/v2/entities/{kind:str}/{name:str}",
        guards=[requires_role("write")],
        status_code=HTTP_200_OK,
        summary="Mem0: delete an entity's memories (soft, revertible; the entity's history stays)",
        responses=error_responses(NotFoundError, MemoryChanged),
    )
    async def delete_entity(
        self,
        kind: FromPath[str],
        name: FromPath[str],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
    ) -> Message:
        condition = services.entity_condition(kind, name)
        found = await Mem0Repository(db_session).active(caller.tenant_id, condition)
        if not found:
            raise NotFoundError(f"No {kind} {name!r} with memories.")
        await services.delete_many(
            db_session, found, reason=f"mem0 delete {kind}", **_writing(caller, embedder)
        )
        return Message(message="Entity deleted successfully.")

    @post(
        "/v1/feedback",
        guards=[requires_role("read")],
        status_code=HTTP_200_OK,
        summary="Mem0: feedback on a memory (kept in the audit log as memory.feedback)",
        responses=error_responses(NotFoundError),
    )
    async def feedback(
        self,
        data: JSONBody[FeedbackIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
    ) -> Message:
        memory = await services.live_memory(db_session, caller.tenant_id, data.memory_id)
        await record_event(
            db_session,
            tenant_id=caller.tenant_id,
            actor=caller.actor,
            action="memory.feedback",
            target_type="memory",
            target_id=str(memory.id),
            request_id=caller.request_id,
            summary={"feedback": data.feedback, "reason": data.feedback_reason, "version": memory.version},
        )
        return Message(message="Feedback recorded")


def _fields(memory: Mem0Memory) -> dict[str, Any]:
    return {name: getattr(memory, name) for name in memory.__struct_fields__}


def mem0_router() -> Router:
    """The Mem0-compatible routes under `/mem0`."""
    return Router(path=PREFIX, route_handlers=[Mem0Controller])


# Mem0's paths as its client sends them (with the trailing slash), by method.
_MEM0_PATHS = {
    "GET": re.compile(r"^/v1/(ping|entities|memories/[^/]+(/history)?|event/[^/]+)/$"),
    "POST": re.compile(r"^/v3/memories/((add|search)/)?$|^/v1/feedback/$"),
    "PUT": re.compile(r"^/v1/(memories/[^/]+|batch)/$"),
    "DELETE": re.compile(r"^/v1/(memories/([^/]+/)?|batch/)$|^/v2/entities/[^/]+/[^/]+/$"),
}


def mem0_paths(app: ASGIApp) -> ASGIApp:
    """Route a request on one of Mem0's own paths (trailing slash included) to the `/mem0` routes, so
    Mem0's clients need only `host=`. Everything else, Memstore's native API included, is untouched."""

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            pattern = _MEM0_PATHS.get(str(scope.get("method")))
            if pattern is not None and pattern.match(scope["path"]):
                scope["path"] = PREFIX + scope["path"]
                scope["raw_path"] = PREFIX.encode() + scope.get("raw_path", b"")
            if scope["path"].startswith(PREFIX + "/"):
                send = _with_detail(send)
        await app(scope, receive, send)

    return route


def _with_detail(send: Send) -> Send:
    """Error bodies as Memstore writes them, plus the `detail` Mem0's client raises with — whoever made
    the answer (a handler, authentication, the input guard, the rate limiter)."""
    held: list[Any] = []

    async def detailed(message: Any) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            held.append(message)
            return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        held.append(message)
        if message.get("more_body"):
            return
        start, chunks = held[0], held[1:]
        body = b"".join(m.get("body", b"") for m in chunks)
        try:
            answer = json.loads(body)
            answer["detail"] = answer["error"]["message"]
            body = json.dumps(answer).encode()
        except (ValueError, TypeError, KeyError):
            pass  # not the error body: sent as it was
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})  # type: ignore[arg-type]
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return detailed
