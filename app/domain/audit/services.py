"""Recording and verifying audit events."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AuditEvent
from app.domain.audit.chain import GENESIS_HASH, event_hash
from app.domain.audit.repositories import AuditRepository


async def record_event(
    session: AsyncSession,
    *,
    tenant_id: uuid.UUID,
    actor: str,
    action: str,
    target_type: str | None = None,
    target_id: str | None = None,
    request_id: str | None = None,
    summary: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event to the tenant's chain inside the caller's transaction.

    Call it last in a transaction: it holds the tenant's chain head locked until commit.
    """
    repo = AuditRepository(session)
    head = await repo.lock_head(tenant_id)
    seq = head.seq + 1
    created = datetime.now(UTC)
    summary = summary or {}
    digest = event_hash(
        tenant_id=tenant_id,
        seq=seq,
        prev_hash=head.hash,
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        request_id=request_id,
        summary=summary,
        created_at=created,
    )
    event = AuditEvent(
        tenant_id=tenant_id,
        seq=seq,
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        request_id=request_id,
        summary=summary,
        created_at=created,
        prev_hash=head.hash,
        hash=digest,
    )
    repo.add(event)
    head.seq = seq
    head.hash = digest
    return event


@dataclass(frozen=True)
class ChainVerdict:
    """Result of walking a tenant's chain: ok, how many events were checked, and the first bad one."""

    ok: bool
    checked: int
    broken_at_seq: int | None = None
    reason: str | None = None


async def verify_chain(session: AsyncSession, tenant_id: uuid.UUID) -> ChainVerdict:
    """Recompute every link; report the first event whose hash, link or position is wrong."""
    prev_hash, expected_seq, checked = GENESIS_HASH, 1, 0
    async for event in AuditRepository(session).stream(tenant_id):
        if event.seq != expected_seq:
            return ChainVerdict(False, checked, expected_seq, "missing or inserted event")
        if event.prev_hash != prev_hash:
            return ChainVerdict(False, checked, event.seq, "link to the previous event is broken")
        recomputed = event_hash(
            tenant_id=event.tenant_id,
            seq=event.seq,
            prev_hash=event.prev_hash,
            actor=event.actor,
            action=event.action,
            target_type=event.target_type,
            target_id=event.target_id,
            request_id=event.request_id,
            summary=event.summary,
            created_at=event.created_at,
        )
        if recomputed != event.hash:
            return ChainVerdict(False, checked, event.seq, "event content does not match its hash")
        prev_hash, expected_seq, checked = event.hash, expected_seq + 1, checked + 1
    head = await AuditRepository(session).head(tenant_id)
    if head is not None and (head.seq != checked or head.hash != prev_hash):
        # The newest events were deleted: the chain is intact but shorter than its recorded head.
        return ChainVerdict(False, checked, checked + 1, "events missing at the end of the chain")
    return ChainVerdict(True, checked)
