"""Undo as new history: rollback of a memory, revert of changesets, restore of a bank, and purge.

Every undo computes a target state per memory, compares it with the memory's head, and writes the
memories that differ as new versions (op ROLLBACK or RESTORE) under one new changeset of kind
`rollback`, `revert` or `restore` — so an undo is attributed, audited, and can itself be reverted.
A dry run computes the same diff and writes nothing. Services never commit: the request (or CLI
command) makes each call one transaction.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Changeset, Chunk
from app.domain.audit.services import record_event
from app.domain.history.repositories import HistoryRepository, Restoration
from app.domain.memories.repositories import ChangesetRepository, VersionState
from app.domain.memories.services import get_memory
from app.domain.pipeline.locks import scope_lock_key
from app.embeddings import Embedder
from app.lib.errors import ApiError, ConflictError, NotFoundError


@dataclass(frozen=True)
class Actor:
    """Who asks for an undo, and the request it came with (for provenance and the audit log)."""

    actor: str
    request_id: str | None = None
    reason: str | None = None


@dataclass
class UndoResult:
    """What an undo did (or would do): api.md's diff object, plus the changesets it wrote or reverted."""

    dry_run: bool
    diff: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    changeset_ids: list[uuid.UUID] = field(default_factory=list)
    reverted: list[uuid.UUID] = field(default_factory=list)

    @property
    def changeset_id(self) -> uuid.UUID | None:
        return self.changeset_ids[0] if self.changeset_ids else None


def _brief(state: VersionState, version: int | None = None) -> dict[str, Any]:
    return {
        "content": state.content,
        "status": state.status,
        "version": state.version if version is None else version,
    }


def plan_restorations(
    heads: dict[uuid.UUID, VersionState], targets: dict[uuid.UUID, VersionState]
) -> tuple[list[Restoration], list[dict[str, Any]]]:
    """The new versions that bring each memory from its head to its target state, and their diff.

    A target is the state of a stored version (possibly with another status); memories already in
    their target state get no version."""
    restorations: list[Restoration] = []
    diff: list[dict[str, Any]] = []
    for memory_id, target in targets.items():
        head = heads.get(memory_id)
        if head is None or head.same_state(target):
            continue
        new_version = head.version + 1
        restorations.append(Restoration(memory_id, target.version, new_version, target.status))
        diff.append(
            {"memory_id": str(memory_id), "before": _brief(head), "after": _brief(target, new_version)}
        )
    return restorations, diff


async def write_restorations(
    session: AsyncSession,
    *,
    tenant_id: uuid.UUID,
    user_id: str,
    kind: str,
    op: str,
    who: Actor,
    embedder: Embedder,
    target: dict[str, Any],
    heads: dict[uuid.UUID, VersionState],
    targets: dict[uuid.UUID, VersionState],
    result: UndoResult,
) -> None:
    """Plan and (unless a dry run) write one scope's restorations under a new changeset."""
    restorations, diff = plan_restorations(heads, targets)
    result.diff.extend(diff)
    if result.dry_run or not restorations:
        return
    changeset_id = uuid.uuid4()
    await ChangesetRepository(session).insert_many(
        [
            {
                "id": changeset_id,
                "tenant_id": tenant_id,
                "user_id": user_id,
                "kind": kind,
                "actor": who.actor,
                "reason": who.reason,
                "target": target,
                "ops": [
                    {
                        "op": op,
                        "memory_id": str(r.memory_id),
                        "from_version": r.new_version - 1,
                        "state_of_version": r.source_version,
                        "status": r.status,
                        "version": r.new_version,
                    }
                    for r in restorations
                ],
            }
        ]
    )
    repo = HistoryRepository(session)
    # A restored text whose stored vector predates the current embedder (a `memstore reembed` since)
    # is embedded again: the bank never mixes vectors of two models.
    stale = await repo.stale_vectors(tenant_id, restorations)
    fresh = await embedder.embed([content for _, content in stale]) if stale else []
    await repo.write_restorations(
        tenant_id=tenant_id,
        user_id=user_id,
        changeset_id=changeset_id,
        op=op,
        actor=who.actor,
        reason=who.reason,
        restorations=restorations,
        vectors={memory_id: vector for (memory_id, _), vector in zip(stale, fresh, strict=True)},
    )
    result.changeset_ids.append(changeset_id)


# --- rollback ------------------------------------------------------------------------------------


async def rollback_memory(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    memory_id: uuid.UUID,
    *,
    to_version: int,
    who: Actor,
    embedder: Embedder,
    dry_run: bool = False,
) -> UndoResult:
    """The memory becomes what it was at `to_version` (a new version, op ROLLBACK)."""
    memory = await get_memory(session, tenant_id, memory_id)
    repo = HistoryRepository(session)
    heads = await repo.lock_heads(tenant_id, memory.user_id, [memory_id])
    head = heads[memory_id]
    if not 1 <= to_version <= head.version:
        raise ApiError(
            f"to_version must be between 1 and {head.version}.",
            code="validation_error",
            status_code=422,
            details={"field": "to_version", "max": head.version},
        )
    source = (await repo.states_at(tenant_id, [(memory_id, to_version)]))[(memory_id, to_version)]
    result = UndoResult(dry_run=dry_run)
    await write_restorations(
        session,
        tenant_id=tenant_id,
        user_id=memory.user_id,
        kind="rollback",
        op="ROLLBACK",
        who=who,
        embedder=embedder,
        target={"memory_id": str(memory_id), "to_version": to_version},
        heads=heads,
        targets={memory_id: source},
        result=result,
    )
    if result.changeset_ids:
        await _audit(
            session,
            tenant_id,
            who,
            "memory.rolled_back",
            "memory",
            str(memory_id),
            result,
            to_version=to_version,
        )
    return result


# --- revert --------------------------------------------------------------------------------------


async def revert_changeset(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    changeset_id: uuid.UUID,
    *,
    who: Actor,
    embedder: Embedder,
    force: bool = False,
    dry_run: bool = False,
) -> UndoResult:
    """Undo every write of one changeset (ADD -> deleted, others -> the state before it)."""
    changeset = await HistoryRepository(session).changeset(tenant_id, changeset_id, lock=True)
    if changeset is None:
        raise NotFoundError("No such changeset.")
    if changeset.status == "reverted":
        raise ConflictError("The changeset is already reverted.", code="already_reverted")
    result = await revert_changesets(
        session, tenant_id, [changeset], who=who, embedder=embedder, force=force, dry_run=dry_run
    )
    if not dry_run:
        await _audit(session, tenant_id, who, "changeset.reverted", "changeset", str(changeset_id), result)
    return result


async def bulk_revert(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    since: datetime,
    until: datetime | None,
    writer: str | None,
    model: str | None,
    user_id: str | None,
    who: Actor,
    embedder: Embedder,
    force: bool = False,
    dry_run: bool = False,
) -> UndoResult:
    """Revert every applied writer changeset matching, newest first ("undo what model X wrote since
    Tuesday"). Each user's bank gets one revert changeset."""
    matching = await HistoryRepository(session).changesets(
        tenant_id,
        user_id=user_id,
        writer=writer,
        model=model,
        kind="writer",
        status="applied",
        since=since,
        until=until,
        lock=True,
    )
    result = await revert_changesets(
        session, tenant_id, matching, who=who, embedder=embedder, force=force, dry_run=dry_run
    )
    if not dry_run:
        await _audit(
            session,
            tenant_id,
            who,
            "changesets.reverted",
            "changesets",
            None,
            result,
            filter={
                "writer": writer,
                "model": model,
                "user_id": user_id,
                "since": since.isoformat(),
                "until": until.isoformat() if until else None,
            },
        )
    return result


async def revert_changesets(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    changesets: Sequence[Changeset],
    *,
    who: Actor,
    embedder: Embedder,
    force: bool,
    dry_run: bool,
) -> UndoResult:
    """Undo a set of changesets, newest first.

    Reverting newest first, one by one, leaves each memory as it was before the earliest changeset of
    the set that wrote it; that is computed directly, per memory. A conflict is a version written
    after that point by a changeset outside the set: unless `force`, nothing is written and 409
    lists the conflicts; with `force` the memory still goes back to its state before the set.
    """
    result = UndoResult(dry_run=dry_run)
    ids = [c.id for c in changesets]
    repo = HistoryRepository(session)
    first: dict[str, dict[uuid.UUID, int]] = defaultdict(dict)
    for touch in await repo.touches(ids):
        seen = first[touch.user_id].get(touch.memory_id)
        if seen is None or touch.version < seen:
            first[touch.user_id][touch.memory_id] = touch.version
    plans = []
    for user_id in sorted(first):
        earliest = first[user_id]
        heads = await repo.lock_heads(tenant_id, user_id, sorted(earliest))
        result.conflicts.extend(await repo.later_touches(tenant_id, earliest, ids))
        states = await repo.states_at(tenant_id, [(m, max(1, v - 1)) for m, v in earliest.items()])
        targets = {
            m: states[(m, v - 1)] if v > 1 else replace(states[(m, 1)], status="deleted")
            for m, v in earliest.items()
        }
        plans.append((user_id, heads, targets))
    if result.conflicts and not force and not dry_run:
        raise ConflictError(
            "Later changes touched memories this would revert; pass force to revert them anyway.",
            code="revert_conflict",
            details={"conflicts": result.conflicts},
        )
    for user_id, heads, targets in plans:
        await write_restorations(
            session,
            tenant_id=tenant_id,
            user_id=user_id,
            kind="revert",
            op="ROLLBACK",
            who=who,
            embedder=embedder,
            target={"changesets": [str(c.id) for c in changesets if c.user_id == user_id]},
            heads=heads,
            targets=targets,
            result=result,
        )
    result.reverted = ids
    if not dry_run:
        await repo.mark_reverted(ids)
    return result


# --- restore -------------------------------------------------------------------------------------


async def restore_user(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    user_id: str,
    *,
    as_of: datetime,
    who: Actor,
    embedder: Embedder,
    dry_run: bool = False,
) -> UndoResult:
    """The user's bank becomes what it was at `as_of`: each memory takes the state it had then, and
    memories created later are deleted. One changeset (kind `restore`, op RESTORE) for all of it."""
    heads, then = await HistoryRepository(session).lock_heads_with_past(tenant_id, user_id, as_of)
    targets = {m: then.get(m) or replace(head, status="deleted") for m, head in heads.items()}
    result = UndoResult(dry_run=dry_run)
    await write_restorations(
        session,
        tenant_id=tenant_id,
        user_id=user_id,
        kind="restore",
        op="RESTORE",
        who=who,
        embedder=embedder,
        target={"as_of": as_of.isoformat()},
        heads=heads,
        targets=targets,
        result=result,
    )
    if result.changeset_ids:
        await _audit(
            session, tenant_id, who, "user.restored", "user", user_id, result, as_of=as_of.isoformat()
        )
    return result


# --- chunks, purge, reads ------------------------------------------------------------------------


async def retry_chunk(
    session: AsyncSession, tenant_id: uuid.UUID, chunk_id: uuid.UUID, *, who: Actor, dry_run: bool = False
) -> Chunk:
    """A failed chunk goes back to the queue with a fresh set of attempts (the caller wakes a worker
    after the commit). A dry run only checks that it could."""
    repo = HistoryRepository(session)
    if dry_run:
        found = await repo.chunk(tenant_id, chunk_id)
        chunk = found if found is not None and found.status == "failed" else None
    else:
        chunk = await repo.requeue_failed_chunk(tenant_id, chunk_id)
    if chunk is None:
        existing = await repo.chunk(tenant_id, chunk_id)
        if existing is None:
            raise NotFoundError("No such chunk.")
        raise ConflictError(
            f"Only a failed chunk can be retried; this one is {existing.status}.",
            code="chunk_not_failed",
            details={"status": existing.status},
        )
    if dry_run:
        return chunk
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=who.actor,
        action="chunk.retried",
        target_type="chunk",
        target_id=str(chunk_id),
        request_id=who.request_id,
        summary={"seq": chunk.seq},
    )
    return chunk


async def purge_user(
    session: AsyncSession, tenant_id: uuid.UUID, user_id: str, *, who: Actor, dry_run: bool = False
) -> dict[str, int]:
    """GDPR erasure: the user's chunks, memories, versions and changesets are deleted; the audit log
    keeps one event saying so, with row counts and no content.

    Taken under the scope's advisory lock (waiting for a worker draining it), so no apply can
    write the user's memories back while the purge runs."""
    if dry_run:
        return await HistoryRepository(session).count_user_rows(tenant_id, user_id)
    await session.execute(select(func.pg_advisory_xact_lock(scope_lock_key(tenant_id, user_id))))
    counts = await HistoryRepository(session).purge_user(tenant_id, user_id)
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=who.actor,
        action="user.purged",
        target_type="user",
        target_id=user_id,
        request_id=who.request_id,
        summary={"deleted": counts},
    )
    return counts


async def get_changeset(
    session: AsyncSession, tenant_id: uuid.UUID, changeset_id: uuid.UUID, *, who: Actor
) -> Changeset:
    """One changeset with the writer's raw output; reading raw model output is itself audited."""
    changeset = await HistoryRepository(session).changeset(tenant_id, changeset_id)
    if changeset is None:
        raise NotFoundError("No such changeset.")
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=who.actor,
        action="changeset.raw_read",
        target_type="changeset",
        target_id=str(changeset_id),
        request_id=who.request_id,
    )
    return changeset


async def _audit(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    who: Actor,
    action: str,
    target_type: str,
    target_id: str | None,
    result: UndoResult,
    **extra: Any,
) -> None:
    """An undo's audit event: which changesets it wrote and reverted and how many memories changed,
    never their content."""
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=who.actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        request_id=who.request_id,
        summary={
            "changesets": [str(c) for c in result.changeset_ids],
            "reverted": [str(c) for c in result.reverted],
            "memories": len(result.diff),
            "forced": bool(result.conflicts),
            **extra,
        },
    )
