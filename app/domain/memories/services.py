"""Reading memories, and applying ops as new versions under one changeset.

`apply_ops` is the only code that writes memories: writer results, and later manual edits and
admin undo, all go through it, so every write gets a version row with provenance and every batch of
writes a changeset. It never commits; the caller's transaction makes the whole apply atomic.

No network call is made while the apply holds locks: the texts an apply may store are embedded first
(`embed_ops`, a model server call of up to tens of seconds with its retries), then the target
memories are locked `FOR UPDATE`, their versions checked against what the writer was shown, and the
rows written. A memory that changed while its text was being embedded is caught by that check (a
`stale_target` guard), and a vector embedded for an op the guards then drop is simply not used.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Memory, MemoryVersion
from app.domain.audit.services import record_event
from app.domain.memories.polarity import opposite_polarity
from app.domain.memories.repositories import (
    ChangesetRepository,
    MemoryAsOf,
    MemoryRepository,
    MemoryState,
    VersionRepository,
)
from app.domain.reviews.repositories import ReviewRepository
from app.embeddings import Embedder
from app.lib.errors import ApiError, ConflictError, NotFoundError
from app.writers.base import DEFAULT_DESTRUCTIVE_KINDS, Op, OpKind, is_placeholder

MAX_MEMORY_CHARS = 2_000


@dataclass(frozen=True)
class Shown:
    """A memory as it was when shown to the writer under a local id."""

    memory_id: uuid.UUID
    version: int


@dataclass(frozen=True)
class Provenance:
    """Who and what produced a changeset (architecture invariant 6)."""

    actor: str
    kind: str = "writer"
    writer: str | None = None
    model: str | None = None
    profile: str | None = None
    prompt_hash: str | None = None
    chunk_id: uuid.UUID | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ApplyLimits:
    """Bounds on what one writer result may do (see MEMSTORE_WRITER_MAX_OPS and the settings after it)."""

    max_ops: int = 50
    max_chars: int = MAX_MEMORY_CHARS
    # An ADD at least this similar (cosine) to an active memory of the scope, or to another ADD of the
    # same result, stores nothing: over-storing near-copies is a known failure of memory writers.
    duplicate_threshold: float = 0.95
    # Under `review` an op of these kinds that passes every guard is held as a pending review instead
    # of applied; under `deny` it is dropped (guard `denied_op`). Hand edits and approvals use `allow`.
    destructive: str = "allow"
    destructive_kinds: frozenset[OpKind] = DEFAULT_DESTRUCTIVE_KINDS


@dataclass
class ApplyOutcome:
    changeset_id: uuid.UUID
    applied: int = 0
    guards: list[dict[str, Any]] = field(default_factory=list)
    reviews: list[uuid.UUID] = field(default_factory=list)  # ops held for a human (policy `review`)


def _guard(guards: list[dict[str, Any]], name: str, index: int, op: Op, detail: str) -> None:
    guards.append({"guard": name, "op_index": index, "op": op.kind.value, "detail": detail})


_WRITES_CONTENT = (OpKind.ADD, OpKind.SUPERSEDE, OpKind.UPDATE)

# Text -> its vector, embedded before the apply's transaction (see `embed_ops`).
Vectors = Mapping[str, Sequence[float]]


def _storable(text: str, limits: ApplyLimits) -> bool:
    """Whether `text` (stripped) may be stored as a memory's content."""
    return bool(text) and len(text) <= limits.max_chars and "\x00" not in text


_Checked = list[tuple[int, Op, list[MemoryState]]]


def _check_ops(  # noqa: PLR0912, PLR0915  (each guard is one branch)
    ops: Sequence[Op],
    shown: dict[int, Shown],
    locked: dict[uuid.UUID, MemoryState],
    guards: list[dict[str, Any]],
    memory_at: datetime | None,
    limits: ApplyLimits,
    held: _Checked,
) -> _Checked:
    """The ops that may be applied, each with its target memories; those the destructive-ops policy
    holds for review go to `held`; the rest become guards."""
    accepted: _Checked = []
    touched: set[uuid.UUID] = set()
    for index, op in enumerate(ops):
        if index >= limits.max_ops:
            _guard(
                guards, "too_many_ops", index, op, f"only the first {limits.max_ops} ops of a result apply"
            )
            continue
        unknown = [t for t in op.targets if t not in shown]
        if unknown:
            _guard(guards, "unknown_id", index, op, f"ids {unknown} were not shown to the writer")
            continue
        if op.kind in (OpKind.UPDATE, OpKind.DELETE) and len(op.targets) != 1:
            _guard(guards, "bad_targets", index, op, f"{op.kind.value} needs exactly one target")
            continue
        if op.kind is OpKind.SUPERSEDE and not op.targets:
            _guard(guards, "bad_targets", index, op, "SUPERSEDE needs at least one target")
            continue
        if op.kind is OpKind.ADD and op.targets:
            _guard(guards, "bad_targets", index, op, "ADD takes no targets")
            continue
        if len(set(op.targets)) != len(op.targets):
            _guard(guards, "bad_targets", index, op, "an op names the same memory twice")
            continue
        if op.kind in _WRITES_CONTENT and not _storable((op.content or "").strip(), limits):
            _guard(
                guards, "bad_content", index, op, f"content must be 1..{limits.max_chars} characters, no NUL"
            )
            continue
        if op.kind in _WRITES_CONTENT and is_placeholder(op.content or ""):
            _guard(guards, "placeholder", index, op, "content is a stand-in, not a statement")
            continue
        if op.kind is OpKind.NOOP:
            accepted.append((index, op, []))
            continue
        targets: list[MemoryState] = []
        problem = None
        for local_id in op.targets:
            memory = locked.get(shown[local_id].memory_id)
            if memory is not None and memory.id in touched:
                problem = ("duplicate_target", f"memory {local_id} is already changed by an earlier op")
            elif memory is None or memory.version != shown[local_id].version or memory.status != "active":
                problem = ("stale_target", f"memory {local_id} changed after it was shown to the writer")
            if problem or memory is None:
                break
            targets.append(memory)
        if problem is None and op.kind in (OpKind.UPDATE, OpKind.SUPERSEDE) and memory_at is not None:
            newer = [m for m in targets if m.memory_at is not None and m.memory_at > memory_at]
            if newer:
                # An older statement never rewrites a newer fact (a late import, a replayed history).
                problem = (
                    "older_fact",
                    f"the statement ({memory_at:%Y-%m-%d}) is older than a memory it "
                    f"would replace ({newer[0].memory_at:%Y-%m-%d})",
                )
        if problem:
            _guard(guards, problem[0], index, op, problem[1])
            continue
        if (
            op.kind is OpKind.UPDATE
            and targets[0].content == (op.content or "").strip()
            and (not op.tags or tuple(op.tags) == targets[0].tags)
        ):
            _guard(guards, "unchanged", index, op, "UPDATE repeats the current content")
            continue
        touched.update(m.id for m in targets)
        if op.kind in limits.destructive_kinds and limits.destructive == "deny":
            _guard(guards, "denied_op", index, op, f"the policy denies a writer's {op.kind.value}")
        elif op.kind in limits.destructive_kinds and limits.destructive == "review":
            held.append((index, op, targets))  # its guard, naming the review, is recorded with the rows
        else:
            accepted.append((index, op, targets))
    return accepted


@dataclass(frozen=True)
class ApplyRequest:
    """One changeset's worth of ops for one scope: what `apply_many` writes, with why and by whom."""

    tenant_id: uuid.UUID
    user_id: str
    ops: Sequence[Op]
    shown: dict[int, Shown]
    provenance: Provenance
    agent_id: str | None = None
    run_id: str | None = None
    memory_at: datetime | None = None
    raw_output: str | None = None
    usage: dict[str, Any] | None = None
    guards: Sequence[dict[str, Any]] = ()
    changeset_id: uuid.UUID = field(default_factory=uuid.uuid4)
    limits: ApplyLimits = field(default_factory=ApplyLimits)


def texts_to_embed(requests: Sequence[ApplyRequest]) -> list[str]:
    """The texts `apply_many` may store for `requests`: each content-writing op's text that the content
    guards let through, once each. Which of them are used is only known under the locks."""
    texts: dict[str, None] = {}
    for request in requests:
        for op in request.ops[: request.limits.max_ops]:
            text = (op.content or "").strip()
            if op.kind in _WRITES_CONTENT and _storable(text, request.limits):
                texts[text] = None
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
    plans: list[_Plan] = []
    for request in requests:
        guards = list(request.guards)
        in_scope = {
            memory_id: state
            for (tenant_id, user_id, memory_id), state in locked.items()
            if tenant_id == request.tenant_id and user_id == request.user_id
        }
        held: _Checked = []
        accepted = _check_ops(
            request.ops, request.shown, in_scope, guards, request.memory_at, request.limits, held
        )
        plan = _Plan(request, accepted, guards, held)
        for _, op, _ in accepted:
            if op.kind in _WRITES_CONTENT:
                text = (op.content or "").strip()
                if text not in vectors:
                    msg = f"no vector for {text[:80]!r}: embed the ops (embed_ops) before applying them"
                    raise ValueError(msg)
                plan.vectors.append(list(vectors[text]))
        plans.append(plan)
    await _find_near_duplicates(memories, plans)

    rows = _Rows()
    outcomes = [rows.add(plan) for plan in plans]
    await ChangesetRepository(session).insert_many(rows.changesets)
    await ReviewRepository(session).insert_many(rows.reviews)
    await memories.insert_many(rows.new)
    await memories.update_many(rows.changed)
    await VersionRepository(session).insert_many(rows.versions)
    return outcomes


@dataclass
class _Plan:
    """One request after the guards: the ops that may apply (with their targets) and their vectors."""

    request: ApplyRequest
    accepted: _Checked
    guards: list[dict[str, Any]]
    held: _Checked = field(default_factory=list)  # ops kept as pending reviews
    vectors: list[list[float]] = field(default_factory=list)  # one per content-writing accepted op
    duplicates: dict[int, tuple[str, str]] = field(default_factory=dict)  # op index -> (of what, why)


@dataclass
class _Rows:
    """The rows a set of plans writes, per table."""

    changesets: list[dict[str, Any]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    versions: list[dict[str, Any]] = field(default_factory=list)
    reviews: list[dict[str, Any]] = field(default_factory=list)

    def add(self, plan: _Plan) -> ApplyOutcome:
        request, provenance, guards = plan.request, plan.request.provenance, plan.guards
        changeset_id, memory_at = request.changeset_id, request.memory_at
        vectors = iter(plan.vectors)
        recorded: list[dict[str, Any]] = []
        base = {
            "tenant_id": request.tenant_id,
            "user_id": request.user_id,
            "changeset_id": changeset_id,
            "chunk_id": provenance.chunk_id,
            "writer": provenance.writer,
            "model": provenance.model,
            "profile": provenance.profile,
            "prompt_hash": provenance.prompt_hash,
            "actor": provenance.actor,
        }

        def version(
            memory_id: uuid.UUID,
            number: int,
            op: str,
            state: dict[str, Any],
            reason: str | None,
            embedding: list[float] | None = None,
            supersedes: list[uuid.UUID] | None = None,
            superseded_by: uuid.UUID | None = None,
        ) -> None:
            self.versions.append(
                {
                    **base,
                    "memory_id": memory_id,
                    "version": number,
                    "op": op,
                    "content": state["content"],
                    "tags": state["tags"],
                    "owner": state["owner"],
                    "status": state["status"],
                    "memory_at": state["memory_at"],
                    "embedding": embedding,
                    "supersedes": supersedes,
                    "superseded_by": superseded_by,
                    "reason": reason or provenance.reason,
                }
            )

        applied = 0
        for index, op, targets in plan.accepted:
            entry: dict[str, Any] = {"index": index, **op.as_json(), "targets": [str(m.id) for m in targets]}
            recorded.append(entry)
            if index in plan.duplicates:
                next(vectors)
                entry |= {"op": OpKind.NOOP.value, "duplicate_of": plan.duplicates[index][0]}
                _guard(guards, "near_duplicate", index, op, plan.duplicates[index][1])
                continue
            if op.kind is OpKind.NOOP:
                continue
            applied += 1
            if op.kind in (OpKind.ADD, OpKind.SUPERSEDE):
                memory_id, embedding = uuid.uuid4(), next(vectors)
                state = {
                    "content": (op.content or "").strip(),
                    "tags": list(op.tags),
                    "owner": op.owner,
                    "status": "active",
                    "memory_at": memory_at,
                }
                self.new.append(
                    {
                        "id": memory_id,
                        "tenant_id": request.tenant_id,
                        "user_id": request.user_id,
                        "agent_id": request.agent_id,
                        "run_id": request.run_id,
                        "version": 1,
                        "embedding": embedding,
                        "changeset_id": changeset_id,
                        **state,
                    }
                )
                version(
                    memory_id,
                    1,
                    "ADD",
                    state,
                    op.reason,
                    embedding,
                    supersedes=[m.id for m in targets] or None,
                )
                for old in targets:  # SUPERSEDE: each replaced memory gets a new, superseded version
                    old_state = old.state() | {"status": "superseded"}
                    self.changed.append(old.change(changeset_id, status="superseded"))
                    version(
                        old.id, old.version + 1, "SUPERSEDE", old_state, op.reason, superseded_by=memory_id
                    )
                entry["memory_id"] = str(memory_id)
            elif op.kind is OpKind.UPDATE:
                old = targets[0]
                embedding = next(vectors)
                content = (op.content or "").strip()
                tags = list(op.tags) or list(old.tags)
                self.changed.append(
                    old.change(
                        changeset_id, content=content, tags=tags, embedding=embedding, memory_at=memory_at
                    )
                )
                updated = old.state() | {
                    "content": content,
                    "tags": tags,
                    "memory_at": memory_at or old.memory_at,
                }
                version(old.id, old.version + 1, "UPDATE", updated, op.reason, embedding)
                entry["memory_id"] = str(old.id)
            elif op.kind is OpKind.DELETE:
                old = targets[0]
                self.changed.append(old.change(changeset_id, status="deleted"))
                version(old.id, old.version + 1, "DELETE", old.state() | {"status": "deleted"}, op.reason)
                entry["memory_id"] = str(old.id)

        reviews = [self._hold(plan, index, op, targets) for index, op, targets in plan.held]
        self.changesets.append(
            {
                "id": changeset_id,
                "tenant_id": request.tenant_id,
                "user_id": request.user_id,
                "kind": provenance.kind,
                "chunk_id": provenance.chunk_id,
                "writer": provenance.writer,
                "model": provenance.model,
                "profile": provenance.profile,
                "prompt_hash": provenance.prompt_hash,
                "raw_output": request.raw_output,
                "usage": request.usage or {},
                "actor": provenance.actor,
                "reason": provenance.reason,
                "ops": recorded,
                "guards": guards,
            }
        )
        return ApplyOutcome(changeset_id=changeset_id, applied=applied, guards=guards, reviews=reviews)

    def _hold(self, plan: _Plan, index: int, op: Op, targets: list[MemoryState]) -> uuid.UUID:
        """A pending review for a held op: the op, its targets at the versions shown, its provenance."""
        request, provenance = plan.request, plan.request.provenance
        review_id = uuid.uuid4()
        self.reviews.append(
            {
                "id": review_id,
                "tenant_id": request.tenant_id,
                "user_id": request.user_id,
                "agent_id": request.agent_id,
                "run_id": request.run_id,
                "changeset_id": request.changeset_id,
                "chunk_id": provenance.chunk_id,
                "op_index": index,
                "op": {k: v for k, v in op.as_json().items() if k != "targets"},
                "targets": [{"memory_id": str(m.id), "version": m.version} for m in targets],
                "memory_at": request.memory_at,
                "writer": provenance.writer,
                "model": provenance.model,
                "profile": provenance.profile,
                "prompt_hash": provenance.prompt_hash,
            }
        )
        _guard(plan.guards, "held_for_review", index, op, f"held as review {review_id}")
        return review_id


async def _find_near_duplicates(memories: MemoryRepository, plans: Sequence[_Plan]) -> None:
    """Mark ADDs that repeat an active memory of their scope or an earlier ADD of the same result.

    A memory the same result replaces or deletes does not count: re-adding it is a correction; nor
    does one that says the opposite ("likes jazz" / "dislikes jazz", close as vectors). One query finds
    the nearest active memory for every ADD of every plan.
    """
    adds: list[tuple[_Plan, int, list[float], str]] = []
    for plan in plans:
        if plan.request.limits.duplicate_threshold > 1.0:  # a threshold above 1 turns the check off
            continue
        vectors = iter(plan.vectors)
        for index, op, _ in plan.accepted:
            if op.kind in _WRITES_CONTENT:
                vector = next(vectors)
                if op.kind is OpKind.ADD:
                    adds.append((plan, index, vector, op.content or ""))
    if not adds:
        return
    closest = await memories.closest_active(
        [(p.request.tenant_id, p.request.user_id, vector) for p, _, vector, _ in adds]
    )
    kept: dict[int, list[tuple[int, list[float], str]]] = {}  # per plan: ADDs that stay
    for (plan, index, vector, content), near in zip(adds, closest, strict=True):
        threshold = plan.request.limits.duplicate_threshold
        replaced = {m.id for _, op, targets in plan.accepted if op.kind is not OpKind.UPDATE for m in targets}
        if (
            near is not None
            and near[0] not in replaced
            and near[1] >= threshold
            and not opposite_polarity(content, near[2])
        ):
            plan.duplicates[index] = (
                str(near[0]),
                f"repeats active memory {near[0]} (similarity {near[1]:.3f})",
            )
            continue
        earlier = kept.setdefault(id(plan), [])
        twin = next(
            (
                i
                for i, v, text_ in earlier
                if _cosine(v, vector) >= threshold and not opposite_polarity(content, text_)
            ),
            None,
        )
        if twin is not None:
            plan.duplicates[index] = (f"op:{twin}", f"repeats op {twin} of the same result")
            continue
        earlier.append((index, vector, content))


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = (sum(x * x for x in a) * sum(y * y for y in b)) ** 0.5
    return dot / norm if norm else 0.0


# --- reading -------------------------------------------------------------------------------------


class _Keyed(Protocol):
    @property
    def created_at(self) -> datetime: ...
    @property
    def id(self) -> uuid.UUID: ...


def encode_cursor(row: _Keyed) -> str:
    """A keyset cursor over (created_at, id)."""
    raw = f"{row.created_at.isoformat()}|{row.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, _, memory_id = raw.partition("|")
        return datetime.fromisoformat(created), uuid.UUID(memory_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            "The cursor is not valid.", code="validation_error", status_code=422, details={"field": "cursor"}
        ) from exc


async def list_memories(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    user_id: str,
    *,
    agent_id: str | None,
    status: str,
    cursor: str | None,
    limit: int,
    as_of: datetime | None = None,
) -> tuple[Sequence[Memory | MemoryAsOf], str | None]:
    """A page of the scope's memories as they stand now, or as they stood at `as_of`."""
    statuses = None if status == "all" else [status]
    after = decode_cursor(cursor) if cursor else None
    repo = MemoryRepository(session)
    if as_of is not None:
        page: Sequence[Memory | MemoryAsOf] = await repo.bank_as_of(
            tenant_id, user_id, as_of, agent_id=agent_id, statuses=statuses, after=after, limit=limit + 1
        )
    else:
        page = await repo.page(
            tenant_id, user_id, agent_id=agent_id, statuses=statuses, after=after, limit=limit + 1
        )
    if len(page) > limit:
        return page[:limit], encode_cursor(page[limit - 1])
    return page, None


async def get_memory(session: AsyncSession, tenant_id: uuid.UUID, memory_id: uuid.UUID) -> Memory:
    memory = await MemoryRepository(session).get(tenant_id, memory_id)
    if memory is None:
        raise NotFoundError("No such memory.")
    return memory


async def memory_history(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: uuid.UUID
) -> Sequence[MemoryVersion]:
    versions = await VersionRepository(session).history(tenant_id, memory_id)
    if not versions:
        raise NotFoundError("No such memory.")
    return versions


# --- manual edits --------------------------------------------------------------------------------


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
) -> Memory:
    """A hand edit: a new version (op UPDATE) under a `manual` changeset, attributed to `actor`.

    A new text is embedded before the request's first statement, so no transaction is open while the
    embedder answers; a tags-only edit keeps the text, and with it the memory's stored vector.
    """
    limits = limits or ApplyLimits()
    new_text = None if content is None else content.strip()
    vectors: dict[str, list[float]] | None = None
    if new_text is not None:
        storable = _storable(new_text, limits)  # otherwise the content guard answers 422
        vectors = dict(zip([new_text], await embedder.embed([new_text]), strict=True)) if storable else {}
    memory = await get_memory(session, tenant_id, memory_id)
    text = memory.content if new_text is None else new_text
    if text == memory.content and (not tags or list(tags) == list(memory.tags)):
        return memory  # nothing to change (empty tags keep the memory's); no version for it
    if vectors is None and memory.embedding is not None:
        vectors = {memory.content: [float(v) for v in memory.embedding]}
    op = Op(OpKind.UPDATE, text, targets=(0,), tags=tuple(tags or ()), reason=reason)
    return await _manual_write(
        session, memory, op, "memory.updated", actor, request_id, embedder, limits, vectors
    )


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
    if memory.status != "active":
        raise ConflictError(
            f"The memory is {memory.status}; only an active memory can be edited "
            "(an admin can roll it back).",
            code="memory_not_active",
            details={"status": memory.status},
        )
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
            raise ApiError(guard["detail"], code="validation_error", status_code=422)
        raise ConflictError(
            "The memory changed meanwhile; read it again and retry.",
            code="memory_changed",
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
    await session.refresh(memory)
    return memory
