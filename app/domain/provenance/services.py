"""Explaining a memory: each of its versions beside the chunk, context, candidates and changeset that
produced it, read in a handful of queries whatever the length of its history.

The context a writer was given is re-read from the scope's chunks (immutable, numbered by `seq`): the
writer view records how many earlier messages it was shown, so the same messages come back. Reading a
writer's raw output is audited, as `GET /v1/admin/changesets/{id}` is, one event per changeset shown.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.audit.repositories import AuditRepository
from app.domain.audit.services import event_row
from app.domain.history.repositories import HistoryRepository
from app.domain.history.schemas import ChangesetOut
from app.domain.ingest.repositories import ChunkRepository
from app.domain.memories.repositories import MemoryRepository, VersionRepository
from app.domain.memories.schemas import MemoryOut, VersionOut
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.provenance.repositories import WriterViewRepository
from app.domain.provenance.schemas import (
    CandidateOut,
    ExplainedVersion,
    ExplainOut,
    SourceChunkOut,
)
from app.lib.errors import NotFoundError


@dataclass(frozen=True)
class Reader:
    """Who asks, for the audit of raw-output reads."""

    actor: str
    request_id: str | None


async def explain_memory(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    memory_id: uuid.UUID,
    *,
    raw_output: bool,
    reader: Reader,
) -> ExplainOut:
    """Every version of the memory, oldest first, with its source chunk and the writer's view."""
    memory = await MemoryRepository(session).get(tenant_id, memory_id)
    if memory is None:
        raise NotFoundError("No such memory.")
    versions = await VersionRepository(session).history(tenant_id, memory_id)
    changesets = await HistoryRepository(session).changesets_by_ids(
        tenant_id, [v.changeset_id for v in versions]
    )
    chunks = await ChunkRepository(session).many(tenant_id, [v.chunk_id for v in versions if v.chunk_id])
    views = await WriterViewRepository(session).by_changesets(tenant_id, list(changesets))
    shown_pairs = [
        (uuid.UUID(c["memory_id"]), int(c["version"])) for view in views.values() for c in view.candidates
    ]
    shown = await VersionRepository(session).at_versions(tenant_id, shown_pairs)
    pipeline = PipelineRepository(session)

    explained: list[ExplainedVersion] = []
    contexts: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for version in versions:
        changeset = changesets.get(version.changeset_id)
        view = views.get(version.changeset_id)
        source = None
        chunk = chunks.get(version.chunk_id) if version.chunk_id else None
        if chunk is not None:
            if view is not None and chunk.id not in contexts:
                contexts[chunk.id] = await pipeline.earlier_messages(
                    tenant_id, chunk.user_id, chunk.seq, view.context_messages
                )
            source = SourceChunkOut(
                chunk_id=chunk.id,
                seq=chunk.seq,
                agent_id=chunk.agent_id,
                run_id=chunk.run_id,
                writer=chunk.writer,
                messages=chunk.messages,
                metadata=chunk.metadata_,
                received_at=chunk.received_at,
                applied_at=chunk.applied_at,
                context=contexts.get(chunk.id),
            )
        candidates = None
        if view is not None:
            candidates = []
            for c in view.candidates:
                seen = shown.get((uuid.UUID(c["memory_id"]), int(c["version"])))
                candidates.append(
                    CandidateOut(
                        local_id=int(c["local_id"]),
                        memory_id=uuid.UUID(c["memory_id"]),
                        version=int(c["version"]),
                        content=seen.content if seen else None,
                        status=seen.status if seen else None,
                        valid_from=seen.valid_from if seen else None,
                        valid_to=seen.valid_to if seen else None,
                    )
                )
        written_by = None if changeset is None else ChangesetOut.of(changeset, raw=raw_output)
        explained.append(ExplainedVersion(VersionOut.of(version), written_by, source, candidates))

    if raw_output:
        read = [c for c in changesets.values() if c.raw_output is not None]
        await AuditRepository(session).insert_many(
            [
                event_row(
                    tenant_id=tenant_id,
                    actor=reader.actor,
                    action="changeset.raw_read",
                    target_type="changeset",
                    target_id=str(c.id),
                    request_id=reader.request_id,
                    summary={"via": "explain", "memory_id": str(memory_id)},
                )
                for c in sorted(read, key=lambda c: c.created_at)
            ]
        )
    return ExplainOut(memory=MemoryOut.of(memory), versions=explained)
