"""Rules of ingestion: what a valid chunk is, how bodies are compared, which scopes to wake.

The writing itself is done in bulk by `IngestBatcher` (group commit); these are the pieces it and
the controllers share.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Chunk
from app.domain.ingest.repositories import ChunkRepository
from app.domain.ingest.schemas import ChunkIn
from app.domain.pipeline.finished import FinishedChunks
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.pipeline.services.budgets import day_start
from app.domain.pipeline.wakeups import ScopeWake, WakeReason, scope_wake
from app.domain.search.tenant_embedder import read_choice
from app.lib.errors import InvalidField, NotFoundError
from app.lib.validation import encode_moment
from app.writers.registry import WriterRegistry


@dataclass(frozen=True)
class Accepted:
    chunk_id: uuid.UUID
    seq: int
    status: str
    user_id: str
    replayed: bool  # True when an Idempotency-Key matched an earlier identical request


def body_hash(chunk: ChunkIn) -> str:
    """A hash of the chunk as parsed (key order and whitespace of the raw JSON do not matter)."""
    body = msgspec.to_builtins(chunk, enc_hook=encode_moment)
    body.pop("idempotency_key", None)  # a batch item carries its key in the body; it is not content
    encoded = msgspec.json.encode(body, order="sorted")
    return hashlib.sha256(encoded).hexdigest()


def validate_chunks(chunks: Sequence[ChunkIn], settings: Settings, registry: WriterRegistry) -> None:
    """The configurable limits and known writer names; raises a 422 naming the offending field."""
    batch = len(chunks) > 1
    for index, chunk in enumerate(chunks):
        where = f"chunks[{index}]." if batch else ""
        if len(chunk.messages) > settings.max_messages_per_chunk:
            raise InvalidField(
                f"A chunk may hold at most {settings.max_messages_per_chunk} messages.",
                details={"field": f"{where}messages", "max": settings.max_messages_per_chunk},
            )
        for i, message in enumerate(chunk.messages):
            if len(message.content) > settings.max_message_chars:
                raise InvalidField(
                    f"A message may hold at most {settings.max_message_chars} characters.",
                    details={"field": f"{where}messages[{i}].content", "max": settings.max_message_chars},
                )
        if chunk.writer is not None and not registry.knows(chunk.writer):
            raise InvalidField(
                f"Unknown writer {chunk.writer!r}.",
                details={"field": f"{where}writer", "allowed": registry.names()},
            )


def wake_ups(
    tenant_id: uuid.UUID, accepted: Sequence[Accepted], *, backfill: bool = False
) -> list[ScopeWake]:
    """One wake-up per scope touched (`pipeline.wakeups`); a backfill's wait behind live scopes."""
    return [
        scope_wake(tenant_id, user_id, WakeReason.ACCEPTED, backfill=backfill)
        for user_id in dict.fromkeys(result.user_id for result in accepted)
    ]


# How long a status read may wait for chunks to finish, and for how many chunks at once.
MAX_WAIT_S = 30.0
MAX_STATUS_IDS = 100
FINISHED = ("applied", "failed")


async def finished_or_after(
    sessionmaker: async_sessionmaker[AsyncSession],
    finished: FinishedChunks,
    tenant_id: uuid.UUID,
    chunk_ids: list[uuid.UUID],
    wait_s: float,
) -> list[Chunk]:
    """The chunks, once all are applied or failed, or after `wait_s` as they are then (404 if one is
    not the tenant's). No database connection is held while waiting: each read is a session of its
    own, and the wait is for the workers' announcement (`pipeline.finished`), registered before the
    first read so that a finish in between is not missed."""
    if wait_s <= 0:
        return await _read(sessionmaker, tenant_id, chunk_ids)
    with finished.watching(chunk_ids) as done:
        chunks = await _read(sessionmaker, tenant_id, chunk_ids)
        if all(chunk.status in FINISHED for chunk in chunks):
            return chunks
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await asyncio.shield(done)
    return await _read(sessionmaker, tenant_id, chunk_ids)


async def _read(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, chunk_ids: list[uuid.UUID]
) -> list[Chunk]:
    async with sessionmaker() as session:
        found = await ChunkRepository(session).many(tenant_id, chunk_ids)
    if len(found) < len(chunk_ids):  # one is not the tenant's (or does not exist): which, it need not know
        raise NotFoundError("No such chunk.")
    return [found[chunk_id] for chunk_id in chunk_ids]


@dataclass(frozen=True)
class Progress:
    """What a chunk's status says beyond its row: who wrote it and what all its writer calls cost (an
    applied chunk's changeset, with its failed attempts'), and why a queued chunk waits, if not for its
    turn: `daily_token_budget` (its tenant's budget for the UTC day is spent), `embedder_move` (its tenant
    is being re-embedded with another embedder: `search.tenant_embedder`)."""

    writer: str | None
    usage: dict[str, Any]
    waiting_for: str | None = None


async def progress(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, chunks: Sequence[Chunk]
) -> list[Progress]:
    """Each chunk's `Progress`, in a session of its own (`progress_in`)."""
    async with sessionmaker() as session:
        return await progress_in(session, tenant_id, chunks)


async def progress_in(session: AsyncSession, tenant_id: uuid.UUID, chunks: Sequence[Chunk]) -> list[Progress]:
    """Each chunk's `Progress`: one read of the applied ones' changesets, and of the tenant's budget (and,
    within it, of a move to another embedder) if one waits queued."""
    written = await ChunkRepository(session).written(chunks)
    waiting = None
    if any(c.status == "queued" for c in chunks):
        budget, spent = await PipelineRepository(session).tokens_today(
            tenant_id, day_start(datetime.now(UTC))
        )
        if budget is not None and spent >= budget:
            waiting = "daily_token_budget"
        elif (await read_choice(session, tenant_id)).switching_to is not None:
            waiting = "embedder_move"
    out = []
    for chunk in chunks:
        writer, usage = written.get(chunk.id, (chunk.writer, {}))
        total = dict(usage)
        for key, value in (chunk.usage or {}).items():  # its failed attempts' calls
            if isinstance(value, int | float) and isinstance(total.get(key, 0), int | float):
                total[key] = total.get(key, 0) + value
        out.append(Progress(writer, total, waiting if chunk.status == "queued" else None))
    return out


async def get_chunk(session: AsyncSession, tenant_id: uuid.UUID, chunk_id: uuid.UUID) -> Chunk:
    chunk = await ChunkRepository(session).get(tenant_id, chunk_id)
    if chunk is None:
        raise NotFoundError("No such chunk.")
    return chunk
