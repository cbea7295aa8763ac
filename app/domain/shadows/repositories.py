"""SQL of shadow banks: the banks of a tenant and what comparison reads (feeding a bank chunks is the
chunk queue's: `pipeline/repositories.py`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

_BANKS = text(
    "SELECT id, name, settings -> 'shadow' AS shadow FROM tenants WHERE shadow_of = :p_parent ORDER BY name"
)

# A bank has its tenant's embedder, and moves with it (`search.tenant_embedder`): their memories are
# compared.
_ENSURE = text(
    """
    INSERT INTO tenants (id, name, settings, shadow_of)
    SELECT :p_id, :p_name,
           jsonb_build_object('shadow', CAST(:p_shadow AS jsonb))
           || jsonb_strip_nulls(jsonb_build_object('embedder', p.settings -> 'embedder',
                                                   'embedder_switch', p.settings -> 'embedder_switch')),
           :p_parent
    FROM tenants p WHERE p.id = :p_parent
    ON CONFLICT (name) DO NOTHING
    """
)

_OLDEST_UNFINISHED = text(
    "SELECT min(received_at) FROM chunks WHERE tenant_id = :p_tenant AND user_id = :p_user"
    " AND status IN ('queued', 'processing')"
)

# How far a bank has got: its chunks by status, and the age of the oldest unfinished one.
_PROGRESS = text(
    """
    SELECT count(*) AS total,
           count(*) FILTER (WHERE status = 'applied') AS applied,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status IN ('queued', 'processing')) AS pending
    FROM chunks WHERE tenant_id = :p_bank AND (CAST(:p_user AS text) IS NULL OR user_id = :p_user)
    """
)

# Unfinished chunks of every bank (served by the partial index on unfinished chunks), read across
# tenants through a function of the tables' owner (migration 0008).
_SHADOW_BACKLOG = text("SELECT bank, writer, pending, oldest_age_s FROM memstore_shadow_backlog()")

# One side of a comparison: each chunk by its source chunk's id, with its outcome and changeset.
_OUTCOMES = text(
    """
    SELECT CASE WHEN c.idempotency_key LIKE 'src:%'
                THEN substr(c.idempotency_key, 5) ELSE c.id::text END AS source_id,
           c.user_id, c.seq, c.status, c.last_error, cs.ops, cs.guards, cs.usage AS usage,
           c.usage AS failed_usage
    FROM chunks c LEFT JOIN changesets cs ON cs.tenant_id = c.tenant_id AND cs.id = c.changeset_id
    WHERE c.tenant_id = :p_tenant AND (CAST(:p_user AS text) IS NULL OR c.user_id = :p_user)
    ORDER BY c.user_id, c.seq
    """
)

_ACTIVE = text(
    """
    SELECT id, user_id, content FROM memories
    WHERE tenant_id = :p_tenant AND status = 'active' AND (CAST(:p_user AS text) IS NULL OR user_id = :p_user)
    ORDER BY user_id, created_at, id
    """
)

# Pairs of one user's active memories in two banks at least `p_threshold` similar (cosine).
_SIMILAR = text(
    """
    SELECT a.id AS a_id, b.id AS b_id, 1 - (a.embedding <=> b.embedding) AS similarity
    FROM memories a
    JOIN memories b ON b.tenant_id = :p_b AND b.user_id = a.user_id AND b.status = 'active'
    WHERE a.tenant_id = :p_a AND a.status = 'active'
      AND (CAST(:p_user AS text) IS NULL OR a.user_id = :p_user)
      AND (a.embedding <=> b.embedding) <= 1 - CAST(:p_threshold AS double precision)
    """
)


@dataclass(frozen=True)
class BankRow:
    id: uuid.UUID
    tenant_name: str
    shadow: dict[str, Any]


@dataclass(frozen=True)
class Progress:
    total: int
    applied: int
    failed: int
    pending: int


@dataclass(frozen=True)
class ShadowBacklog:
    bank: str
    writer: str
    pending: int
    oldest_age_s: float


@dataclass(frozen=True)
class Outcome:
    """A chunk's fate in one bank."""

    source_id: str
    user_id: str
    seq: int
    status: str
    error: str | None
    ops: list[dict[str, Any]]
    guards: list[dict[str, Any]]
    usage: dict[str, Any]


@dataclass(frozen=True)
class ActiveMemory:
    id: uuid.UUID
    user_id: str
    content: str


class ShadowRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def banks(self, parent_id: uuid.UUID) -> list[BankRow]:
        rows = await self.session.execute(_BANKS, {"p_parent": parent_id})
        return [BankRow(r.id, r.name, dict(r.shadow or {})) for r in rows]

    async def ensure(self, parent_id: uuid.UUID, tenant_name: str, shadow: dict[str, Any]) -> None:
        """Create the bank's tenant row unless it exists (then it is left as it is)."""
        await self.session.execute(
            _ENSURE,
            {
                "p_id": uuid.uuid4(),
                "p_name": tenant_name,
                "p_shadow": json.dumps(shadow),
                "p_parent": parent_id,
            },
        )

    async def oldest_unfinished(self, tenant_id: uuid.UUID, user_id: str) -> datetime | None:
        found: datetime | None = await self.session.scalar(
            _OLDEST_UNFINISHED, {"p_tenant": tenant_id, "p_user": user_id}
        )
        return found

    async def progress(self, bank_id: uuid.UUID, user_id: str | None = None) -> Progress:
        row = (await self.session.execute(_PROGRESS, {"p_bank": bank_id, "p_user": user_id})).one()
        return Progress(int(row.total), int(row.applied), int(row.failed), int(row.pending))

    async def backlog(self) -> list[ShadowBacklog]:
        rows = await self.session.execute(_SHADOW_BACKLOG)
        return [
            ShadowBacklog(r.bank or "", r.writer or "", int(r.pending), float(r.oldest_age_s)) for r in rows
        ]

    async def outcomes(self, tenant_id: uuid.UUID, user_id: str | None) -> list[Outcome]:
        rows = await self.session.execute(_OUTCOMES, {"p_tenant": tenant_id, "p_user": user_id})
        return [
            Outcome(
                source_id=r.source_id,
                user_id=r.user_id,
                seq=int(r.seq),
                status=r.status,
                error=r.last_error,
                ops=list(r.ops or []),
                guards=list(r.guards or []),
                usage=dict(r.usage or r.failed_usage or {}),
            )
            for r in rows
        ]

    async def active_memories(self, tenant_id: uuid.UUID, user_id: str | None) -> Sequence[ActiveMemory]:
        rows = await self.session.execute(_ACTIVE, {"p_tenant": tenant_id, "p_user": user_id})
        return [ActiveMemory(r.id, r.user_id, r.content) for r in rows]

    async def similar_pairs(
        self, a: uuid.UUID, b: uuid.UUID, user_id: str | None, threshold: float
    ) -> list[tuple[uuid.UUID, uuid.UUID, float]]:
        """(memory of a, memory of b, cosine similarity) for each pair of a user's active memories at
        least `threshold` similar; the distances are computed in Postgres."""
        params = {"p_a": a, "p_b": b, "p_user": user_id, "p_threshold": threshold}
        return [(r.a_id, r.b_id, float(r.similarity)) for r in await self.session.execute(_SIMILAR, params)]
