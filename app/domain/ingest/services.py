"""Rules of ingestion: what a valid chunk is, how bodies are compared, which scopes to wake.

The writing itself is done in bulk by `IngestBatcher` (group commit); these are the pieces it and
the controllers share.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db.models import Chunk
from app.domain.ingest.repositories import ChunkRepository
from app.domain.ingest.schemas import ChunkIn
from app.domain.pipeline.wakeups import ScopeWake, WakeReason, scope_wake
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


def wake_ups(tenant_id: uuid.UUID, accepted: Sequence[Accepted]) -> list[ScopeWake]:
    """One wake-up per scope touched (one job per drain: `pipeline.wakeups`)."""
    return [
        scope_wake(tenant_id, user_id, WakeReason.ACCEPTED)
        for user_id in dict.fromkeys(result.user_id for result in accepted)
    ]


async def get_chunk(session: AsyncSession, tenant_id: uuid.UUID, chunk_id: uuid.UUID) -> Chunk:
    chunk = await ChunkRepository(session).get(tenant_id, chunk_id)
    if chunk is None:
        raise NotFoundError("No such chunk.")
    return chunk
