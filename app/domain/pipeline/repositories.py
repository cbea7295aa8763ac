"""The chunk queue's SQL, the only writer of `chunks`: chunks accepted, imported or fed to a shadow
bank; the next chunk of a scope claimed, its context read, its outcome marked; a failed chunk queued
again; and the scopes stranded with no job.

The worker runs these for every chunk, so each statement is built once at import, with bind
parameters, and only executed per call: building SQLAlchemy expressions costs more CPU than the
round trip itself on a busy worker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    Boolean,
    ColumnElement,
    DateTime,
    Select,
    Table,
    bindparam,
    exists,
    func,
    literal_column,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.arrays import as_columns
from app.db.distribution import session_is_distributed
from app.db.models import Chunk, Tenant
from app.domain.pipeline.locks import Lease

CHUNKS = cast("Table", Chunk.__table__)
PENDING = ("queued", "processing")
_c = CHUNKS.c
_SCOPE = (_c.tenant_id == bindparam("p_tenant_id"), _c.user_id == bindparam("p_user_id"))
# Unfinished, as constants in the SQL: the partial index of a scope's unfinished chunks
# (`ix_chunks_scope_pending`) serves only a condition that implies its own, and a bind parameter
# implies nothing in the generic plan a prepared statement settles on after a few runs. With
# `status IN ($1, $2)` the next chunk was found by walking the scope's whole history in
# `uq_chunks_scope_seq`: a claim cost more with every chunk the user had ever sent.
_UNFINISHED = _c.status.in_([literal_column(f"'{status}'") for status in PENDING])
_ROW = (
    _c.id,
    _c.tenant_id,
    _c.user_id,
    _c.agent_id,
    _c.run_id,
    _c.seq,
    _c.messages,
    _c.writer,
    _c.status,
    _c.attempts,
    _c.available_at,
    _c.received_at,
    _c.trace_parent,
    # the last day the memories it adds are shown (a Mem0 add's; `memories.expiry`), not the metadata
    _c["metadata"]["expiration_date"].astext.label("expiration_date"),
)

# The backend holding the scope's advisory lock is still the one that took it (see `locks`). Checked
# on every claim: the lock lives on another connection, which may have died unnoticed meanwhile. Asked
# of `pg_stat_get_activity(pid)`, the function under the `pg_stat_activity` view, for that one backend:
# the view builds a row for every backend of the server (0.1 ms a claim with 25, ~1 ms with 300).
_ACTIVITY = func.pg_stat_get_activity(bindparam("p_lock_pid")).table_valued("pid", "backend_start")
_LOCK_HELD = (
    exists()
    .where(
        _ACTIVITY.c.pid == bindparam("p_lock_pid"),
        _ACTIVITY.c.backend_start.is_not_distinct_from(
            bindparam("p_lock_since", type_=DateTime(timezone=True))
        ),
    )
    .label("lock_held")
)
# The claim, in one statement whatever its outcome: whether the lock still holds, the scope's oldest
# unfinished chunk as it was, and that chunk as claimed (marked `processing`, attempts + 1) if it
# could be taken now. The conditions are on `chunks` itself, so a concurrent change to the row (an
# admin retry, a purge) is seen by the UPDATE after it waits for it.
#
# A worker's prepared statements settle on generic plans, planned without the parameters' values, so
# nothing here leaves a plan to an estimate: the limit is a constant, and the UPDATE names its row by
# values (scope, seq and id, each a subquery's result) that every index of `chunks` it could use finds
# in one entry. Joined to the CTE instead, it was planned as a hash join over every unfinished chunk.
#
# Where the next chunk is looked for, two ways:
# - a drain's first claim reads the scope's oldest unfinished chunk from the partial index of unfinished
#   chunks (`_UNFINISHED`): one entry, however long the user's history;
# - its later claims read on from the chunk the drain claimed last, along the scope's `seq` index
#   (`uq_chunks_scope_seq`; `status NOT IN (applied, failed)` keeps the partial index out of it): a few
#   entries. The partial index holds all of a scope's live entries on one or two pages, which new
#   chunks of a busy scope are written to at the same time; read there for every chunk, the claims
#   also pruned and rewrote those pages: 47 WAL records a chunk instead of 35, and 1.7 ms of Postgres
#   per chunk instead of 1.1 ms (`bench/pipeline.py` end to end, twenty users posting and drained at
#   once).
_COLUMNS = [c.name for c in _ROW]
_FIRST = (_UNFINISHED,)
_LATER = (
    _c.seq >= bindparam("p_from_seq"),
    _c.status.not_in([literal_column("'applied'"), literal_column("'failed'")]),
)


# On a Citus cluster the claim runs on the shard's node, where the lock's backend is not: the check is
# asked of the coordinator first, in the claim's transaction, and its answer handed in.
_LOCK_HELD_GIVEN = bindparam("p_lock_held", type_=Boolean).label("lock_held")


def _claim_statement(
    where: tuple[ColumnElement[bool], ...], lock_held: ColumnElement[bool] = _LOCK_HELD
) -> Select[Any]:
    found = select(*_ROW).where(*_SCOPE, *where).order_by(_c.seq).limit(literal_column("1")).cte("next_chunk")
    alive = select(lock_held).cte("scope_lock")
    claimed = (
        update(CHUNKS)
        .where(
            *_SCOPE,
            _c.seq == select(found.c.seq).scalar_subquery(),
            _c.id == select(found.c.id).scalar_subquery(),
            select(alive.c.lock_held).scalar_subquery(),
            _UNFINISHED,
            _c.available_at <= func.now(),
            _c.attempts < bindparam("p_max_attempts"),
        )
        .values(status="processing", attempts=_c.attempts + 1, updated_at=func.now())
        .returning(*_ROW)
        .cte("claimed")
    )
    return select(
        alive.c.lock_held,
        *(found.c[name].label(f"next_{name}") for name in _COLUMNS),
        *(claimed.c[name].label(f"claimed_{name}") for name in _COLUMNS),
    ).select_from(alive.outerjoin(found, true()).outerjoin(claimed, true()))


_CLAIM_FIRST = _claim_statement(_FIRST)
_CLAIM_LATER = _claim_statement(_LATER)
_CLAIM_FIRST_ON_CLUSTER = _claim_statement(_FIRST, _LOCK_HELD_GIVEN)
_CLAIM_LATER_ON_CLUSTER = _claim_statement(_LATER, _LOCK_HELD_GIVEN)
# Fenced by the claim: a chunk this worker lost its lock on, and another worker took since, is not
# touched (its `attempts` moved on). Many chunks in one statement: the workers apply in groups. On a
# Citus cluster the batch's tenants are also named as values (`= ANY`, `_MARK_APPLIED_ON_CLUSTER`): it
# cannot prune shards by a join to `unnest`, and would send the UPDATE to every shard of every node, so
# one worker down failed every tenant's apply; named, it reaches only the batch's tenants' shards. One
# Postgres goes without: given `= ANY`, its planner may read every unfinished chunk of those tenants.
#
# Each row is named by scope, seq and id, which every index of `chunks` finds in one entry, and its
# status is checked as `<> ALL(queued, applied, failed)`: 'processing', the one other value the CHECK
# constraint allows, in a form the partial index of unfinished chunks cannot serve. Given `status =
# 'processing'` a planner whose statistics predate a burst of chunks (or a table not yet analysed)
# takes that index for a few rows and hash-joins the batch against all of it: every unfinished chunk
# of the deployment read again for each batch, when the backlog is deepest.
_MARK_APPLIED = text(
    "UPDATE chunks SET status = 'applied', changeset_id = u.changeset_id, last_error = NULL,"
    " applied_at = now(), updated_at = now()"
    " FROM unnest(CAST(:p_tenant_ids AS uuid[]), CAST(:p_user_ids AS text[]), CAST(:p_seqs AS bigint[]),"
    " CAST(:p_chunk_ids AS uuid[]), CAST(:p_changeset_ids AS uuid[]), CAST(:p_attempts AS integer[]))"
    " AS u(tenant_id, user_id, seq, id, changeset_id, attempt)"
    " WHERE chunks.tenant_id = u.tenant_id AND chunks.user_id = u.user_id AND chunks.seq = u.seq"
    " AND chunks.id = u.id AND chunks.attempts = u.attempt"
    " AND chunks.status <> ALL ('{queued,applied,failed}')"
    " RETURNING chunks.id"
)
_MARK_APPLIED_ON_CLUSTER = text(
    str(_MARK_APPLIED).replace(
        " RETURNING", " AND chunks.tenant_id = ANY (CAST(:p_tenant_ids AS uuid[])) RETURNING"
    )
)
_HAS_READY = select(_c.id).where(*_SCOPE, _UNFINISHED, _c.available_at <= func.now()).limit(1)
_EARLIER = (
    select(_c.messages)
    .where(*_SCOPE, _c.seq < bindparam("p_before_seq"))
    .order_by(_c.seq.desc())
    .limit(bindparam("p_limit"))
)

# The numbers of an attempt's usage added to those already on the chunk.
_ADD_USAGE = text(
    "chunks.usage || (SELECT coalesce(jsonb_object_agg(key, coalesce((chunks.usage ->> key)::numeric, 0)"
    " + value::numeric), '{}'::jsonb) FROM jsonb_each_text(CAST(:p_usage AS jsonb)))"
)

# A claim given back (a worker stopping, a fault that is not the chunk's): the attempt it counted is
# returned, fenced by the claim like `_MARK_APPLIED`, so it never undoes another worker's claim.
_GIVE_BACK = (
    update(CHUNKS)
    .where(
        _c.tenant_id == bindparam("p_tenant_id"),
        _c.id == bindparam("p_chunk_id"),
        _c.status == "processing",
        _c.attempts == bindparam("p_attempt"),
    )
    .values(status="queued", attempts=_c.attempts - 1, updated_at=func.now())
    .returning(_c.id)
)

_STRANDED = text("SELECT tenant_id, user_id, backfill FROM memstore_stranded_scopes(:p_age, :p_limit)")

# A chunk fed to a bank carries its source chunk's id as its idempotency key: the unique index on
# (tenant, idempotency key) makes feeding the same chunk twice a no-op, and comparison pairs chunks
# of two banks by it.
SOURCE_PREFIX = "src:"  # written out in the statements below

# The scope's chunks the bank has not had yet, in `seq` order. A scope's `seq` is handed out under its
# row lock, so chunks commit in `seq` order and the bank's highest `seq` is a watermark: everything
# above it is new. The same `seq` keeps the bank's scopes in the order of the source's.
_FEED = text(
    """
    INSERT INTO chunks (id, tenant_id, user_id, agent_id, run_id, seq, messages, metadata,
                        idempotency_key, body_hash, writer, received_at, trace_parent)
    SELECT gen_random_uuid(), :p_bank, c.user_id, c.agent_id, c.run_id, c.seq, c.messages, c.metadata,
           'src:' || c.id::text, c.body_hash, :p_writer, c.received_at, c.trace_parent
    FROM chunks c
    WHERE c.tenant_id = :p_source
      AND (CAST(:p_user AS text) IS NULL OR c.user_id = :p_user)
      AND c.received_at >= :p_since
      AND (CAST(:p_until AS timestamptz) IS NULL OR c.received_at < :p_until)
      AND c.seq > coalesce(
          (SELECT max(b.seq) FROM chunks b WHERE b.tenant_id = :p_bank AND b.user_id = c.user_id), 0)
    ORDER BY c.user_id, c.seq
    LIMIT :p_limit
    ON CONFLICT DO NOTHING
    RETURNING user_id
    """
)

_TENANT_OPTIONS = select(
    Tenant.settings["writer"].astext,
    Tenant.settings["shadow_writers"],
    Tenant.settings["shadow_since"],
    Tenant.shadow_of,
    Tenant.settings["destructive_ops"].astext,
    Tenant.settings["destructive_kinds"],
    Tenant.settings["write_weight"],
    Tenant.settings["max_writer_concurrency"],
    Tenant.settings["daily_token_budget"],
    Tenant.settings["embedder"].astext,
    Tenant.settings["embedder_switch"]["to"].astext,
).where(Tenant.id == bindparam("p_tenant_id"))

# A writer changeset's tokens, and a chunk's failed attempts' (as migration 0019's tenant backlog).
_TOKENS = (
    "coalesce((usage ->> 'prompt_tokens')::bigint, 0) + coalesce((usage ->> 'completion_tokens')::bigint, 0)"
)
# Its budget, and (for a tenant with one, or when asked) what it spent: the sums are not computed when
# the CASE does not reach them (uncorrelated subqueries run when first needed).
_TOKENS_TODAY = text(
    f"""SELECT b.budget, CASE WHEN b.budget IS NULL AND NOT :p_always THEN 0 ELSE
        (SELECT coalesce(sum({_TOKENS}), 0) FROM changesets
         WHERE tenant_id = :p_tenant_id AND kind = 'writer' AND created_at >= :p_day)
      + (SELECT coalesce(sum({_TOKENS}), 0) FROM chunks
         WHERE tenant_id = :p_tenant_id AND status IN ('queued', 'processing', 'failed')
           AND updated_at >= :p_day AND usage <> '{{}}'::jsonb) END
    FROM (SELECT (SELECT (settings ->> 'daily_token_budget')::bigint FROM tenants WHERE id = :p_tenant_id)
          AS budget) b"""  # noqa: S608  (constants only)
)


@dataclass(frozen=True)
class TenantOptions:
    """What the pipeline reads of a tenant: its default writer, its shadow writers (None: the
    deployment's), and the tenant it shadows if it is a shadow bank."""

    writer: str | None = None
    shadow_writers: tuple[str, ...] | None = None
    shadow_of: uuid.UUID | None = None
    # When each of the tenant's shadow writers was named (RFC 3339).
    shadow_since: dict[str, str] = field(default_factory=dict)
    # Its policy for a writer's destructive ops and which ops those are (None: the deployment's).
    destructive_ops: str | None = None
    destructive_kinds: tuple[str, ...] | None = None
    # Its share of the writer fleet when others have work, the most writer calls it may have in flight
    # (None: no cap), and its writer tokens a UTC day (None: no budget): `pipeline.scheduler`.
    write_weight: float = 1.0
    max_writer_concurrency: int | None = None
    daily_token_budget: int | None = None
    # Its own embedder (None: the deployment's), and the one it is moving to (`search.tenant_embedder`).
    embedder: str | None = None
    embedder_switching_to: str | None = None


@dataclass(frozen=True)
class ChunkRow:
    """What the pipeline reads of a chunk."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: str
    agent_id: str | None
    run_id: str | None
    seq: int
    messages: list[dict[str, Any]]
    writer: str | None
    status: str
    attempts: int
    available_at: datetime
    received_at: datetime
    trace_parent: str | None = None  # the trace its processing continues (`app.lib.tracing`)
    expiration_date: str | None = None  # its metadata's `expiration_date`, if any


@dataclass(frozen=True)
class Claim:
    """What a claim found: the chunk it took (if any), the oldest unfinished one as it was before,
    and whether the scope lock still held."""

    lock_held: bool
    claimed: ChunkRow | None
    next: ChunkRow | None


# Accepted chunks, in one statement of one text whatever their number: a column each, as an array
# (a multi-row VALUES would be a new text, and a new prepared statement, for every batch size, and costs
# the API a bind parameter per value to build; `app.db.arrays`).
_INSERTED = (
    "id",
    "tenant_id",
    "user_id",
    "agent_id",
    "run_id",
    "seq",
    "messages",
    "metadata",
    "idempotency_key",
    "body_hash",
    "writer",
    "trace_parent",
    "backfill",
)
# What a row may leave out (the rest it must give).
_OPTIONAL: dict[str, Any] = {
    "agent_id": None,
    "run_id": None,
    "metadata": {},
    "idempotency_key": None,
    "writer": None,
    "trace_parent": None,
    "backfill": False,
}
_INSERT_CHUNKS = text(
    """INSERT INTO chunks (id, tenant_id, user_id, agent_id, run_id, seq, messages, metadata,
                        idempotency_key, body_hash, writer, trace_parent, backfill)
    SELECT id, tenant_id, user_id, agent_id, run_id, seq, messages::jsonb, metadata::jsonb,
           idempotency_key, body_hash, writer, trace_parent, backfill
    FROM unnest(CAST(:id AS uuid[]), CAST(:tenant_id AS uuid[]), CAST(:user_id AS text[]),
                CAST(:agent_id AS text[]), CAST(:run_id AS text[]), CAST(:seq AS bigint[]),
                CAST(:messages AS text[]), CAST(:metadata AS text[]), CAST(:idempotency_key AS text[]),
                CAST(:body_hash AS text[]), CAST(:writer AS text[]), CAST(:trace_parent AS text[]),
                CAST(:backfill AS boolean[]))
        AS c(id, tenant_id, user_id, agent_id, run_id, seq, messages, metadata, idempotency_key,
             body_hash, writer, trace_parent, backfill)
    ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
    """
)


class PipelineRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def tenant_options(self, tenant_id: uuid.UUID) -> TenantOptions:
        """The tenant's default writer and shadow writers (tenant settings), and whose bank it is."""
        row = (await self.session.execute(_TENANT_OPTIONS, {"p_tenant_id": tenant_id})).first()
        if row is None:
            return TenantOptions()
        writer, shadows, since, shadow_of, destructive, kinds, weight, cap, budget, embedder, to = row
        return TenantOptions(
            embedder=embedder or None,
            embedder_switching_to=to or None,
            write_weight=float(weight) if isinstance(weight, int | float) else 1.0,
            max_writer_concurrency=int(cap) if isinstance(cap, int) else None,
            daily_token_budget=int(budget) if isinstance(budget, int) else None,
            destructive_ops=str(destructive) if destructive else None,
            destructive_kinds=tuple(str(k) for k in kinds) if isinstance(kinds, list) else None,
            writer=str(writer) if writer else None,
            shadow_writers=tuple(str(s) for s in shadows) if isinstance(shadows, list) else None,
            shadow_of=shadow_of,
            shadow_since={str(k): str(v) for k, v in since.items()} if isinstance(since, dict) else {},
        )

    async def claim_next(
        self,
        tenant_id: uuid.UUID,
        user_id: str,
        max_attempts: int,
        lease: Lease,
        from_seq: int | None = None,
        *,
        distributed: bool = False,
    ) -> Claim:
        """Take the scope's oldest unfinished chunk while `lease` still holds (one statement): mark it
        `processing` and count the attempt, if it is takeable now; and say why not, if not.

        `from_seq`: the seq of the chunk the caller's drain claimed last, if any. No unfinished chunk
        lies before it but one an admin retried since, which a drain finds when it looks at the scope
        again after releasing its lock."""
        params = {
            "p_tenant_id": tenant_id,
            "p_user_id": user_id,
            "p_max_attempts": max_attempts,
            "p_lock_pid": lease.pid,
            "p_lock_since": lease.backend_start,
        }
        first, later = _CLAIM_FIRST, _CLAIM_LATER
        if distributed:  # one more statement, on the coordinator (`_LOCK_HELD_GIVEN`)
            lock = {"p_lock_pid": lease.pid, "p_lock_since": lease.backend_start}
            params["p_lock_held"] = bool(await self.session.scalar(select(_LOCK_HELD), lock))
            first, later = _CLAIM_FIRST_ON_CLUSTER, _CLAIM_LATER_ON_CLUSTER
        if from_seq is None:
            statement = first
        else:
            statement, params["p_from_seq"] = later, from_seq
        row = (await self.session.execute(statement, params)).one()._asdict()

        def chunk(prefix: str) -> ChunkRow | None:
            if row[f"{prefix}id"] is None:
                return None
            return ChunkRow(**{name: row[f"{prefix}{name}"] for name in _COLUMNS})

        return Claim(lock_held=bool(row["lock_held"]), claimed=chunk("claimed_"), next=chunk("next_"))

    async def mark_applied(self, claims: Sequence[tuple[ChunkRow, uuid.UUID]]) -> set[uuid.UUID]:
        """Flip each (chunk as claimed, its changeset) to `applied`; the ids of those still held by
        that claim (same `attempts`). The others were applied or re-claimed elsewhere meanwhile."""
        if not claims:
            return set()
        params = {
            "p_tenant_ids": [chunk.tenant_id for chunk, _ in claims],
            "p_user_ids": [chunk.user_id for chunk, _ in claims],
            "p_seqs": [chunk.seq for chunk, _ in claims],
            "p_chunk_ids": [chunk.id for chunk, _ in claims],
            "p_changeset_ids": [changeset_id for _, changeset_id in claims],
            "p_attempts": [chunk.attempts for chunk, _ in claims],
        }
        statement = _MARK_APPLIED_ON_CLUSTER if await session_is_distributed(self.session) else _MARK_APPLIED
        return set((await self.session.scalars(statement, params)).all())

    async def mark_failed_attempt(
        self,
        tenant_id: uuid.UUID,
        chunk_id: uuid.UUID,
        *,
        error: str,
        raw_output: str | None,
        final: bool,
        available_at: datetime | None,
        attempt: int | None = None,
        usage: dict[str, Any] | None = None,
    ) -> bool:
        """Record a failed attempt: back to `queued` until `available_at`, or `failed` for good. The
        attempt's token usage is added to the chunk's (no changeset will record it)."""
        values: dict[str, Any] = {
            "last_error": error,
            "raw_output": raw_output,
            "updated_at": func.now(),
            "status": "failed" if final else "queued",
        }
        counts = {
            k: v for k, v in (usage or {}).items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if counts:
            values["usage"] = _ADD_USAGE.bindparams(p_usage=json.dumps(counts))
        if available_at is not None:
            values["available_at"] = available_at
        fence = [_c.tenant_id == tenant_id, _c.id == chunk_id, _c.status != "applied"]
        if attempt is not None:  # a failed attempt of this worker's claim, not of someone else's
            fence.append(_c.attempts == attempt)
        result = await self.session.execute(update(CHUNKS).where(*fence).values(**values).returning(_c.id))
        return result.first() is not None

    async def give_back(
        self,
        chunk: ChunkRow,
        *,
        error: str | None = None,
        available_at: datetime | None = None,
    ) -> bool:
        """Undo the claim `chunk` came from without counting its attempt: back to `queued` (not before
        `available_at`, if given), with `error` as the chunk's last error if given. False if the claim
        no longer holds (applied, or re-claimed elsewhere)."""
        statement = _GIVE_BACK
        values: dict[str, Any] = {}
        if error is not None:
            values["last_error"] = error
        if available_at is not None:
            values["available_at"] = available_at
        if values:
            statement = statement.values(**values)
        params = {"p_tenant_id": chunk.tenant_id, "p_chunk_id": chunk.id, "p_attempt": chunk.attempts}
        return (await self.session.execute(statement, params)).first() is not None

    async def has_ready(self, tenant_id: uuid.UUID, user_id: str) -> bool:
        found = await self.session.scalar(_HAS_READY, {"p_tenant_id": tenant_id, "p_user_id": user_id})
        return found is not None

    async def earlier_messages(
        self, tenant_id: uuid.UUID, user_id: str, before_seq: int, limit: int
    ) -> list[dict[str, Any]]:
        """The scope's last `limit` messages before chunk `before_seq`, oldest first."""
        if limit <= 0:
            return []
        params = {
            "p_tenant_id": tenant_id,
            "p_user_id": user_id,
            "p_before_seq": before_seq,
            "p_limit": limit,
        }
        rows = await self.session.scalars(_EARLIER, params)
        messages = [m for chunk_messages in reversed(rows.all()) for m in chunk_messages]
        return messages[-limit:]

    async def stranded_scopes(
        self, min_age_s: float, limit: int = 1000
    ) -> Sequence[tuple[uuid.UUID, str, bool]]:
        """Scopes with unfinished chunks untouched for `min_age_s` whose backoff (if any) has passed,
        and whether those chunks are all backfill: read across tenants, through a function of the
        tables' owner (migrations 0008, 0019)."""
        rows = await self.session.execute(_STRANDED, {"p_age": min_age_s, "p_limit": limit})
        return [(r[0], r[1], bool(r[2])) for r in rows]

    async def tokens_today(
        self, tenant_id: uuid.UUID, day: datetime, *, always: bool = False
    ) -> tuple[int | None, int]:
        """The tenant's daily token budget as set now (None: none), and the writer tokens it has
        spent since `day`: its writer changesets', and the failed attempts' of chunks still waiting
        or failed. Without a budget, what it spent is summed only if `always` (else 0): a status read
        of a queued chunk asks only whether a budget holds it."""
        params = {"p_tenant_id": tenant_id, "p_day": day, "p_always": always}
        row = (await self.session.execute(_TOKENS_TODAY, params)).one()
        return (int(row[0]) if row[0] is not None else None), int(row[1] or 0)

    # --- chunks coming in ---------------------------------------------------------------------

    async def insert_many(self, rows: Sequence[dict[str, Any]]) -> set[uuid.UUID]:
        """Insert chunks; returns the ids inserted (a row whose idempotency key was taken meanwhile by
        another process is skipped)."""
        if not rows:
            return set()
        columns = as_columns(rows, _INSERTED, json=("messages", "metadata"), defaults=_OPTIONAL)
        result = await self.session.execute(_INSERT_CHUNKS, columns)
        return set(result.scalars().all())

    async def insert_imported(self, rows: Sequence[dict[str, Any]]) -> int:
        """Chunks of another instance's export (`transfer`); those already here are left as they are.
        How many were new."""
        if not rows:
            return 0
        table = cast("Table", Chunk.__table__)
        stmt = (
            insert(table)
            .on_conflict_do_nothing(index_elements=[table.c.tenant_id, table.c.id])
            .returning(table.c.id)
        )
        return len((await self.session.execute(stmt, list(rows))).all())

    # --- an admin's retry ----------------------------------------------------------------------

    async def requeue_failed(self, tenant_id: uuid.UUID, chunk_id: uuid.UUID) -> Chunk | None:
        """A failed chunk back to `queued` with fresh attempts; None if it is not failed."""
        return await self.session.scalar(
            update(Chunk)
            .where(Chunk.tenant_id == tenant_id, Chunk.id == chunk_id, Chunk.status == "failed")
            .values(
                status="queued",
                attempts=0,
                last_error=None,
                available_at=func.now(),
                updated_at=func.now(),
            )
            .returning(Chunk)
        )

    async def chunk(self, tenant_id: uuid.UUID, chunk_id: uuid.UUID) -> Chunk | None:
        return await self.session.scalar(
            select(Chunk).where(Chunk.tenant_id == tenant_id, Chunk.id == chunk_id)
        )

    # --- a shadow bank's chunks -----------------------------------------------------------------

    async def feed_bank(
        self,
        *,
        bank_id: uuid.UUID,
        source_id: uuid.UUID,
        writer: str,
        since: datetime,
        until: datetime | None = None,
        user_id: str | None = None,
        limit: int = 1000,
    ) -> list[str]:
        """Copy up to `limit` of the source's chunks the bank has not had into it, queued for `writer`;
        the users of the copied chunks, one per chunk."""
        rows = await self.session.execute(
            _FEED,
            {
                "p_bank": bank_id,
                "p_source": source_id,
                "p_writer": writer,
                "p_since": since,
                "p_until": until,
                "p_user": user_id,
                "p_limit": limit,
            },
        )
        return [r[0] for r in rows]
