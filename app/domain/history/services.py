"""Undo as new history: rollback of a memory, revert of changesets, restore of a bank, and purge.

Every undo computes a target state per memory, compares it with the memory's head, and writes the
memories that differ as new versions (op ROLLBACK or RESTORE) under one new changeset of kind
`rollback`, `revert` or `restore` — so an undo is attributed, audited, and can itself be reverted.
A dry run computes the same diff and writes nothing. Services never commit: the request (or CLI
command) makes each call one transaction.

No network call is made while the undo holds a lock or a transaction it began. A restored text whose
stored vector is another model's (`HistoryRepository.stale_vectors`: a `memstore reembed` since) must be
embedded again, and which texts those are is only known under the heads' locks. So an undo runs as
attempts: one that finds a text not embedded yet writes nothing and raises `_Unembedded`; its
transaction is rolled back (when the undo began it: a request's session has none open when its handler
starts) or its savepoint is (when the caller had one open: the caller's transaction stays, the undo's
row locks go); the texts are embedded; and the undo runs again from the start. Running again locks and
reads the heads again, so a memory changed while texts were embedded is planned from its new head, and
only a text that became stale meanwhile needs another round (`_EMBED_ROUNDS`, then 409 `memory_changed`).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Changeset
from app.domain.audit.services import Actor, record_event, record_purge
from app.domain.history.repositories import HistoryRepository
from app.domain.memories.repositories import ChangesetRepository, VersionState
from app.domain.memories.services import get_memory
from app.domain.memories.version_writer import Restoration, VersionWriter
from app.domain.pipeline.locks import scope_lock_key
from app.domain.shadows.services import banks as shadow_banks
from app.domain.webhooks.events import Announcement, announce
from app.embeddings import Embedder
from app.lib import tracing
from app.lib.errors import (
    AlreadyReverted,
    MemoryChanged,
    NotFoundError,
    RevertConflict,
    TooManyChangesets,
)

T = TypeVar("T")

# Texts embedded by the current embedder for this undo, by text (a vector depends on the text alone).
Embedded = dict[str, list[float]]

# Rounds of embedding one undo may take before it gives up with 409: the second round only happens when
# a text became stale while the first round's texts were embedded.
_EMBED_ROUNDS = 3


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


@dataclass(frozen=True)
class ScopeUndo:
    """One scope's part of an undo: its locked heads, the state each memory goes to, and what the new
    changeset's `target` records."""

    user_id: str
    heads: dict[uuid.UUID, VersionState]
    targets: dict[uuid.UUID, VersionState]
    target: dict[str, Any]


class _Unembedded(Exception):  # noqa: N818  (a signal between an attempt and its retry, not an error)
    """An attempt needs these texts embedded before it can write; raised before it writes anything."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__(f"{len(texts)} texts to embed")
        self.texts = texts


async def _embedding_outside_locks(
    session: AsyncSession, embedder: Embedder, attempt: Callable[[Embedded], Awaitable[T]]
) -> T:
    """Run `attempt` until it finds every text it must embed already embedded (module docstring).

    A rollback of a transaction the undo began also expires what the session had loaded before; the
    callers (a request's handler, the CLI) hold nothing from it."""
    embedded: Embedded = {}
    began_here = not session.in_transaction()
    rounds = 0
    while True:
        try:
            if began_here:
                return await attempt(embedded)
            async with session.begin_nested():
                return await attempt(embedded)
        except _Unembedded as unembedded:
            if began_here:
                await session.rollback()  # only this undo's reads and locks: it wrote nothing yet
            if rounds == _EMBED_ROUNDS:
                raise MemoryChanged(
                    "The memories kept changing while their restored texts were embedded; retry."
                ) from None
            texts = unembedded.texts
        rounds += 1
        embedded.update(zip(texts, await embedder.embed(texts), strict=True))


async def write_undo(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    scopes: Sequence[ScopeUndo],
    *,
    kind: str,
    op: str,
    who: Actor,
    embedded: Embedded,
    result: UndoResult,
) -> None:
    """Plan every scope's restorations and (unless a dry run) write each scope's under a new changeset.

    Raises `_Unembedded`, before writing anything, when a restored text needs a vector not in
    `embedded`."""
    planned = []
    for scope in scopes:
        restorations, diff = plan_restorations(scope.heads, scope.targets)
        result.diff.extend(diff)
        if restorations:
            planned.append((scope, restorations))
    if result.dry_run or not planned:
        return
    repo = HistoryRepository(session)
    # A restored text whose stored vector predates the current embedder (a `memstore reembed` since)
    # gets the current embedder's vector: the bank never mixes vectors of two models.
    stale = await repo.stale_vectors(tenant_id, [r for _, restorations in planned for r in restorations])
    missing = sorted({content for _, content in stale if content not in embedded})
    if missing:
        raise _Unembedded(missing)
    vectors = {memory_id: embedded[content] for memory_id, content in stale}
    version_writer = VersionWriter(session)
    announcements: list[Announcement] = []
    for scope, restorations in planned:
        changeset_id = uuid.uuid4()
        await ChangesetRepository(session).insert_many(
            [
                {
                    "id": changeset_id,
                    "tenant_id": tenant_id,
                    "user_id": scope.user_id,
                    "kind": kind,
                    "actor": who.actor,
                    "reason": who.reason,
                    "target": scope.target,
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
        await version_writer.write_restorations(
            tenant_id=tenant_id,
            user_id=scope.user_id,
            changeset_id=changeset_id,
            op=op,
            actor=who.actor,
            reason=who.reason,
            restorations=restorations,
            vectors={r.memory_id: vectors[r.memory_id] for r in restorations if r.memory_id in vectors},
        )
        result.changeset_ids.append(changeset_id)
        announcements.append(
            Announcement(tenant_id=tenant_id, user_id=scope.user_id, changeset_id=changeset_id)
        )
    # The webhooks' `memory.*` events of the new changesets (`webhooks.events`), in this transaction.
    await announce(session, announcements)


# --- rollback ------------------------------------------------------------------------------------


@tracing.operation("rollback memory", memory_operation="update_memory")
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

    async def attempt(embedded: Embedded) -> UndoResult:
        memory = await get_memory(session, tenant_id, memory_id)
        repo = HistoryRepository(session)
        heads = await repo.lock_heads(tenant_id, memory.user_id, [memory_id])
        head = heads[memory_id]
        if not 1 <= to_version <= head.version:  # (the schema says >= 1; the memory, how many it has)
            raise NotFoundError(
                f"The memory has no version {to_version}; its versions are 1 to {head.version}.",
                details={"field": "to_version", "max": head.version},
            )
        source = (await repo.states_at(tenant_id, [(memory_id, to_version)]))[(memory_id, to_version)]
        target = {"memory_id": str(memory_id), "to_version": to_version}
        result = UndoResult(dry_run=dry_run)
        await write_undo(
            session,
            tenant_id,
            [ScopeUndo(memory.user_id, heads, {memory_id: source}, target)],
            kind="rollback",
            op="ROLLBACK",
            who=who,
            embedded=embedded,
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

    return await _embedding_outside_locks(session, embedder, attempt)


# --- revert --------------------------------------------------------------------------------------


@tracing.operation("revert changeset", memory_operation="update_memory")
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

    async def attempt(embedded: Embedded) -> UndoResult:
        changeset = await HistoryRepository(session).changeset(tenant_id, changeset_id, lock=True)
        if changeset is None:
            raise NotFoundError("No such changeset.")
        if changeset.status == "reverted":
            raise AlreadyReverted("The changeset is already reverted.")
        result = await _revert_changesets(
            session, tenant_id, [changeset], who=who, embedded=embedded, force=force, dry_run=dry_run
        )
        if not dry_run:
            await _audit(
                session, tenant_id, who, "changeset.reverted", "changeset", str(changeset_id), result
            )
        return result

    return await _embedding_outside_locks(session, embedder, attempt)


@tracing.operation("bulk revert", memory_operation="update_memory")
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
    max_changesets: int = 0,
) -> UndoResult:
    """Revert every applied writer changeset matching, newest first ("undo what model X wrote since
    Tuesday"). Each user's bank gets one revert changeset. More than `max_changesets` (0: no bound)
    matching is refused with 422 and the count, so that one request cannot hold locks on a whole
    tenant's history: narrow it by user, or revert window by window."""

    async def attempt(embedded: Embedded) -> UndoResult:
        matching = await HistoryRepository(session).changesets(
            tenant_id,
            user_id=user_id,
            writer=writer,
            model=model,
            kind=("writer", "review"),  # what the model wrote, and its held ops that were approved
            status="applied",
            since=since,
            until=until,
            lock=True,
        )
        if max_changesets and len(matching) > max_changesets:
            raise TooManyChangesets(
                f"{len(matching)} changesets match, more than one revert takes ({max_changesets}); "
                "narrow it by user_id or until.",
                details={"matching": len(matching), "most": max_changesets},
            )
        result = await _revert_changesets(
            session, tenant_id, matching, who=who, embedded=embedded, force=force, dry_run=dry_run
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

    return await _embedding_outside_locks(session, embedder, attempt)


async def _revert_changesets(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    changesets: Sequence[Changeset],
    *,
    who: Actor,
    embedded: Embedded,
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
    for touch in await repo.touches(tenant_id, ids):
        seen = first[touch.user_id].get(touch.memory_id)
        if seen is None or touch.version < seen:
            first[touch.user_id][touch.memory_id] = touch.version
    scopes = []
    for user_id in sorted(first):
        earliest = first[user_id]
        heads = await repo.lock_heads(tenant_id, user_id, sorted(earliest))
        result.conflicts.extend(await repo.later_touches(tenant_id, earliest, ids))
        states = await repo.states_at(tenant_id, [(m, max(1, v - 1)) for m, v in earliest.items()])
        targets = {
            m: states[(m, v - 1)] if v > 1 else replace(states[(m, 1)], status="deleted")
            for m, v in earliest.items()
        }
        target = {"changesets": [str(c.id) for c in changesets if c.user_id == user_id]}
        scopes.append(ScopeUndo(user_id, heads, targets, target))
    if result.conflicts and not force and not dry_run:
        raise RevertConflict(
            "Later changes touched memories this would revert; pass force to revert them anyway.",
            details={"conflicts": result.conflicts},
        )
    await write_undo(
        session, tenant_id, scopes, kind="revert", op="ROLLBACK", who=who, embedded=embedded, result=result
    )
    result.reverted = ids
    if not dry_run:
        await repo.mark_reverted(tenant_id, ids)
    return result


# --- restore -------------------------------------------------------------------------------------


@tracing.operation("restore user", memory_operation="update_memory")
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

    async def attempt(embedded: Embedded) -> UndoResult:
        heads, then = await HistoryRepository(session).lock_heads_with_past(tenant_id, user_id, as_of)
        targets = {m: then.get(m) or replace(head, status="deleted") for m, head in heads.items()}
        result = UndoResult(dry_run=dry_run)
        await write_undo(
            session,
            tenant_id,
            [ScopeUndo(user_id, heads, targets, {"as_of": as_of.isoformat()})],
            kind="restore",
            op="RESTORE",
            who=who,
            embedded=embedded,
            result=result,
        )
        if result.changeset_ids:
            await _audit(
                session, tenant_id, who, "user.restored", "user", user_id, result, as_of=as_of.isoformat()
            )
        return result

    return await _embedding_outside_locks(session, embedder, attempt)


# --- purge, reads ------------------------------------------------------------------------


@tracing.operation("purge user", memory_operation="delete_memory")
async def purge_user(
    session: AsyncSession, tenant_id: uuid.UUID, user_id: str, *, who: Actor, dry_run: bool = False
) -> dict[str, int]:
    """GDPR erasure: the user's chunks, memories, versions and changesets are deleted; the audit log
    keeps one event saying so, with row counts and no content.

    Taken under the scope's advisory lock (waiting for a worker draining it), so no apply can
    write the user's memories back while the purge runs."""
    repo = HistoryRepository(session)
    # The user's copies in the tenant's shadow banks go with them, under each bank's scope lock.
    tenants = [tenant_id, *(bank.id for bank in await shadow_banks(session, tenant_id))]
    counts: dict[str, int] = {}
    for owner in tenants:
        if dry_run:
            found = await repo.count_user_rows(owner, user_id)
        else:
            await session.execute(select(func.pg_advisory_xact_lock(scope_lock_key(owner, user_id))))
            found = await repo.purge_user(owner, user_id)
        for kind, count in found.items():
            counts[kind] = counts.get(kind, 0) + count
    if dry_run:
        return counts
    # Written as the tables' owner, as the purge deleted (a Citus cluster wants one user on them).
    await record_purge(session, tenant_id=tenant_id, user_id=user_id, deleted=counts, who=who)
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
