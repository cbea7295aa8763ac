"""SQL reading memories and memory versions, and writing changesets.

Rows of `memories` and `memory_versions` are written by `version_writer` alone."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Table,
    TextClause,
    and_,
    any_,
    bindparam,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    true,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import vector_text
from app.db.distribution import session_is_distributed
from app.db.models import Changeset, Memory, MemoryVersion

MEMORIES = cast("Table", Memory.__table__)
VERSIONS = cast("Table", MemoryVersion.__table__)
CHANGESETS = cast("Table", Changeset.__table__)

# Built once: the worker runs these for every chunk.
_m = MEMORIES.c
# A head's state after its id: what the apply step and history's undo lock and compare.
HEAD_STATE = (
    _m.version,
    _m.status,
    _m.content,
    _m.tags,
    _m.owner,
    _m.memory_at,
    _m.expires_at,
    _m.valid_from,
    _m.valid_to,
)
_STATE = (_m.id, *HEAD_STATE)
_UUIDS = ARRAY(UUID(as_uuid=True))
_LOCK_STATES = (
    select(_m.tenant_id, _m.user_id, *_STATE)
    .where(
        _m.id == any_(bindparam("p_ids", type_=_UUIDS)),
        _m.tenant_id == any_(bindparam("p_tenant_ids", type_=_UUIDS)),
    )
    .order_by(_m.id)
    .with_for_update()
)


def unexpired(expires_at: Any, at: Any = None) -> ColumnElement[bool]:
    """Whether a memory's `expires_at` column is still in the future at `at` (default: the transaction's
    time): the condition every read that hides expired memories adds to its own statement."""
    return or_(expires_at.is_(None), expires_at > (func.now() if at is None else at))


def held_at(valid_from: Any, valid_to: Any, memory_at: Any, created_at: Any, at: Any) -> ColumnElement[bool]:
    """Whether a memory's fact held at `at` (valid time): from its `valid_from` — or, unknown, from when
    it was stated (`memory_at`, else written) — until its `valid_to`, if it has one. A fact whose start
    is unknown and which ended before it was stated ("I live in Lyon", then "I moved to Seattle last
    month") held, as far as the bank knows, at any time before it ended."""
    stated = func.coalesce(memory_at, created_at)
    began = case(
        (and_(valid_from.is_(None), valid_to <= stated), literal("-infinity").cast(DateTime(timezone=True))),
        else_=func.coalesce(valid_from, stated),
    )
    return and_(began <= at, or_(valid_to.is_(None), valid_to > at))


@dataclass(frozen=True)
class MemoryState:
    """A memory's current head, without its vector (what the apply step needs to decide and record)."""

    id: uuid.UUID
    version: int
    status: str
    content: str
    tags: tuple[str, ...]
    owner: str
    memory_at: datetime | None
    expires_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None

    def state(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "tags": list(self.tags),
            "owner": self.owner,
            "status": self.status,
            "memory_at": self.memory_at,
            "expires_at": self.expires_at,
            "valid_from": self.valid_from,
            "valid_to": self.valid_to,
        }

    def change(self, tenant_id: uuid.UUID, changeset_id: uuid.UUID, **values: Any) -> dict[str, Any]:
        """Parameters of the UPDATE moving this head (of `tenant_id`) to its next version
        (`VersionWriter.write_applied`)."""
        return {
            "b_tenant_id": tenant_id,
            "b_id": self.id,
            "b_version": self.version + 1,
            "b_changeset_id": changeset_id,
            "b_status": values.get("status", self.status),
            "b_content": values.get("content", self.content),
            "b_tags": values.get("tags", list(self.tags)),
            "b_embedding": values.get("embedding"),
            "b_memory_at": values.get("memory_at"),
            "b_expires_at": values.get("expires_at", self.expires_at),
            "b_valid_from": values.get("valid_from", self.valid_from),
            "b_valid_to": values.get("valid_to", self.valid_to),
        }


@dataclass(frozen=True)
class VersionState:
    """One stored version of a memory, without its vector: what undo compares and copies."""

    memory_id: uuid.UUID
    version: int
    status: str
    content: str
    tags: tuple[str, ...]
    owner: str
    memory_at: datetime | None
    expires_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None

    @classmethod
    def of(cls, row: Any) -> VersionState:
        return cls(
            row.memory_id,
            row.version,
            row.status,
            row.content,
            tuple(row.tags),
            row.owner,
            row.memory_at,
            row.expires_at,
            row.valid_from,
            row.valid_to,
        )

    def same_state(self, other: VersionState) -> bool:
        return self._compared() == other._compared()

    def _compared(self) -> tuple[Any, ...]:
        return (
            self.status,
            self.content,
            self.tags,
            self.owner,
            self.memory_at,
            self.expires_at,
            self.valid_from,
            self.valid_to,
        )


@dataclass(frozen=True, slots=True)
class MemoryAsOf:
    """A memory as it stood at a time: the fields of `Memory`, with `version`, `content`, `status` ...
    those of the version then in force and `updated_at` when that version was written (a plain
    object: building ORM instances for a thousand rows costs more than the query)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: str
    agent_id: str | None
    run_id: str | None
    created_at: datetime
    content: str
    tags: list[str]
    owner: str
    status: str
    version: int
    memory_at: datetime | None
    changeset_id: uuid.UUID | None
    updated_at: datetime
    expires_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    embedding: list[float] | None = None


def in_force_at(tenant_id: uuid.UUID, as_of: datetime) -> Any:
    """A LATERAL subquery: for the memory of the enclosing row (of `tenant_id`), its latest version
    written at or before `as_of` (none if the memory was created later).

    The subquery names its tenant as a value, not as the enclosing row's: on a Citus cluster a lateral
    subquery with a LIMIT correlated to the tenant of the outer row prunes no shard, and the statement
    went to every shard (a row lock with it, as a restore takes, is refused there).

    A version's time is its transaction's start; one transaction writes at most one version of a
    memory, so (memory, time) never ties and the highest version number is the one in force. One
    backward walk of the (tenant_id, memory_id, version) index per memory: the cost follows the bank's size,
    not the length of its history.
    """
    v = VERSIONS.alias("v")
    return (
        select(
            v.c.memory_id,
            v.c.version,
            v.c.status,
            v.c.content,
            v.c.tags,
            v.c.owner,
            v.c.memory_at,
            v.c.changeset_id,
            v.c.created_at,
            v.c.expires_at,
            v.c.valid_from,
            v.c.valid_to,
        )
        .where(v.c.tenant_id == tenant_id, v.c.memory_id == _m.id, v.c.created_at <= as_of)
        .order_by(v.c.version.desc())
        .limit(1)
        .lateral("h")
    )


def effective_embedding(tenant_id: Any, memory_id: Any, version: Any) -> Any:
    """The vector in force at a version: its own, or the latest earlier one (DELETE and SUPERSEDE
    versions do not repeat the vector)."""
    e = VERSIONS.alias("e")
    return (
        select(e.c.embedding)
        .where(
            e.c.tenant_id == tenant_id,
            e.c.memory_id == memory_id,
            e.c.version <= version,
            e.c.embedding.is_not(None),
        )
        .order_by(e.c.version.desc())
        .limit(1)
        .scalar_subquery()
    )


# Per (tenant, user, vector): the scope's nearest active memory, exact. Ordering by `distance + 0`
# keeps the planner on the scope's B-tree: ordered by the bare distance, it may walk the tenant-wide
# HNSW graph looking for this user's rows instead, which is slower, and a filtered graph walk can come
# back empty, so a duplicate would go unnoticed. Vectors travel as text and are cast once each. An
# expired memory is not one: what it said may be said again, and stored.
# Each tenant a branch naming it as a value, all in one statement: on a Citus cluster each branch is a
# query of that tenant's shard alone (a lateral join correlated to a tenant read from `unnest` cannot be
# pushed down), and one Postgres still answers a batch of several tenants in one round trip (a cluster
# refuses such a union of branches: there, a statement a tenant, `MemoryRepository.closest_active`).
_CLOSEST_BRANCH = (
    "SELECT q.ord, m.id, m.distance, m.content"
    " FROM unnest(CAST(:u{i} AS text[]), CAST(CAST(:v{i} AS text[]) AS vector[]),"
    " CAST(:o{i} AS integer[])) AS q(user_id, v, ord)"
    " CROSS JOIN LATERAL (SELECT memories.id, memories.content, memories.embedding <=> q.v AS distance"
    " FROM memories"
    " WHERE memories.tenant_id = :t{i} AND memories.user_id = q.user_id"
    " AND memories.status = 'active' AND (memories.expires_at IS NULL OR memories.expires_at > now())"
    " ORDER BY (memories.embedding <=> q.v) + 0 LIMIT :k) AS m"
)


@functools.cache
def closest_active_statement(tenants: int) -> TextClause:
    """The nearest active memories of a batch of `tenants` tenants' (user, vector) pairs, ordered by
    the pair's place in the batch, then by distance (numbered names only in the text)."""
    if tenants == 1:
        return text(_CLOSEST_BRANCH.format(i=0) + " ORDER BY q.ord, m.distance")
    branches = " UNION ALL ".join(f"({_CLOSEST_BRANCH.format(i=i)})" for i in range(tenants))
    return text(f"SELECT ord, id, distance, content FROM ({branches}) AS found ORDER BY ord, distance")  # noqa: S608


class MemoryRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, tenant_id: uuid.UUID, memory_id: uuid.UUID) -> Memory | None:
        return await self.session.scalar(
            select(Memory).where(Memory.tenant_id == tenant_id, Memory.id == memory_id)
        )

    async def page(
        self,
        tenant_id: uuid.UUID,
        user_id: str,
        *,
        agent_id: str | None,
        statuses: Sequence[str] | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        include_expired: bool = False,
        valid_at: datetime | None = None,
    ) -> Sequence[Memory]:
        """A page of a scope's memories, oldest first, keyset-paginated on (created_at, id); those
        whose time has passed only with `include_expired`; with `valid_at`, those whose fact held
        then."""
        stmt = select(Memory).where(Memory.tenant_id == tenant_id, Memory.user_id == user_id)
        if not include_expired:
            stmt = stmt.where(unexpired(_m.expires_at))
        if valid_at is not None:
            stmt = stmt.where(held_at(_m.valid_from, _m.valid_to, _m.memory_at, _m.created_at, valid_at))
        if agent_id is not None:
            stmt = stmt.where(Memory.agent_id == agent_id)
        if statuses is not None:
            stmt = stmt.where(Memory.status.in_(statuses))
        if after is not None:
            stmt = stmt.where(tuple_(Memory.created_at, Memory.id) > tuple_(*after))
        stmt = stmt.order_by(Memory.created_at, Memory.id).limit(limit)
        return (await self.session.scalars(stmt)).all()

    async def bank_as_of(
        self,
        tenant_id: uuid.UUID,
        user_id: str,
        as_of: datetime,
        *,
        agent_id: str | None = None,
        statuses: Sequence[str] | None = ("active",),
        after: tuple[datetime, uuid.UUID] | None = None,
        limit: int | None = None,
        with_embedding: bool = False,
        include_expired: bool = False,
        valid_at: datetime | None = None,
    ) -> list[MemoryAsOf]:
        """The scope's memories as they stood at `as_of` (from their versions), oldest first; those
        whose version then in force had expired by `as_of` only with `include_expired`.

        `embedding` (if asked for) is the vector the version then in force was searched by.
        Keyset-paginated on (created_at, id) like `page`.
        """
        heads = in_force_at(tenant_id, as_of)
        columns = [
            _m.id,
            _m.user_id,
            _m.agent_id,
            _m.run_id,
            _m.created_at,
            heads.c.content,
            heads.c.tags,
            heads.c.owner,
            heads.c.status,
            heads.c.version,
            heads.c.memory_at,
            heads.c.changeset_id,
            heads.c.created_at.label("updated_at"),
            heads.c.expires_at,
            heads.c.valid_from,
            heads.c.valid_to,
        ]
        if with_embedding:
            columns.append(
                effective_embedding(_m.tenant_id, heads.c.memory_id, heads.c.version).label("embedding")
            )
        stmt = (
            select(*columns)
            .select_from(MEMORIES.join(heads, true()))
            .where(_m.tenant_id == tenant_id, _m.user_id == user_id)
        )
        if agent_id is not None:
            stmt = stmt.where(_m.agent_id == agent_id)
        if statuses is not None:
            stmt = stmt.where(heads.c.status.in_(list(statuses)))
        if not include_expired:
            stmt = stmt.where(unexpired(heads.c.expires_at, as_of))
        if valid_at is not None:
            stmt = stmt.where(
                held_at(heads.c.valid_from, heads.c.valid_to, heads.c.memory_at, _m.created_at, valid_at)
            )
        if after is not None:
            stmt = stmt.where(tuple_(_m.created_at, _m.id) > tuple_(*after))
        stmt = stmt.order_by(_m.created_at, _m.id)
        if limit is not None:
            stmt = stmt.limit(limit)
        rows = await self.session.execute(stmt)
        return [MemoryAsOf(row[0], tenant_id, *row[1:]) for row in rows]

    async def count_active(self, tenant_id: uuid.UUID, user_ids: Sequence[str]) -> dict[str, int]:
        """How many active memories each of these users has (the scope B-tree answers it)."""
        if not user_ids:
            return {}
        rows = await self.session.execute(
            select(Memory.user_id, func.count())
            .where(
                Memory.tenant_id == tenant_id, Memory.user_id.in_(list(user_ids)), Memory.status == "active"
            )
            .group_by(Memory.user_id)
        )
        return {user_id: int(n) for user_id, n in rows}

    async def closest_active(
        self, items: Sequence[tuple[uuid.UUID, str, Sequence[float]]], k: int = 3
    ) -> list[list[tuple[uuid.UUID, float, str]]]:
        """For each (tenant, user, vector), that scope's `k` most similar active memories, nearest
        first: id, cosine similarity and content (one query; see `closest_active_statement`)."""
        found: list[list[tuple[uuid.UUID, float, str]]] = [[] for _ in items]
        if not items:
            return found
        by_tenant: dict[uuid.UUID, list[int]] = {}
        for i, (tenant_id, _, _) in enumerate(items):
            by_tenant.setdefault(tenant_id, []).append(i)
        params: dict[str, Any] = {"k": k}
        for n, (tenant_id, ords) in enumerate(by_tenant.items()):
            params |= {
                f"t{n}": tenant_id,
                f"u{n}": [items[i][1] for i in ords],
                f"v{n}": [vector_text(items[i][2]) for i in ords],
                f"o{n}": ords,
            }
        if len(by_tenant) > 1 and await session_is_distributed(self.session):
            # A cluster refuses the branches in one statement ("UNION/INTERSECT/EXCEPT could not convert
            # type text to integer", Citus 13.2): a statement a tenant, each routed to its shard.
            rows = []
            for n in range(len(by_tenant)):
                one = {"k": k, "t0": params[f"t{n}"], "u0": params[f"u{n}"], "v0": params[f"v{n}"]}
                one["o0"] = params[f"o{n}"]
                rows += list(await self.session.execute(closest_active_statement(1), one))
        else:
            rows = list(await self.session.execute(closest_active_statement(len(by_tenant)), params))
        for ord_, memory_id, distance, content in rows:
            found[ord_].append((memory_id, 1.0 - float(distance), content))
        return found

    async def lock_states(
        self, keys: Sequence[tuple[uuid.UUID, uuid.UUID]]
    ) -> dict[tuple[uuid.UUID, str, uuid.UUID], MemoryState]:
        """Row-lock memories given as (tenant, id), in id order so concurrent lockers cannot deadlock;
        their states keyed by (tenant, user, id). Ids of another tenant are not returned."""
        if not keys:
            return {}
        wanted = set(keys)
        params = {
            "p_ids": sorted({memory_id for _, memory_id in keys}),
            "p_tenant_ids": sorted({t for t, _ in keys}),
        }
        rows = await self.session.execute(_LOCK_STATES, params)
        return {
            (r.tenant_id, r.user_id, r.id): MemoryState(
                r.id,
                r.version,
                r.status,
                r.content,
                tuple(r.tags),
                r.owner,
                r.memory_at,
                r.expires_at,
                r.valid_from,
                r.valid_to,
            )
            for r in rows
            if (r.tenant_id, r.id) in wanted
        }


class VersionRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def history(self, tenant_id: uuid.UUID, memory_id: uuid.UUID) -> Sequence[MemoryVersion]:
        stmt = (
            select(MemoryVersion)
            .where(MemoryVersion.tenant_id == tenant_id, MemoryVersion.memory_id == memory_id)
            .order_by(MemoryVersion.version)
        )
        return (await self.session.scalars(stmt)).all()

    async def at_versions(
        self, tenant_id: uuid.UUID, pairs: Sequence[tuple[uuid.UUID, int]]
    ) -> dict[tuple[uuid.UUID, int], MemoryVersion]:
        """The version rows named by (memory id, version number), of this tenant only."""
        if not pairs:
            return {}
        stmt = select(MemoryVersion).where(
            MemoryVersion.tenant_id == tenant_id,
            tuple_(MemoryVersion.memory_id, MemoryVersion.version).in_(list(set(pairs))),
        )
        return {(v.memory_id, v.version): v for v in await self.session.scalars(stmt)}


class ChangesetRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def insert_many(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            await self.session.execute(insert(CHANGESETS), list(rows))

    async def insert_imported(self, rows: Sequence[dict[str, Any]]) -> int:
        """Changesets of another instance's export (`transfer`); those already here are left as they
        are. How many were new."""
        return await insert_new(self.session, CHANGESETS, rows)


async def insert_new(session: AsyncSession, table: Table, rows: Sequence[dict[str, Any]]) -> int:
    """INSERT ... ON CONFLICT DO NOTHING: how many of `rows` were new."""
    if not rows:
        return 0
    key = next(iter(table.primary_key.columns))
    stmt = pg_insert(table).on_conflict_do_nothing().returning(key)
    return len((await session.execute(stmt, list(rows))).all())
