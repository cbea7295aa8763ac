"""Applying ops as new versions under one changeset per request.

`apply_ops` (one request) and `apply_many` (a group commit's) are the way every op reaches the bank: a
writer's results, hand edits and approved reviews all go through them, so every write gets a version
row with provenance and every batch of writes a changeset. Undo and import write history that already
exists elsewhere (`history`, `transfer`); all of them write the rows through `VersionWriter`. An apply
never commits; the caller's transaction makes the whole apply atomic.

No network call is made while the apply holds locks: the texts an apply may store are embedded first
(`embed_ops`, a model server call of up to tens of seconds with its retries), then the target
memories are locked `FOR UPDATE`, their versions checked against what the writer was shown
(`guards`), and the rows built (`rows`) and written. A memory that changed while its text was being
embedded is caught by that check (a `stale_target` guard), and a vector embedded for an op the guards
then drop is simply not used.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.memories.repositories import ChangesetRepository, MemoryRepository, MemoryState
from app.domain.memories.services.guards import (
    WRITES_CONTENT,
    Checked,
    Plan,
    check_ops,
    find_near_duplicates,
)
from app.domain.memories.services.requests import (
    ApplyLimits,
    ApplyOutcome,
    ApplyRequest,
    Provenance,
    Shown,
    Vectors,
)
from app.domain.memories.services.rows import Rows
from app.domain.memories.version_writer import VersionWriter
from app.domain.reviews.repositories import ReviewRepository
from app.embeddings import Embedder
from app.writers.base import Op

# The expiry of a memory as shown: not known, so no UPDATE that sets or clears one is left unembedded.
_UNKNOWN_EXPIRY = datetime.min.replace(tzinfo=UTC)


def texts_to_embed(requests: Sequence[ApplyRequest]) -> list[str]:
    """The texts `apply_many` may store for `requests`, once each: those of the ops the guards let
    through (or hold for review) if every memory shown is as it was shown, together or each alone. A
    memory that changed since drops more ops under the locks (`stale_target`), and an op dropped so may
    free another that was dropped for its sake (`duplicate_target`: two ops on one memory), which each op
    checked alone finds; so no text `apply_many` looks up is missing. A NOOP, a DELETE, an op the guards
    drop alone, or an UPDATE repeating what was shown costs no embedding."""
    texts: dict[str, None] = {}
    for request in requests:
        as_shown = {
            shown.memory_id: MemoryState(
                shown.memory_id,
                shown.version,
                "active",
                shown.content or "",  # unknown: no UPDATE counts as repeating it
                shown.tags,
                "user",  # no guard reads the owner
                shown.memory_at,
                _UNKNOWN_EXPIRY,  # so an UPDATE that sets or clears one counts as a change
            )
            for shown in request.shown.values()
        }
        alone = [(op,) for op in request.ops if op.kind in WRITES_CONTENT] if len(request.ops) > 1 else []
        for ops in (request.ops, *alone):
            held: Checked = []
            accepted = check_ops(ops, request.shown, as_shown, [], request.memory_at, request.limits, held)
            for _, op, _ in [*accepted, *held]:
                if op.kind in WRITES_CONTENT:
                    texts[(op.content or "").strip()] = None
    return list(texts)


async def embed_ops(embedder: Embedder, requests: Sequence[ApplyRequest]) -> dict[str, list[float]]:
    """The vectors `apply_many` needs for `requests`; call it before opening the apply's transaction."""
    texts = texts_to_embed(requests)
    return dict(zip(texts, await embedder.embed(texts), strict=True)) if texts else {}


async def apply_ops(
    session: AsyncSession,
    *,
    tenant_id: uuid.UUID,
    user_id: str,
    ops: Sequence[Op],
    shown: dict[int, Shown],
    provenance: Provenance,
    embedder: Embedder,
    vectors: Vectors | None = None,
    agent_id: str | None = None,
    run_id: str | None = None,
    memory_at: datetime | None = None,
    raw_output: str | None = None,
    usage: dict[str, Any] | None = None,
    guards: list[dict[str, Any]] | None = None,
    changeset_id: uuid.UUID | None = None,
    limits: ApplyLimits | None = None,
) -> ApplyOutcome:
    """Validate `ops` against what the writer was shown and write them; return the changeset.

    Ops that name an id the writer was not shown, touch a memory twice, or target a memory that
    changed since it was shown are dropped and recorded as guards on the changeset. The texts are
    embedded before any lock is taken, unless the caller did so already (`vectors`, from `embed_ops`):
    a caller that must not keep a transaction open across the model call embeds before its first
    statement.
    """
    request = ApplyRequest(
        tenant_id=tenant_id,
        user_id=user_id,
        ops=ops,
        shown=shown,
        provenance=provenance,
        agent_id=agent_id,
        run_id=run_id,
        memory_at=memory_at,
        raw_output=raw_output,
        usage=usage,
        guards=guards or (),
        changeset_id=changeset_id or uuid.uuid4(),
        limits=limits or ApplyLimits(),
    )
    if vectors is None:
        vectors = await embed_ops(embedder, [request])
    [outcome] = await apply_many(session, [request], vectors)
    return outcome


async def apply_many(
    session: AsyncSession, requests: Sequence[ApplyRequest], vectors: Vectors
) -> list[ApplyOutcome]:
    """`apply_ops` for several changesets (of any scopes) at once, in the caller's transaction.

    `vectors` holds the vector of every text the ops may store (`embed_ops`, called before the
    transaction): nothing here waits on a model server while the target memories are locked.
    The writes are a handful of bulk statements, whatever the number of requests and ops: the
    workers apply the results of many scopes together (group commit), and a changeset's rows are
    the same whether it was applied alone or with others.
    """
    memories = MemoryRepository(session)
    targets = {
        (r.tenant_id, r.shown[t].memory_id)
        for r in requests
        for op in r.ops
        for t in op.targets
        if t in r.shown
    }
    locked = await memories.lock_states(sorted(targets, key=lambda t: t[1]))
    plans: list[Plan] = []
    for request in requests:
        guards = list(request.guards)
        in_scope = {
            memory_id: state
            for (tenant_id, user_id, memory_id), state in locked.items()
            if tenant_id == request.tenant_id and user_id == request.user_id
        }
        held: Checked = []
        accepted = check_ops(
            request.ops, request.shown, in_scope, guards, request.memory_at, request.limits, held
        )
        plan = Plan(request, accepted, guards, held)
        for _, op, _ in accepted:
            if op.kind in WRITES_CONTENT:
                text = (op.content or "").strip()
                if text not in vectors:
                    msg = f"no vector for {text[:80]!r}: embed the ops (embed_ops) before applying them"
                    raise ValueError(msg)
                plan.vectors.append(list(vectors[text]))
        plans.append(plan)
    await find_near_duplicates(memories, plans)

    rows = Rows()
    outcomes = [rows.add(plan) for plan in plans]
    await ChangesetRepository(session).insert_many(rows.changesets)
    await ReviewRepository(session).insert_many(rows.reviews)
    await VersionWriter(session).write_applied(rows.new, rows.changed, rows.versions)
    return outcomes
