"""SQL of history: heads and past versions, changesets, and purge.

Undo decides here what to restore; `memories.version_writer` writes it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select, text, true, tuple_, update
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Integer

from app.db.models import Changeset, Chunk, Memory, MemoryVersion, Review, Scope
from app.domain.memories.repositories import HEAD_STATE, VERSIONS, VersionState, in_force_at
from app.domain.memories.version_writer import Restoration

MEMORIES = cast("Table", Memory.__table__)
_m = MEMORIES.c
_v = VERSIONS.c

# Restorations whose text differs from the head's and whose stored vector was written before the last
# `memstore reembed` finished (`embedding_config.changed_at`) or the tenant's last move to another
# embedder did (`embedder_changed_at` in its settings): that vector is another model's. Without a
# re-embedding ever, the one-time filter on the later of the two skips the whole query.
_STALE_VECTORS = text(
    """
    WITH changed AS MATERIALIZED (
        SELECT greatest((SELECT changed_at FROM embedding_config WHERE id = 1),
                        (SELECT (settings ->> 'embedder_changed_at')::timestamptz FROM tenants
                         WHERE id = :tenant_id)) AS changed_at
    )
    SELECT p.memory_id, tv.content
    FROM unnest(:memory_ids, :source_versions) AS p(memory_id, source_version)
    JOIN memory_versions tv ON tv.memory_id = p.memory_id AND tv.version = p.source_version
    JOIN memories m ON m.tenant_id = tv.tenant_id AND m.id = p.memory_id
    CROSS JOIN LATERAL (
        SELECT e.created_at FROM memory_versions e
        WHERE e.tenant_id = tv.tenant_id AND e.memory_id = tv.memory_id AND e.version <= tv.version
          AND e.embedding IS NOT NULL
        ORDER BY e.version DESC LIMIT 1
    ) written
    WHERE tv.tenant_id = :tenant_id AND tv.content <> m.content
      AND (SELECT changed_at FROM changed) IS NOT NULL
      AND written.created_at < (SELECT changed_at FROM changed)
    """
).bindparams(
    bindparam("memory_ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("source_versions", type_=ARRAY(Integer)),
)

_STATES_AT = text(
    """
    SELECT v.memory_id, v.version, v.status, v.content, v.tags, v.owner, v.memory_at, v.expires_at,
           v.valid_from, v.valid_to
    FROM unnest(:memory_ids, :versions) AS p(memory_id, version)
    JOIN memory_versions v ON v.memory_id = p.memory_id AND v.version = p.version
    WHERE v.tenant_id = :tenant_id
    """
).bindparams(
    bindparam("memory_ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("versions", type_=ARRAY(Integer)),
)

# Versions written after a given version of each memory, by changesets outside a given set.
_LATER_TOUCHES = text(
    """
    SELECT v.memory_id, v.version, v.changeset_id, v.op, v.actor, v.created_at
    FROM unnest(:memory_ids, :versions) AS p(memory_id, version)
    JOIN memory_versions v ON v.memory_id = p.memory_id AND v.version > p.version
    WHERE v.tenant_id = :tenant_id AND NOT (v.changeset_id = ANY(:excluded))
    ORDER BY v.memory_id, v.version
    """
).bindparams(
    bindparam("memory_ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("versions", type_=ARRAY(Integer)),
    bindparam("excluded", type_=ARRAY(UUID(as_uuid=True))),
)


# What a purge deletes (`memstore_purge_user`, in this order), and counts in a dry run.
_PURGED: tuple[tuple[str, Any], ...] = (
    ("reviews", Review),
    ("versions", MemoryVersion),
    ("memories", Memory),
    ("changesets", Changeset),
    ("chunks", Chunk),
    ("scopes", Scope),
)


@dataclass(frozen=True)
class Touch:
    """A version some changeset wrote."""

    memory_id: uuid.UUID
    version: int
    changeset_id: uuid.UUID
    user_id: str


class HistoryRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def lock_heads(
        self, tenant_id: uuid.UUID, user_id: str, ids: Sequence[uuid.UUID] | None = None
    ) -> dict[uuid.UUID, VersionState]:
        """Row-lock the scope's memories (all, or `ids`) in id order, as the apply step does."""
        stmt = (
            select(_m.id.label("memory_id"), *HEAD_STATE)
            .where(_m.tenant_id == tenant_id, _m.user_id == user_id)
            .order_by(_m.id)
            .with_for_update()
        )
        if ids is not None:
            stmt = stmt.where(_m.id.in_(list(ids)))
        rows = await self.session.execute(stmt)
        return {r.memory_id: VersionState.of(r) for r in rows}

    async def lock_heads_with_past(
        self, tenant_id: uuid.UUID, user_id: str, as_of: datetime
    ) -> tuple[dict[uuid.UUID, VersionState], dict[uuid.UUID, VersionState]]:
        """Row-lock every memory of the scope (id order) and read, in the same pass, the version of
        each that was in force at `as_of` (absent for memories created later)."""
        then = in_force_at(tenant_id, as_of)
        rows = await self.session.execute(
            select(
                _m.id,
                _m.version,
                _m.status,
                _m.content,
                _m.tags,
                _m.owner,
                _m.memory_at,
                then.c.version,
                then.c.status,
                then.c.content,
                then.c.tags,
                then.c.owner,
                then.c.memory_at,
                _m.expires_at,
                then.c.expires_at,
                _m.valid_from,
                _m.valid_to,
                then.c.valid_from,
                then.c.valid_to,
            )
            .select_from(MEMORIES.outerjoin(then, true()))
            .where(_m.tenant_id == tenant_id, _m.user_id == user_id)
            .order_by(_m.id)
            .with_for_update(of=MEMORIES)
        )
        heads: dict[uuid.UUID, VersionState] = {}
        past: dict[uuid.UUID, VersionState] = {}
        for r in rows:
            heads[r[0]] = VersionState(r[0], r[1], r[2], r[3], tuple(r[4]), r[5], r[6], r[13], r[15], r[16])
            if r[7] is not None:
                past[r[0]] = VersionState(
                    r[0], r[7], r[8], r[9], tuple(r[10]), r[11], r[12], r[14], r[17], r[18]
                )
        return heads, past

    async def states_at(
        self, tenant_id: uuid.UUID, wanted: Sequence[tuple[uuid.UUID, int]]
    ) -> dict[tuple[uuid.UUID, int], VersionState]:
        """The stored state of each (memory, version)."""
        if not wanted:
            return {}
        rows = await self.session.execute(
            _STATES_AT,
            {
                "tenant_id": tenant_id,
                "memory_ids": [m for m, _ in wanted],
                "versions": [v for _, v in wanted],
            },
        )
        return {(r.memory_id, r.version): VersionState.of(r) for r in rows}

    async def touches(self, tenant_id: uuid.UUID, changeset_ids: Sequence[uuid.UUID]) -> list[Touch]:
        """Every version the given changesets of the tenant wrote."""
        rows = await self.session.execute(
            select(_v.memory_id, _v.version, _v.changeset_id, _v.user_id).where(
                _v.tenant_id == tenant_id, _v.changeset_id.in_(list(changeset_ids))
            )
        )
        return [Touch(r.memory_id, r.version, r.changeset_id, r.user_id) for r in rows]

    async def later_touches(
        self,
        tenant_id: uuid.UUID,
        after: dict[uuid.UUID, int],
        excluded: Sequence[uuid.UUID],
    ) -> list[dict[str, Any]]:
        """Versions written after `after[memory]` by changesets other than `excluded`."""
        if not after:
            return []
        rows = await self.session.execute(
            _LATER_TOUCHES,
            {
                "tenant_id": tenant_id,
                "memory_ids": list(after),
                "versions": list(after.values()),
                "excluded": list(excluded),
            },
        )
        return [
            {
                "memory_id": str(r.memory_id),
                "version": r.version,
                "changeset_id": str(r.changeset_id),
                "op": r.op,
                "actor": r.actor,
                "created_at": r.created_at.isoformat(),
            }
            for r in rows
        ]

    async def stale_vectors(
        self, tenant_id: uuid.UUID, restorations: Sequence[Restoration]
    ) -> list[tuple[uuid.UUID, str]]:
        """(memory, text) of the restorations whose stored vector may be another model's (see
        `_STALE_VECTORS`): they need embedding again."""
        if not restorations:
            return []
        rows = await self.session.execute(
            _STALE_VECTORS,
            {
                "tenant_id": tenant_id,
                "memory_ids": [r.memory_id for r in restorations],
                "source_versions": [r.source_version for r in restorations],
            },
        )
        return [(row.memory_id, row.content) for row in rows]

    # --- changesets ------------------------------------------------------------------------------

    async def changeset(
        self, tenant_id: uuid.UUID, changeset_id: uuid.UUID, *, lock: bool = False
    ) -> Changeset | None:
        stmt = select(Changeset).where(Changeset.tenant_id == tenant_id, Changeset.id == changeset_id)
        if lock:
            stmt = stmt.with_for_update()
        return await self.session.scalar(stmt)

    async def changesets(
        self,
        tenant_id: uuid.UUID,
        *,
        user_id: str | None = None,
        writer: str | None = None,
        model: str | None = None,
        kind: str | Sequence[str] | None = None,
        status: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before: tuple[datetime, uuid.UUID] | None = None,
        limit: int | None = None,
        lock: bool = False,
    ) -> Sequence[Changeset]:
        """Matching changesets, newest first (keyset on (created_at, id) descending)."""
        stmt = select(Changeset).where(Changeset.tenant_id == tenant_id)
        for column, value in (
            (Changeset.user_id, user_id),
            (Changeset.writer, writer),
            (Changeset.model, model),
            (Changeset.status, status),
        ):
            if value is not None:
                stmt = stmt.where(column == value)
        if kind is not None:
            stmt = stmt.where(Changeset.kind.in_([kind] if isinstance(kind, str) else list(kind)))
        if since is not None:
            stmt = stmt.where(Changeset.created_at >= since)
        if until is not None:
            stmt = stmt.where(Changeset.created_at < until)
        if before is not None:
            stmt = stmt.where(tuple_(Changeset.created_at, Changeset.id) < tuple_(*before))
        stmt = stmt.order_by(Changeset.created_at.desc(), Changeset.id.desc())
        if limit is not None:
            stmt = stmt.limit(limit)
        if lock:
            stmt = stmt.with_for_update()
        return (await self.session.scalars(stmt)).all()

    async def changesets_by_ids(
        self, tenant_id: uuid.UUID, changeset_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, Changeset]:
        """The tenant's changesets among `changeset_ids`, by id."""
        if not changeset_ids:
            return {}
        rows = await self.session.scalars(
            select(Changeset).where(
                Changeset.tenant_id == tenant_id, Changeset.id.in_(list(set(changeset_ids)))
            )
        )
        return {c.id: c for c in rows}

    async def changeset_counts(
        self,
        tenant_id: uuid.UUID,
        *,
        user_id: str | None,
        since: datetime | None,
        until: datetime | None,
    ) -> list[dict[str, Any]]:
        """Changesets counted by kind, writer, model and status, with the first and last of each."""
        c = Changeset
        stmt = select(
            c.kind, c.writer, c.model, c.status, func.count(), func.min(c.created_at), func.max(c.created_at)
        ).where(c.tenant_id == tenant_id)
        if user_id is not None:
            stmt = stmt.where(c.user_id == user_id)
        if since is not None:
            stmt = stmt.where(c.created_at >= since)
        if until is not None:
            stmt = stmt.where(c.created_at < until)
        stmt = stmt.group_by(c.kind, c.writer, c.model, c.status).order_by(func.count().desc(), c.kind)
        keys = ("kind", "writer", "model", "status", "count", "first_at", "last_at")
        return [dict(zip(keys, row, strict=True)) for row in await self.session.execute(stmt)]

    async def mark_reverted(self, tenant_id: uuid.UUID, changeset_ids: Sequence[uuid.UUID]) -> None:
        if changeset_ids:
            await self.session.execute(
                update(Changeset)
                .where(
                    Changeset.tenant_id == tenant_id,
                    Changeset.id.in_(list(changeset_ids)),
                    Changeset.status == "applied",
                )
                .values(status="reverted")
            )

    # --- purge -----------------------------------------------------------------------------------

    async def count_user_rows(self, tenant_id: uuid.UUID, user_id: str) -> dict[str, int]:
        """How many rows a purge of the user would delete, per kind."""
        counts: dict[str, int] = {}
        for name, model in _PURGED:
            table = cast("Table", model.__table__)
            counts[name] = int(
                await self.session.scalar(
                    select(func.count())
                    .select_from(table)
                    .where(table.c.tenant_id == tenant_id, table.c.user_id == user_id)
                )
                or 0
            )
        return counts

    async def purge_user(self, tenant_id: uuid.UUID, user_id: str) -> dict[str, int]:
        """Delete every row holding the user's content, through `memstore_purge_user` (migration 0008):
        history tables refuse DELETE unless the purge switch is on, and honour it only for the tables'
        owner, whose function this is; it erases only a tenant the connection is set to.

        It locks the scope row first. Ingestion takes a chunk's `seq` by updating that row and holds
        it until the chunk commits: a purge that deleted the chunks before such a chunk committed, and
        the scope row after, would leave the chunk behind with the numbering reset, so a later chunk
        of the user would collide with it on `uq_chunks_scope_seq`. Locked first, an ingestion under
        way commits before the purge goes on, and each DELETE (a new snapshot, READ COMMITTED) sees its
        chunk; one that comes later waits for the purge and numbers from 1 again, nothing of the user's
        being left to collide with."""
        counts = await self.session.scalar(select(func.memstore_purge_user(tenant_id, user_id, type_=JSONB)))
        return {name: int((counts or {}).get(name, 0)) for name, _ in _PURGED}
