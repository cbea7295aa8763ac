"""Loading another instance's export of a user: chunks, changesets, memories and every version, as
they were written there — contents, times, provenance — so the bank, its history and `as_of` reads
are the same here, and each version still explains itself by its chunk.

Ids are carried over through a name-based UUID of (this tenant, the exported id): the same export
always lands on the same rows, so loading a batch twice writes nothing the second time, and an export
can never collide with, or reveal, another tenant's rows. References between the records (a version's
changeset and chunk, a SUPERSEDE's links, the ids inside a changeset's ops and target) are mapped the
same way. Vectors are not exported: each text is embedded here, with this instance's embedder, before
any row is written; its language is the source's (what a detector makes of a short text can differ
between versions), detected here only where an older export does not say it. Nothing of it goes
through a writer: it is history, not new input.

Refused with nothing written: a record that is not what an export holds (422), and chunks whose
numbers the user's own chunks already hold here (409 `import_conflict`).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.audit.services import record_event
from app.domain.ingest.repositories import ChunkRepository, ScopeRepository
from app.domain.memories.repositories import ChangesetRepository
from app.domain.memories.version_writer import VersionWriter
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.transfer.schemas import ChangesetRecord, ChunkRecord, ImportIn, MemoryRecord
from app.embeddings import Embedder
from app.lib.errors import ImportConflict, InvalidField
from app.lib.validation import encode_moment

# The namespace of imported ids (any fixed UUID; changing it would break re-imports).
IMPORT_NAMESPACE = uuid.UUID("5d6f2a8e-4c1b-4f53-9a77-2b0e6c3d9e41")


def imported_id(tenant_id: uuid.UUID, exported: uuid.UUID) -> uuid.UUID:
    """The id here of an object exported elsewhere with id `exported`."""
    return uuid.uuid5(IMPORT_NAMESPACE, f"{tenant_id}:{exported}")


@dataclass(frozen=True)
class Importer:
    tenant_id: uuid.UUID
    user_id: str

    def id(self, exported: uuid.UUID | None) -> uuid.UUID | None:
        return None if exported is None else imported_id(self.tenant_id, exported)

    def json(self, value: Any) -> Any:
        """`value` with every string that is a UUID mapped as ids are (ops and targets name memories,
        changesets and chunks of the same user)."""
        if isinstance(value, dict):
            return {k: self.json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.json(v) for v in value]
        if isinstance(value, str) and len(value) == 36:
            try:
                return str(imported_id(self.tenant_id, uuid.UUID(value)))
            except ValueError:
                return value
        return value


def _invalid(message: str, field: str) -> InvalidField:
    return InvalidField(message, details={"field": field})


def check_memories(memories: list[MemoryRecord]) -> None:
    """Each memory's versions are 1 … n in order, and n is its version."""
    for i, memory in enumerate(memories):
        numbers = [v.version for v in memory.versions]
        if numbers != list(range(1, len(numbers) + 1)) or numbers[-1] != memory.version:
            raise _invalid(
                f"memory {memory.id}: versions must run 1 … {memory.version} in order",
                f"memories[{i}].versions",
            )


def texts_to_embed(memories: list[MemoryRecord]) -> list[str]:
    """Every text a head or a version brings (a version keeps a vector where its text changes)."""
    texts: dict[str, None] = {}
    for memory in memories:
        texts[memory.content] = None
        for version in memory.versions:
            texts[version.content] = None
    return list(texts)


async def import_batch(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    user_id: str,
    batch: ImportIn,
    *,
    embedder: Embedder,
    actor: str,
    request_id: str | None,
) -> dict[str, int]:
    """Write the batch's records that are not here yet; rows written per kind."""
    check_memories(batch.memories)
    texts = texts_to_embed(batch.memories)
    # Embedded before the first statement: no transaction waits on the embedder.
    vectors = dict(zip(texts, await embedder.embed(texts), strict=True)) if texts else {}
    importer = Importer(tenant_id, user_id)
    chunks = ChunkRepository(session)
    if batch.chunks:
        # Numbering goes on after the imported chunks; the scope row stays locked until the commit, so
        # an ingestion of the user cannot take one of their numbers between the check and the insert.
        await ScopeRepository(session).raise_last_seq(tenant_id, user_id, max(c.seq for c in batch.chunks))
    held = await chunks.ids_at_seqs(tenant_id, user_id, [c.seq for c in batch.chunks])
    taken = sorted(
        c.seq for c in batch.chunks if held.get(c.seq, importer.id(c.chunk_id)) != importer.id(c.chunk_id)
    )
    if taken:
        raise ImportConflict(
            f"User {user_id} already has other chunks numbered {taken[:10]}: import into a new user.",
            details={"seqs": taken[:100]},
        )
    heads, versions = _memory_rows(importer, batch.memories, vectors)
    written = {
        "changesets": await ChangesetRepository(session).insert_imported(
            [_changeset_row(importer, c) for c in batch.changesets]
        ),
        "chunks": await PipelineRepository(session).insert_imported(
            [_chunk_row(importer, c) for c in batch.chunks]
        ),
    }
    written["memories"], written["versions"] = await VersionWriter(session).write_imported(heads, versions)
    if any(written.values()):
        await record_event(
            session,
            tenant_id=tenant_id,
            actor=actor,
            action="user.imported",
            target_type="user",
            target_id=user_id,
            request_id=request_id,
            summary={"written": written},
        )
    return written


def _changeset_row(importer: Importer, c: ChangesetRecord) -> dict[str, Any]:
    return {
        "id": importer.id(c.id),
        "tenant_id": importer.tenant_id,
        "user_id": importer.user_id,
        "kind": c.kind,
        "chunk_id": importer.id(c.chunk_id),
        "writer": c.writer,
        "model": c.model,
        "profile": c.profile,
        "prompt_hash": c.prompt_hash,
        "raw_output": None,  # never exported: reading it is an audited act of the source's admins
        "ops": importer.json(c.ops),
        "guards": c.guards,
        "usage": c.usage,
        "target": importer.json(c.target),
        "status": c.status,
        "actor": c.actor,
        "reason": c.reason,
        "created_at": c.created_at,
    }


def _chunk_row(importer: Importer, c: ChunkRecord) -> dict[str, Any]:
    messages = msgspec.to_builtins(c.messages, enc_hook=encode_moment)
    body = msgspec.json.encode({"messages": messages, "metadata": c.metadata}, order="sorted")
    return {
        "id": importer.id(c.chunk_id),
        "tenant_id": importer.tenant_id,
        "user_id": importer.user_id,
        "agent_id": c.agent_id,
        "run_id": c.run_id,
        "seq": c.seq,
        "messages": messages,
        "metadata": c.metadata,
        "idempotency_key": None,
        "body_hash": hashlib.sha256(body).hexdigest(),
        "writer": c.writer,
        # A chunk the source had not finished is this instance's to write, as a backfill: behind the
        # tenant's live chunks (`pipeline.scheduler`), also when the sweeper wakes it.
        "status": "queued" if c.status == "processing" else c.status,
        "backfill": True,
        "attempts": c.attempts,
        "last_error": c.error,
        "changeset_id": importer.id(c.changeset_id),
        "received_at": c.received_at,
        "applied_at": c.applied_at,
    }


def _memory_rows(
    importer: Importer, memories: list[MemoryRecord], vectors: dict[str, list[float]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    heads: list[dict[str, Any]] = []
    versions: list[dict[str, Any]] = []
    for memory in memories:
        memory_id = importer.id(memory.id)
        heads.append(
            {
                "id": memory_id,
                "tenant_id": importer.tenant_id,
                "user_id": importer.user_id,
                "agent_id": memory.agent_id,
                "run_id": memory.run_id,
                "content": memory.content,
                "tags": memory.tags,
                "owner": memory.owner,
                "memory_at": memory.memory_at,
                "expires_at": memory.expires_at,
                "valid_from": memory.valid_from,
                "valid_to": memory.valid_to,
                "language": memory.language,
                "status": memory.status,
                "version": memory.version,
                "embedding": vectors[memory.content],
                "changeset_id": importer.id(memory.versions[-1].changeset_id),
                "created_at": memory.created_at,
                "updated_at": memory.updated_at,
            }
        )
        previous: str | None = None
        for v in memory.versions:
            versions.append(
                {
                    "tenant_id": importer.tenant_id,
                    "user_id": importer.user_id,
                    "memory_id": memory_id,
                    "version": v.version,
                    "op": v.op,
                    "content": v.content,
                    "tags": v.tags,
                    "owner": v.owner or memory.owner,
                    "status": v.status,
                    "memory_at": v.memory_at or memory.memory_at,
                    "expires_at": v.expires_at,
                    "valid_from": v.valid_from,
                    "valid_to": v.valid_to,
                    "language": v.language,
                    "embedding": vectors[v.content] if v.content != previous else None,
                    "supersedes": [importer.id(m) for m in v.supersedes] if v.supersedes else None,
                    "superseded_by": importer.id(v.superseded_by),
                    "changeset_id": importer.id(v.changeset_id),
                    "chunk_id": importer.id(v.chunk_id),
                    "writer": v.writer,
                    "model": v.model,
                    "profile": v.profile,
                    "prompt_hash": v.prompt_hash,
                    "actor": v.actor,
                    "reason": v.reason,
                    "created_at": v.created_at,
                }
            )
            previous = v.content
    return heads, versions
