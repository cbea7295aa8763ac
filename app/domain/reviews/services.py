"""Deciding a held op: approve applies it as new versions, reject records the decision only.

A writer's DELETE / SUPERSEDE (and, if the tenant says so, UPDATE) is held under the `review`
policy (`ApplyLimits.destructive`, set per chunk by the pipeline): `apply_many` writes the rest of
the changeset and a pending review row for the held op. Approving applies the op through `apply_ops`
with the versions the writer was shown, so a memory that changed since is a 409, never an overwrite;
the new changeset (kind `review`) carries the writer's provenance — writer, model, profile, prompt,
chunk — with the approver as its actor. Both decisions are audited.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Review
from app.domain.audit.services import Actor, record_event
from app.domain.memories.services import ApplyLimits, Provenance, Shown, apply_ops
from app.domain.reviews.repositories import ReviewRepository
from app.domain.webhooks.events import Announcement, announce
from app.embeddings import Embedder
from app.lib import tracing
from app.lib.errors import MemoryChanged, NotFoundError, ReviewDecided
from app.writers.base import Op, OpKind

# Approval is a human's decision: a near-duplicate check would only turn it into a NOOP.
_APPROVAL_LIMITS = ApplyLimits(duplicate_threshold=2.0)


async def _pending(session: AsyncSession, tenant_id: uuid.UUID, review_id: uuid.UUID) -> Review:
    review = await ReviewRepository(session).get(tenant_id, review_id, lock=True)
    if review is None:
        raise NotFoundError("No such review.")
    if review.status != "pending":
        raise ReviewDecided(
            f"The review is already {review.status}.",
            details={"status": review.status},
        )
    return review


def _op(review: Review) -> Op:
    """The held op as the writer proposed it (`Op.as_json`), its expiry included."""
    held = review.op
    expires_at = held.get("expires_at")
    return Op(
        OpKind(held["op"]),
        held.get("content"),
        targets=tuple(range(len(review.targets))),
        tags=tuple(held.get("tags") or ()),
        owner=held.get("owner") or "user",
        reason=held.get("reason"),
        expires_at=datetime.fromisoformat(expires_at) if isinstance(expires_at, str) else None,
    )


@tracing.operation("approve review", memory_operation="update_memory")
async def approve(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    review_id: uuid.UUID,
    *,
    who: Actor,
    embedder: Embedder,
    max_chars: int,
) -> Review:
    """Apply the held op as new versions, if every memory it names is still as the writer saw it."""
    review = await _pending(session, tenant_id, review_id)
    op = _op(review)
    text = (op.content or "").strip()
    vectors: dict[str, list[float]] = {}
    if op.kind is not OpKind.DELETE and text:
        # Embedded outside any transaction: the read above locked the row; let it go while the model
        # answers, and take it again after.
        await session.rollback()
        [vector] = await embedder.embed([text])
        vectors = {text: vector}
        review = await _pending(session, tenant_id, review_id)
    reason = f"approved review {review.id}" + (f": {who.reason}" if who.reason else "")
    outcome = await apply_ops(
        session,
        tenant_id=tenant_id,
        user_id=review.user_id,
        ops=[op],
        shown={i: Shown(uuid.UUID(t["memory_id"]), int(t["version"])) for i, t in enumerate(review.targets)},
        provenance=Provenance(
            actor=who.actor,
            kind="review",
            writer=review.writer,
            model=review.model,
            profile=review.profile,
            prompt_hash=review.prompt_hash,
            chunk_id=review.chunk_id,
            reason=reason,
        ),
        embedder=embedder,
        vectors=vectors,
        agent_id=review.agent_id,
        run_id=review.run_id,
        memory_at=review.memory_at,
        limits=ApplyLimits(max_chars=max_chars, duplicate_threshold=_APPROVAL_LIMITS.duplicate_threshold),
    )
    if outcome.applied == 0:
        guard = outcome.guards[-1] if outcome.guards else {"guard": "unknown", "detail": "not applied"}
        raise MemoryChanged(
            "A memory this op names changed after it was held; reject the review, or let the writer "
            "decide again.",
            details={"guard": guard["guard"], "detail": guard.get("detail")},
        )
    repo = ReviewRepository(session)
    await repo.decide(
        review, status="approved", actor=who.actor, reason=who.reason, changeset_id=outcome.changeset_id
    )
    await _audit(session, review, who, "review.approved", {"changeset_id": str(outcome.changeset_id)})
    await _announce(session, review, "approved", who, outcome.changeset_id)
    await session.refresh(review)
    return review


@tracing.operation("reject review")
async def reject(session: AsyncSession, tenant_id: uuid.UUID, review_id: uuid.UUID, *, who: Actor) -> Review:
    """Record that the held op is not to be applied; no memory changes."""
    review = await _pending(session, tenant_id, review_id)
    await ReviewRepository(session).decide(review, status="rejected", actor=who.actor, reason=who.reason)
    await _audit(session, review, who, "review.rejected", {})
    await _announce(session, review, "rejected", who, None)
    await session.refresh(review)
    return review


async def _audit(
    session: AsyncSession, review: Review, who: Actor, action: str, extra: dict[str, object]
) -> None:
    await record_event(
        session,
        tenant_id=review.tenant_id,
        actor=who.actor,
        action=action,
        target_type="review",
        target_id=str(review.id),
        request_id=who.request_id,
        summary={
            "user_id": review.user_id,
            "op": review.op.get("op"),
            "memory_ids": [t["memory_id"] for t in review.targets],
            "writer": review.writer,
            "model": review.model,
            "chunk_id": str(review.chunk_id) if review.chunk_id else None,
            "reason": who.reason,
            **extra,
        },
    )


async def _announce(
    session: AsyncSession, review: Review, decision: str, who: Actor, changeset_id: uuid.UUID | None
) -> None:
    """`review.decided`, after the `memory.*` events of the approval's changeset (if any)."""
    await announce(
        session,
        [
            Announcement(
                tenant_id=review.tenant_id,
                user_id=review.user_id,
                type="review.decided",
                data={
                    "review_id": str(review.id),
                    "user_id": review.user_id,
                    "decision": decision,
                    "decided_by": who.actor,
                    "reason": who.reason,
                    "op": review.op.get("op"),
                    "memory_ids": [t["memory_id"] for t in review.targets],
                    "held_by_changeset_id": str(review.changeset_id),
                    "changeset_id": str(changeset_id) if changeset_id else None,
                    "chunk_id": str(review.chunk_id) if review.chunk_id else None,
                    "writer": review.writer,
                    "model": review.model,
                },
                changeset_id=changeset_id,
            )
        ],
    )
