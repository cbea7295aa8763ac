"""Hand edits: an edit or a delete of one memory by a key with the `write` role, applied as an op
(UPDATE, DELETE) under a changeset of kind `manual` attributed to the key, and audited."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Memory
from app.domain.audit.services import record_event
from app.domain.memories.services.apply import apply_ops
from app.domain.memories.services.guards import storable
from app.domain.memories.services.reads import get_memory
from app.domain.memories.services.requests import ApplyLimits, Provenance, Shown, Vectors
from app.domain.webhooks.events import Announcement, announce
from app.embeddings import Embedder
from app.lib import tracing
from app.lib.errors import InvalidField, MemoryChanged, MemoryNotActive
from app.writers.base import Op, OpKind


async def edit_memory(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    memory_id: uuid.UUID,
    *,
    content: str | None,
    tags: list[str] | None,
    reason: str | None,
    actor: str,
    request_id: str | None,
    embedder: Embedder,
    limits: ApplyLimits | None = None,
    expires_at: datetime | None = None,
    clears_expiry: bool = False,
) -> Memory:
    """A hand edit: a new version (op UPDATE) under a `manual` changeset, attributed to `actor`.
    `expires_at` sets when the memory expires, `clears_expiry` makes it never expire; neither keeps it.

    A new text is embedded before the request's first statement, so no transaction is open while the
    embedder answers; a tags-only edit keeps the text, and with it the memory's stored vector.
    """
    limits = limits or ApplyLimits()
    new_text = None if content is None else content.strip()
    vectors: dict[str, list[float]] | None = None
    if new_text is not None:
        may_store = storable(new_text, limits)  # otherwise the content guard answers 422
        vectors = dict(zip([new_text], await embedder.embed([new_text]), strict=True)) if may_store else {}
    memory = await get_memory(session, tenant_id, memory_id)
    _must_be_active(memory)  # even for an edit that changes nothing: a deleted memory is not edited
    text = memory.content if new_text is None else new_text
    expiry = memory.expires_at if expires_at is None and not clears_expiry else expires_at
    if (
        text == memory.content
        and (not tags or list(tags) == list(memory.tags))
        and expiry == memory.expires_at
    ):
        return memory  # nothing to change (empty tags keep the memory's); no version for it
    if vectors is None and memory.embedding is not None:
        vectors = {memory.content: [float(v) for v in memory.embedding]}
    op = Op(
        OpKind.UPDATE,
        text,
        targets=(0,),
        tags=tuple(tags or ()),
        reason=reason,
        expires_at=expires_at,
        clears_expiry=clears_expiry,
    )
    return await _manual_write(
        session, memory, op, "memory.updated", actor, request_id, embedder, limits, vectors
    )


@tracing.operation("delete_memory", memory_operation="delete_memory")
async def delete_memory(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    memory_id: uuid.UUID,
    *,
    reason: str | None,
    actor: str,
    request_id: str | None,
    embedder: Embedder,
) -> Memory:
    """A soft delete by hand: a new version (op DELETE, status `deleted`); history keeps the content."""
    memory = await get_memory(session, tenant_id, memory_id)
    if memory.status == "deleted":
        return memory
    op = Op(OpKind.DELETE, targets=(0,), reason=reason)
    # A delete stores no text: nothing to embed.
    return await _manual_write(
        session, memory, op, "memory.deleted", actor, request_id, embedder, ApplyLimits(), {}
    )


def _must_be_active(memory: Memory) -> None:
    if memory.status != "active":
        raise MemoryNotActive(
            f"The memory is {memory.status}; only an active memory can be edited "
            "(an admin can roll it back).",
            details={"status": memory.status},
        )


async def _manual_write(
    session: AsyncSession,
    memory: Memory,
    op: Op,
    action: str,
    actor: str,
    request_id: str | None,
    embedder: Embedder,
    limits: ApplyLimits,
    vectors: Vectors | None,
) -> Memory:
    _must_be_active(memory)
    outcome = await apply_ops(
        session,
        tenant_id=memory.tenant_id,
        user_id=memory.user_id,
        ops=[op],
        shown={0: Shown(memory.id, memory.version)},
        provenance=Provenance(actor=actor, kind="manual", reason=op.reason),
        embedder=embedder,
        vectors=vectors,
        agent_id=memory.agent_id,
        run_id=memory.run_id,
        limits=limits,
    )
    if outcome.applied == 0:
        guard = outcome.guards[-1] if outcome.guards else {"guard": "unknown", "detail": "not applied"}
        if guard["guard"] in ("bad_content", "placeholder"):
            raise InvalidField(guard["detail"], details={"field": "content"})
        raise MemoryChanged(
            "The memory changed meanwhile; read it again and retry.",
            details={"guard": guard["guard"]},
        )
    await record_event(
        session,
        tenant_id=memory.tenant_id,
        actor=actor,
        action=action,
        target_type="memory",
        target_id=str(memory.id),
        request_id=request_id,
        summary={"changeset_id": str(outcome.changeset_id), "version": memory.version + 1},
    )
    # The webhooks' `memory.*` events of the edit (`webhooks.events`), in its transaction.
    await announce(
        session,
        [Announcement(tenant_id=memory.tenant_id, user_id=memory.user_id, changeset_id=outcome.changeset_id)],
    )
    await session.refresh(memory)
    return memory
