"""A reproducible ingestion scenario and a canonical view of the bank it produces, so a run under a
fault can be compared with a fault-free run of the same input."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Changeset, Chunk, Memory, MemoryVersion

# Per user, in order: facts that add, supersede, repeat and retract, so order matters.
FACTS = [
    "I live in Lyon.",
    "I'm vegetarian.",
    "I mainly use Python.",
    "My daughter's name is Mia.",
    "I like jazz.",
    "I moved to Seattle last month.",
    "I like jazz.",
    "I don't like jazz anymore.",
]


def user_chunks(user: str, writer: str | None = None, facts: list[str] | None = None) -> list[dict[str, Any]]:
    body: list[dict[str, Any]] = []
    for i, fact in enumerate(facts or FACTS):
        chunk: dict[str, Any] = {
            "user_id": user,
            "messages": [
                {"role": "user", "content": fact, "created_at": f"2026-11-{10 + i:02d}T10:00:00Z"},
                {"role": "assistant", "content": "Got it."},
            ],
        }
        if writer:
            chunk["writer"] = writer
        body.append(chunk)
    return body


async def post_users(
    client: AsyncTestClient[Litestar],
    headers: dict[str, str],
    users: list[str],
    writer: str | None = None,
    facts: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Each user's chunks in order; users concurrently. Returns every 202 body."""

    async def one_user(user: str) -> list[dict[str, Any]]:
        accepted = []
        for chunk in user_chunks(user, writer, facts):
            response = await client.post("/v1/chunks", json=chunk, headers=headers)
            assert response.status_code == 202, response.text
            accepted.append(response.json())
        return accepted

    per_user = await asyncio.gather(*(one_user(u) for u in users))
    return [a for accepted in per_user for a in accepted]


async def bank(sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID) -> dict[str, Any]:
    """Per user: memories (content, status, version) and version ops — ids and times left out."""
    async with sessionmaker() as session:
        memories = (
            await session.execute(
                select(Memory.user_id, Memory.content, Memory.status, Memory.version).where(
                    Memory.tenant_id == tenant_id
                )
            )
        ).all()
        versions = (
            await session.execute(
                select(MemoryVersion.user_id, MemoryVersion.op, MemoryVersion.content).where(
                    MemoryVersion.tenant_id == tenant_id
                )
            )
        ).all()
    result: dict[str, Any] = {}
    for user, content, status, version in memories:
        result.setdefault(user, {"memories": [], "versions": Counter()})["memories"].append(
            (content, status, version)
        )
    for user, op, content in versions:
        result[user]["versions"][(op, content)] += 1
    for entry in result.values():
        entry["memories"].sort()
    return result


async def changesets_per_chunk(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID
) -> Counter[int]:
    """How many writer changesets each chunk got (exactly-once means every value is 1)."""
    async with sessionmaker() as session:
        rows = (
            await session.execute(
                select(Chunk.id, func.count(Changeset.id))
                .join(Changeset, Changeset.chunk_id == Chunk.id, isouter=True)
                .where(Chunk.tenant_id == tenant_id, Chunk.status == "applied")
                .group_by(Chunk.id)
            )
        ).all()
    return Counter(n for _, n in rows)


async def order_violations(sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID) -> list[str]:
    """Users whose writer changesets were not created in chunk `seq` order."""
    async with sessionmaker() as session:
        rows = (
            await session.execute(
                select(Changeset.user_id, Chunk.seq)
                .join(Chunk, Chunk.id == Changeset.chunk_id)
                .where(Changeset.tenant_id == tenant_id, Changeset.kind == "writer")
                .order_by(Changeset.created_at, Changeset.id)
            )
        ).all()
    seqs: dict[str, list[int]] = {}
    for user, seq in rows:
        seqs.setdefault(user, []).append(seq)
    return [user for user, s in seqs.items() if s != sorted(s)]
