"""SQL of ingestion: the scopes' `seq` counters, and the reads of chunks ingestion and the API make.
Chunks are written by the chunk queue alone (`pipeline/repositories.py`)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, TextClause, func, select, text, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Changeset, Chunk, Scope

_scopes = cast("Table", Scope.__table__)
# One statement text whatever the number of scopes (a column each, as an array), so one prepared
# statement; rows are taken, and locked, in the arrays' order.
_ALLOCATE_SEQS = text(
    """INSERT INTO scopes (tenant_id, user_id, last_seq)
    SELECT * FROM unnest(CAST(:tenants AS uuid[]), CAST(:users AS text[]), CAST(:counts AS bigint[]))
    ON CONFLICT (tenant_id, user_id) DO UPDATE SET last_seq = scopes.last_seq + excluded.last_seq
    RETURNING tenant_id, user_id, last_seq
    """
)


class ScopeRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def allocate_seqs(
        self, counts: dict[tuple[uuid.UUID, str], int]
    ) -> dict[tuple[uuid.UUID, str], int]:
        """Reserve `n` consecutive sequence numbers per scope; returns each scope's last one.

        The scope rows stay locked until commit, so chunks of one user commit in `seq` order: a worker
        never sees seq n+1 committed while n is still in flight. Rows are locked in key order, so two
        concurrent batches cannot deadlock on them.
        """
        if not counts:
            return {}
        scopes = sorted(counts)
        params = {
            "tenants": [t for t, _ in scopes],
            "users": [u for _, u in scopes],
            "counts": [counts[scope] for scope in scopes],
        }
        rows = await self.session.execute(_ALLOCATE_SEQS, params)
        return {(r.tenant_id, r.user_id): int(r.last_seq) for r in rows}

    async def raise_last_seq(self, tenant_id: uuid.UUID, user_id: str, seq: int) -> None:
        """The user's chunk numbering continues after `seq` (chunks imported with their numbers)."""
        stmt = insert(_scopes).values(tenant_id=tenant_id, user_id=user_id, last_seq=seq)
        await self.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[_scopes.c.tenant_id, _scopes.c.user_id],
                set_={"last_seq": func.greatest(_scopes.c.last_seq, stmt.excluded.last_seq)},
            )
        )

    async def page(
        self, tenant_id: uuid.UUID, *, prefix: str | None, after: str | None, limit: int
    ) -> Sequence[Scope]:
        """A tenant's users (one scope each), in `user_id` order, those starting with `prefix` only."""
        stmt = select(Scope).where(Scope.tenant_id == tenant_id)
        if prefix:
            stmt = stmt.where(func.starts_with(Scope.user_id, prefix))
        if after is not None:
            stmt = stmt.where(Scope.user_id > after)
        return (await self.session.scalars(stmt.order_by(Scope.user_id).limit(limit))).all()


_UNFINISHED = "c.status IN ('queued', 'processing')"  # the predicate of ix_chunks_scope_pending
# A scope's chunks are numbered 1..last_seq (imports raise last_seq to their numbers), so last_seq
# bounds its unfinished ones: a scope whose last_seq leaves room for the whole batch under the cap
# (:room, the cap less the batch's chunks) is not counted. Most scopes are, so a batch costs a primary
# key lookup per scope, not a walk of each one's backlog; only a scope near or past the cap is counted.
# A scope with no row yet has no chunk (the caller's figure is 0). One branch per tenant of the batch,
# the tenant a value in each table's predicate: on a Citus cluster each branch is a query of that
# tenant's shard alone (a subquery correlated to `unnest` cannot be pushed down, and a join to it
# prunes no shard).
_SCOPE_BRANCH = f"""
    SELECT sc.tenant_id, sc.user_id,
        CASE WHEN sc.last_seq <= :room THEN sc.last_seq ELSE (
            SELECT count(*) FROM (
                SELECT 1 FROM chunks c
                WHERE c.tenant_id = :t{{i}} AND c.user_id = sc.user_id AND {_UNFINISHED}
                LIMIT :cap
            ) AS capped
        ) END AS n
    FROM scopes sc
    WHERE sc.tenant_id = :t{{i}} AND sc.user_id = ANY (CAST(:users_{{i}} AS text[]))
    """  # noqa: S608  (no input in the text: the predicate is a constant)


@functools.cache
def _unfinished_per_scope(tenants: int) -> TextClause:
    return text(" UNION ALL ".join(_SCOPE_BRANCH.format(i=i) for i in range(tenants)))


@functools.cache
def _unfinished_per_tenant(tenants: int) -> TextClause:
    """One capped count per tenant, each naming its tenant as a value (on a Citus cluster, a query of
    that tenant's shard alone), in one statement."""
    count = (  # no input in the text: numbered names and a constant predicate
        "SELECT CAST(:t{i} AS uuid), count(*) FROM ("  # noqa: S608
        "SELECT 1 FROM chunks c WHERE c.tenant_id = :t{i} AND " + _UNFINISHED + " LIMIT :cap) AS capped_{i}"
    )
    counts = [count.format(i=i) for i in range(tenants)]
    return text(" UNION ALL ".join(counts))


class ChunkRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, tenant_id: uuid.UUID, chunk_id: uuid.UUID) -> Chunk | None:
        return await self.session.scalar(
            select(Chunk).where(Chunk.tenant_id == tenant_id, Chunk.id == chunk_id)
        )

    async def many(self, tenant_id: uuid.UUID, chunk_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Chunk]:
        """The tenant's chunks among `chunk_ids`, by id."""
        if not chunk_ids:
            return {}
        rows = await self.session.scalars(
            select(Chunk).where(Chunk.tenant_id == tenant_id, Chunk.id.in_(list(set(chunk_ids))))
        )
        return {c.id: c for c in rows}

    async def written(self, chunks: Sequence[Chunk]) -> dict[uuid.UUID, tuple[str | None, dict[str, Any]]]:
        """The writer and usage the changesets of the applied ones among `chunks` recorded, by chunk."""
        changesets = {c.changeset_id: c.id for c in chunks if c.status == "applied" and c.changeset_id}
        if not changesets:
            return {}
        rows = await self.session.execute(
            select(Changeset.id, Changeset.writer, Changeset.usage).where(
                Changeset.tenant_id == chunks[0].tenant_id, Changeset.id.in_(list(changesets))
            )
        )
        return {changesets[cid]: (writer, dict(usage or {})) for cid, writer, usage in rows}

    async def page_by_status(
        self,
        tenant_id: uuid.UUID,
        status: str | None,
        *,
        user_id: str | None,
        before: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> Sequence[Chunk]:
        """A tenant's chunks in `status` (None: any), newest first (keyset on received_at, id; descending)."""
        stmt = select(Chunk).where(Chunk.tenant_id == tenant_id)
        if status is not None:
            stmt = stmt.where(Chunk.status == status)
        if user_id is not None:
            stmt = stmt.where(Chunk.user_id == user_id)
        if before is not None:
            stmt = stmt.where(tuple_(Chunk.received_at, Chunk.id) < tuple_(*before))
        stmt = stmt.order_by(Chunk.received_at.desc(), Chunk.id.desc()).limit(limit)
        return (await self.session.scalars(stmt)).all()

    async def ids_at_seqs(
        self, tenant_id: uuid.UUID, user_id: str, seqs: Sequence[int]
    ) -> dict[int, uuid.UUID]:
        """Which chunk holds each of these numbers of the user's sequence."""
        if not seqs:
            return {}
        rows = await self.session.execute(
            select(Chunk.seq, Chunk.id).where(
                Chunk.tenant_id == tenant_id, Chunk.user_id == user_id, Chunk.seq.in_(list(set(seqs)))
            )
        )
        return {int(seq): chunk_id for seq, chunk_id in rows}

    async def by_idempotency_keys(
        self, pairs: Sequence[tuple[uuid.UUID, str]]
    ) -> dict[tuple[uuid.UUID, str], Chunk]:
        if not pairs:
            return {}
        rows = await self.session.scalars(
            select(Chunk).where(tuple_(Chunk.tenant_id, Chunk.idempotency_key).in_(list(pairs)))
        )
        return {(c.tenant_id, c.idempotency_key): c for c in rows if c.idempotency_key is not None}

    async def unfinished(
        self,
        scopes: Sequence[tuple[uuid.UUID, str]],
        scope_cap: int,
        tenants: Sequence[uuid.UUID],
        tenant_cap: int,
        *,
        adding: int = 0,
    ) -> tuple[dict[tuple[uuid.UUID, str], int], dict[uuid.UUID, int]]:
        """Chunks not yet applied (queued or processing) per scope of `scopes` and per tenant of
        `tenants`, each counted only up to its cap (0: not counted) over the small index of unfinished
        chunks, so a count costs at most the cap's worth of index entries however long the backlog.

        A scope's figure is an upper bound: its `last_seq` where that leaves room for `adding` more
        chunks under the cap (no count needed to admit them), else its count."""
        per_scope: dict[tuple[uuid.UUID, str], int] = dict.fromkeys(scopes, 0)
        per_tenant: dict[uuid.UUID, int] = dict.fromkeys(tenants, 0)
        if scope_cap > 0 and scopes:
            users: dict[uuid.UUID, list[str]] = {}
            for tenant_id, user_id in scopes:
                users.setdefault(tenant_id, []).append(user_id)
            params: dict[str, Any] = {"cap": scope_cap + 1, "room": scope_cap - adding}
            for i, (tenant_id, names) in enumerate(users.items()):
                params |= {f"t{i}": tenant_id, f"users_{i}": names}
            rows = await self.session.execute(_unfinished_per_scope(len(users)), params)
            per_scope.update({(t, u): int(n) for t, u, n in rows})
        if tenant_cap > 0 and tenants:
            counts = {f"t{i}": t for i, t in enumerate(tenants)} | {"cap": tenant_cap + 1}
            rows = await self.session.execute(_unfinished_per_tenant(len(tenants)), counts)
            per_tenant.update({t: int(n) for t, n in rows})
        return per_scope, per_tenant
