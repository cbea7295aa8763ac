"""What the Mem0-compatible routes do, in terms of Memstore's own services.

An add is a chunk through the normal ingest path (its event is the chunk); reads go through the
memories and search services; an update or a delete is a hand edit — a new version under a `manual`
changeset, audited, revertible — exactly as `PATCH` / `DELETE /v1/memories/{id}` write one. Nothing
here writes a memory row itself.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from sqlalchemy import ColumnElement
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Changeset, Chunk, Memory
from app.domain.audit.services import record_event
from app.domain.ingest.schemas import ChunkIn
from app.domain.mem0.filters import compile_filters
from app.domain.mem0.repositories import Mem0Repository
from app.domain.mem0.schemas import AddIn, EventOut, EventResult, HistoryEntry
from app.domain.memories.expiry import EXPIRATION_KEY
from app.domain.memories.repositories import unexpired
from app.domain.memories.services import ApplyLimits, Provenance, Shown, apply_ops
from app.embeddings import Embedder
from app.lib.errors import InvalidField, MemoryChanged, NotFoundError
from app.lib.validation import Moment, parse_moment
from app.writers.base import Op, OpKind
from app.writers.verbatim import VERBATIM

# Memstore's chunk status -> Mem0's event status.
EVENT_STATUS = {"queued": "PENDING", "processing": "RUNNING", "applied": "SUCCEEDED", "failed": "FAILED"}
# Memstore's version ops -> the three events Mem0's history knows.
HISTORY_EVENT = {"ADD": "ADD", "DELETE": "DELETE"}
ENTITY_KINDS = ("user", "agent", "run")


def scope_of(body: AddIn) -> tuple[str, str | None, str | None]:
    """(user_id, agent_id, run_id) of an add: top-level fields, else those in `filters`. Memstore's
    scope is a user; an add for an agent or a run alone goes to the user `agent:<id>` / `run:<id>`."""
    filters = body.filters or {}
    ids: dict[str, str | None] = {}
    for name in ("user_id", "agent_id", "run_id"):
        value = getattr(body, name)
        if value is None:
            value = filters.get(name)
            if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 200):
                raise _invalid(f"filters.{name}", "an id of 1 … 200 characters")
        ids[name] = value
    if body.app_id is not None or "app_id" in filters:
        raise _invalid("app_id", "Memstore has no apps: scope memories by user_id, agent_id and run_id")
    user_id = ids["user_id"]
    if user_id is None:
        if ids["agent_id"] is not None:
            user_id = f"agent:{ids['agent_id']}"
        elif ids["run_id"] is not None:
            user_id = f"run:{ids['run_id']}"
        else:
            raise _invalid("user_id", "one of user_id, agent_id or run_id is required")
    return user_id, ids["agent_id"], ids["run_id"]


def chunk_of(body: AddIn) -> ChunkIn:
    """The chunk an add posts: its messages (dated by `timestamp`), metadata, and, with `infer=false`,
    the verbatim writer, which stores each message as it was said. An `expiration_date` goes into the
    metadata (where Mem0's own library keeps it), and the memories the chunk adds expire after it."""
    metadata = dict(body.metadata or {})
    if body.expiration_date is not None:
        metadata[EXPIRATION_KEY] = body.expiration_date.isoformat()
    user_id, agent_id, run_id = scope_of(body)
    said = None if body.timestamp is None else datetime.fromtimestamp(body.timestamp, UTC).isoformat()
    chunk = {
        "user_id": user_id,
        "agent_id": agent_id,
        "run_id": run_id,
        "messages": [
            {"role": m.role, "content": m.content, "name": m.name, "created_at": said} for m in body.messages
        ],
        "metadata": metadata,
        "writer": None if body.infer else VERBATIM,
    }
    try:
        return msgspec.convert(chunk, ChunkIn, strict=False, dec_hook=_client_time)
    except msgspec.ValidationError as exc:
        raise InvalidField(str(exc)) from exc


def _client_time(target: type, value: Any) -> Any:
    """`dec_hook`: a chunk's times (`Moment`) checked as a request's are (`app.lib.validation`)."""
    if target is Moment:
        return parse_moment(value)
    msg = f"no decoder for {target!r}"
    raise NotImplementedError(msg)


async def event(
    session: AsyncSession, tenant_id: uuid.UUID, event_id: uuid.UUID, *, may_read: bool
) -> EventOut:
    """An add's event: its chunk's progress, and once applied what its changeset wrote."""
    chunk = await session.get(Chunk, (tenant_id, event_id))  # keyed by tenant, then id
    if chunk is None:
        raise NotFoundError("No such event.")
    results: list[EventResult] = []
    if chunk.changeset_id is not None:
        changeset = await session.get(Changeset, (tenant_id, chunk.changeset_id))
        for op in changeset.ops if changeset is not None else []:
            if op.get("memory_id") and op.get("op") in ("ADD", "UPDATE", "SUPERSEDE", "DELETE"):
                kind = {"SUPERSEDE": "ADD"}.get(op["op"], op["op"])
                data = {"memory": op.get("content")} if may_read else {}
                results.append(EventResult(id=uuid.UUID(op["memory_id"]), event=kind, data=data))
    return EventOut(
        id=chunk.id,
        event_type="ADD",
        status=EVENT_STATUS.get(chunk.status, "PENDING"),  # type: ignore[arg-type]
        results=results,
        error=chunk.last_error if chunk.status == "failed" else None,
        created_at=chunk.received_at,
        updated_at=chunk.applied_at,
    )


def condition_of(filters: dict[str, Any] | None) -> ColumnElement[bool]:
    return compile_filters(filters).condition


async def page(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    filters: dict[str, Any] | None,
    *,
    page: int,
    page_size: int,
    show_expired: bool = False,
) -> tuple[int, Sequence[Memory]]:
    condition = condition_of(filters)
    if not show_expired:
        condition = condition & unexpired(Memory.expires_at)
    repo = Mem0Repository(session)
    total = await repo.count(tenant_id, condition)
    return total, await repo.page(tenant_id, condition, offset=(page - 1) * page_size, limit=page_size)


def history_entries(versions: Sequence[Any]) -> list[HistoryEntry]:
    entries, previous = [], None
    for v in versions:
        entries.append(
            HistoryEntry(
                id=f"{v.memory_id}:{v.version}",
                memory_id=v.memory_id,
                version=v.version,
                event=HISTORY_EVENT.get(v.op, "UPDATE"),
                op=v.op,
                old_memory=previous,
                new_memory=v.content,
                status=v.status,
                user_id=v.user_id,
                changeset_id=v.changeset_id,
                chunk_id=v.chunk_id,
                actor=v.actor,
                reason=v.reason,
                created_at=v.created_at,
                updated_at=v.created_at,
                valid_from=v.valid_from,
                valid_to=v.valid_to,
            )
        )
        previous = v.content
    return entries


async def live_memory(session: AsyncSession, tenant_id: uuid.UUID, memory_id: uuid.UUID) -> Memory:
    """A memory Mem0 would still have: a deleted one is gone there (404), as another tenant's is."""
    memory = await Mem0Repository(session).many(tenant_id, [memory_id])
    found = memory.get(memory_id)
    if found is None or found.status == "deleted":
        raise NotFoundError("No such memory.")
    return found


async def delete_many(
    session: AsyncSession,
    memories: Sequence[Memory],
    *,
    actor: str,
    request_id: str | None,
    reason: str,
    embedder: Embedder,
) -> int:
    """Soft-delete `memories` by hand: per user one `manual` changeset with a DELETE version of each,
    and a `memory.deleted` audit event per memory — revertible like any changeset. Raises 409 (and
    the caller's transaction writes nothing) if one changed meanwhile."""
    by_user: dict[tuple[uuid.UUID, str], list[Memory]] = defaultdict(list)
    for memory in memories:
        if memory.status == "active":
            by_user[(memory.tenant_id, memory.user_id)].append(memory)
    deleted = 0
    for (tenant_id, user_id), group in by_user.items():
        outcome = await apply_ops(
            session,
            tenant_id=tenant_id,
            user_id=user_id,
            ops=[Op(OpKind.DELETE, targets=(i,), reason=reason) for i in range(len(group))],
            shown={i: Shown(m.id, m.version) for i, m in enumerate(group)},
            provenance=Provenance(actor=actor, kind="manual", reason=reason),
            embedder=embedder,
            vectors={},  # a delete stores no text
            limits=ApplyLimits(max_ops=len(group)),
        )
        if outcome.applied != len(group):
            raise MemoryChanged(
                "A memory changed meanwhile; read it again and retry.",
                details={"guards": outcome.guards[:5]},
            )
        for memory in group:
            await record_event(
                session,
                tenant_id=tenant_id,
                actor=actor,
                action="memory.deleted",
                target_type="memory",
                target_id=str(memory.id),
                request_id=request_id,
                summary={"changeset_id": str(outcome.changeset_id), "version": memory.version + 1},
            )
        deleted += len(group)
    return deleted


async def memories_by_ids(
    session: AsyncSession, tenant_id: uuid.UUID, ids: Sequence[uuid.UUID]
) -> list[Memory]:
    """The tenant's live memories `ids`, in order; 404 naming the first that is not (another tenant's
    memory is not one), so a batch is whole or refused."""
    found = await Mem0Repository(session).many(tenant_id, ids)
    for index, memory_id in enumerate(ids):
        memory = found.get(memory_id)
        if memory is None or memory.status == "deleted":
            raise NotFoundError(
                f"No such memory: {memory_id}.", details={"field": f"memories[{index}].memory_id"}
            )
    if len(set(ids)) != len(ids):
        raise _invalid("memories", "a memory is named twice")
    return [found[i] for i in ids]


def entity_condition(kind: str, name: str) -> ColumnElement[bool]:
    if kind not in ENTITY_KINDS:
        raise _invalid("type", f"an entity type is one of {', '.join(ENTITY_KINDS)} (Memstore has no apps)")
    return compile_filters({f"{kind}_id": name}, "entity").condition


def _invalid(field: str, reason: str) -> InvalidField:
    return InvalidField(f"{field}: {reason}", details={"field": field})
