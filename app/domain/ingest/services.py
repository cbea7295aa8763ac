"""Accepting chunks. Services never commit: the request boundary does, then enqueues wake-ups."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db.models import Chunk
from app.domain.accounts.services import Principal
from app.domain.audit.services import record_event
from app.domain.ingest.repositories import ChunkRepository, ScopeRepository
from app.domain.ingest.schemas import ChunkIn
from app.lib.errors import ApiError, ConflictError, NotFoundError
from app.writers.registry import WriterRegistry

PROCESS_SCOPE_JOB = "process_scope"


@dataclass(frozen=True)
class Accepted:
    chunk_id: uuid.UUID
    seq: int
    status: str
    user_id: str
    replayed: bool  # True when an Idempotency-Key matched an earlier identical request


def body_hash(chunk: ChunkIn) -> str:
    """A hash of the chunk as parsed (key order and whitespace of the raw JSON do not matter)."""
    encoded = msgspec.json.encode(msgspec.to_builtins(chunk), order="sorted")
    return hashlib.sha256(encoded).hexdigest()


def _validate_limits(chunk: ChunkIn, settings: Settings, registry: WriterRegistry, where: str) -> None:
    if len(chunk.messages) > settings.max_messages_per_chunk:
        raise ApiError(
            f"A chunk may hold at most {settings.max_messages_per_chunk} messages.",
            code="validation_error",
            status_code=422,
            details={"field": f"{where}messages", "max": settings.max_messages_per_chunk},
        )
    for i, message in enumerate(chunk.messages):
        if len(message.content) > settings.max_message_chars:
            raise ApiError(
                f"A message may hold at most {settings.max_message_chars} characters.",
                code="validation_error",
                status_code=422,
                details={"field": f"{where}messages[{i}].content", "max": settings.max_message_chars},
            )
    if chunk.writer is not None and not registry.knows(chunk.writer):
        raise ApiError(
            f"Unknown writer {chunk.writer!r}.",
            code="validation_error",
            status_code=422,
            details={"field": f"{where}writer", "allowed": registry.names()},
        )


async def accept_chunks(
    session: AsyncSession,
    *,
    principal: Principal,
    chunks: Sequence[tuple[ChunkIn, str | None]],
    settings: Settings,
    registry: WriterRegistry,
    request_id: str | None,
) -> list[Accepted]:
    """Store chunks (with their idempotency keys) in order; validate all before writing any."""
    batch = len(chunks) > 1
    for i, (chunk, _) in enumerate(chunks):
        _validate_limits(chunk, settings, registry, f"chunks[{i}]." if batch else "")
    scopes, repo = ScopeRepository(session), ChunkRepository(session)
    results: list[Accepted] = []
    for chunk, key in chunks:
        digest = body_hash(chunk)
        if key is not None and (earlier := await repo.get_by_idempotency_key(principal.tenant_id, key)):
            results.append(_replay(earlier, digest))
            continue
        seq = await scopes.next_seq(principal.tenant_id, chunk.user_id)
        chunk_id = uuid.uuid4()
        inserted = await repo.insert(
            {
                "id": chunk_id,
                "tenant_id": principal.tenant_id,
                "user_id": chunk.user_id,
                "agent_id": chunk.agent_id,
                "run_id": chunk.run_id,
                "seq": seq,
                "messages": msgspec.to_builtins(chunk.messages),
                "metadata": chunk.metadata,
                "idempotency_key": key,
                "body_hash": digest,
                "writer": chunk.writer,
            }
        )
        if inserted is None:
            # A concurrent request with the same key committed first; answer as a replay of it.
            assert key is not None
            earlier = await repo.get_by_idempotency_key(principal.tenant_id, key)
            assert earlier is not None
            results.append(_replay(earlier, digest))
            continue
        results.append(Accepted(chunk_id, seq, "queued", chunk.user_id, replayed=False))
    fresh = [r for r in results if not r.replayed]
    if fresh:
        await record_event(
            session,
            tenant_id=principal.tenant_id,
            actor=principal.actor,
            action="chunk.accepted",
            target_type="chunk",
            target_id=str(fresh[0].chunk_id) if len(fresh) == 1 else None,
            request_id=request_id,
            summary={"chunks": [{"id": str(r.chunk_id), "user_id": r.user_id, "seq": r.seq} for r in fresh]},
        )
    return results


def _replay(earlier: Chunk, digest: str) -> Accepted:
    if earlier.body_hash != digest:
        raise ConflictError(
            "This Idempotency-Key was used with a different body.",
            code="idempotency_conflict",
            details={"chunk_id": str(earlier.id)},
        )
    return Accepted(earlier.id, earlier.seq, earlier.status, earlier.user_id, replayed=True)


def wake_up_jobs(tenant_id: uuid.UUID, accepted: Sequence[Accepted]) -> list[tuple[str, dict[str, object]]]:
    """One wake-up per scope touched, named after its newest chunk so a replayed enqueue is a no-op."""
    newest: dict[str, Accepted] = {}
    for result in accepted:
        if result.status == "queued":
            newest[result.user_id] = result
    return [
        (
            PROCESS_SCOPE_JOB,
            {"tenant_id": str(tenant_id), "user_id": user_id, "_job_id": f"chunk:{r.chunk_id}"},
        )
        for user_id, r in newest.items()
    ]


async def get_chunk(session: AsyncSession, tenant_id: uuid.UUID, chunk_id: uuid.UUID) -> Chunk:
    chunk = await ChunkRepository(session).get(tenant_id, chunk_id)
    if chunk is None:
        raise NotFoundError("No such chunk.")
    return chunk
