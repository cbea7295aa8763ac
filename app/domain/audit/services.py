"""Recording, sealing and verifying audit events.

Recording is a plain insert inside the caller's transaction, so audited writes of one tenant never
wait for each other. Sealing links committed events into the tenant's hash chain in `id` order; the
workers run it every few seconds, so the unsealed tail is short (a verifier seals first if it wants
it empty).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.db.tenancy import tenant_scope
from app.domain.audit.chain import GENESIS_HASH, event_hash
from app.domain.audit.repositories import AuditRepository


@dataclass(frozen=True)
class Actor:
    """Who asks for a change, and the request it came with (for provenance and the audit log)."""

    actor: str
    request_id: str | None = None
    reason: str | None = None


def event_row(
    *,
    tenant_id: uuid.UUID,
    actor: str,
    action: str,
    target_type: str | None = None,
    target_id: str | None = None,
    request_id: str | None = None,
    summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The columns of a new, unsealed event (for bulk inserts)."""
    return {
        "tenant_id": tenant_id,
        "actor": actor,
        "action": action,
        "target_type": target_type,
        "target_id": target_id,
        "request_id": request_id,
        "summary": summary or {},
        "created_at": datetime.now(UTC),
    }


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
) -> None:
    """Add one event to the caller's transaction; it commits (or rolls back) with the change it records."""
    row = event_row(
        tenant_id=tenant_id,
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        request_id=request_id,
        summary=summary,
    )
    await AuditRepository(session).insert_many([row])


async def record_purge(
    session: AsyncSession,
    *,
    tenant_id: uuid.UUID,
    user_id: str,
    deleted: dict[str, int],
    who: Actor,
) -> None:
    """A purge's event (`user.purged`, the rows deleted per kind, no content), in the purge's
    transaction: the row `record_event` would add, written by the tables' owner as the purge's
    deletions are (`AuditRepository.insert_purge`)."""
    await AuditRepository(session).insert_purge(
        tenant_id,
        user_id,
        actor=who.actor,
        request_id=who.request_id,
        deleted=deleted,
        created_at=datetime.now(UTC),
    )


async def seal_chain(session: AsyncSession, tenant_id: uuid.UUID, limit: int = 5000) -> int:
    """Link up to `limit` unsealed events of a tenant into its chain; returns how many were sealed."""
    repo = AuditRepository(session)
    head = await repo.lock_head(tenant_id)
    events = await repo.unsealed(tenant_id, limit)
    seq, prev = head.seq, head.hash
    seals = []
    for event in events:
        seq += 1
        digest = event_hash(
            tenant_id=event.tenant_id,
            seq=seq,
            prev_hash=prev,
            actor=event.actor,
            action=event.action,
            target_type=event.target_type,
            target_id=event.target_id,
            request_id=event.request_id,
            summary=event.summary,
            created_at=event.created_at,
        )
        seals.append({"event_id": event.id, "new_seq": seq, "new_prev_hash": prev, "new_hash": digest})
        prev = digest
    await repo.seal(tenant_id, seals)
    head.seq, head.hash = seq, prev
    return len(seals)


async def seal_pending(engine: AsyncEngine) -> int:
    """Seal every tenant's unsealed events, one transaction per tenant."""
    async with AsyncSession(engine) as session:
        tenants = await AuditRepository(session).tenants_with_unsealed()
    total = 0
    for tenant_id in tenants:
        with tenant_scope([tenant_id]):
            async with AsyncSession(engine, expire_on_commit=False) as session, session.begin():
                total += await seal_chain(session, tenant_id)
    return total


@dataclass(frozen=True)
class ChainVerdict:
    """Result of walking a tenant's chain: ok, how many events were checked, and the first bad one."""

    ok: bool
    checked: int
    broken_at_seq: int | None = None
    reason: str | None = None
    unsealed: int = 0


async def verify_chain(session: AsyncSession, tenant_id: uuid.UUID) -> ChainVerdict:
    """Recompute every link of the sealed chain; report the first event whose hash, link or position
    is wrong. Events not yet sealed are counted, not checked."""
    repo = AuditRepository(session)
    # One snapshot for the walk and the head, so a sealer committing meanwhile cannot look like a
    # truncated chain.
    await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    prev_hash, expected_seq, checked = GENESIS_HASH, 1, 0
    async for event in repo.stream_sealed(tenant_id):
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
        assert event.hash is not None
        prev_hash, expected_seq, checked = event.hash, expected_seq + 1, checked + 1
    unsealed = await repo.count_unsealed(tenant_id)
    head = await repo.head(tenant_id)
    if head is not None and (head.seq != checked or head.hash != prev_hash):
        # The newest sealed events were deleted: the chain is intact but shorter than its head says.
        return ChainVerdict(False, checked, checked + 1, "events missing at the end of the chain", unsealed)
    return ChainVerdict(True, checked, unsealed=unsealed)


async def seal_and_verify(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID
) -> ChainVerdict:
    """Seal what is committed but not yet chained, then verify the whole chain (separate transactions:
    the walk reads one snapshot)."""
    while True:
        async with sessionmaker() as session, session.begin():
            if not await seal_chain(session, tenant_id):
                break
    async with sessionmaker() as session:
        return await verify_chain(session, tenant_id)
