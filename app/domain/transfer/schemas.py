"""Bodies of `POST /v1/admin/users/{user_id}/import` (api.md, "Import and export"): the records of a
`memstore export`, as exported, a batch at a time."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec

from app.db.models.changeset import CHANGESET_KINDS, CHANGESET_STATUSES
from app.db.models.chunk import CHUNK_STATUSES
from app.db.models.memory import MEMORY_OWNERS, MEMORY_STATUSES
from app.db.models.memory_version import VERSION_OPS
from app.domain.ingest.schemas import MessageIn
from app.lib.validation import Moment

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Short = Annotated[str, msgspec.Meta(max_length=200)]
Content = Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)]
Text = Annotated[str, msgspec.Meta(max_length=20_000)]
Tag = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
Tags = Annotated[list[Tag], msgspec.Meta(max_length=50)]
JsonList = Annotated[list[dict[str, Any]], msgspec.Meta(max_length=500)]
# A text's language as the source detected it (ISO 639-1, or a longer code a later detector may give).
Language = Annotated[str, msgspec.Meta(pattern=r"^[a-z]{2,3}$")]

ChunkStatus = Literal[CHUNK_STATUSES]  # type: ignore[valid-type]
MemoryStatus = Literal[MEMORY_STATUSES]  # type: ignore[valid-type]
Owner = Literal[MEMORY_OWNERS]  # type: ignore[valid-type]
Op = Literal[VERSION_OPS]  # type: ignore[valid-type]
Kind = Literal[CHANGESET_KINDS]  # type: ignore[valid-type]
ChangesetStatus = Literal[CHANGESET_STATUSES]  # type: ignore[valid-type]


class ChunkRecord(msgspec.Struct):
    chunk_id: uuid.UUID
    seq: Annotated[int, msgspec.Meta(ge=1)]
    messages: Annotated[list[MessageIn], msgspec.Meta(min_length=1, max_length=1000)]
    status: ChunkStatus
    received_at: Moment
    agent_id: Name | None = None
    run_id: Name | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    writer: Annotated[str, msgspec.Meta(max_length=100)] | None = None
    applied_at: Moment | None = None
    changeset_id: uuid.UUID | None = None
    attempts: Annotated[int, msgspec.Meta(ge=0)] = 0
    error: Text | None = None


class ChangesetRecord(msgspec.Struct):
    id: uuid.UUID
    kind: Kind
    status: ChangesetStatus
    actor: Short
    created_at: Moment
    chunk_id: uuid.UUID | None = None
    writer: Annotated[str, msgspec.Meta(max_length=100)] | None = None
    model: Short | None = None
    profile: Annotated[str, msgspec.Meta(max_length=50)] | None = None
    prompt_hash: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    ops: JsonList = msgspec.field(default_factory=list)
    guards: JsonList = msgspec.field(default_factory=list)
    usage: dict[str, Any] = msgspec.field(default_factory=dict)
    target: dict[str, Any] = msgspec.field(default_factory=dict)
    reason: Text | None = None


class VersionRecord(msgspec.Struct):
    version: Annotated[int, msgspec.Meta(ge=1)]
    op: Op
    content: Content
    status: MemoryStatus
    created_at: Moment
    changeset_id: uuid.UUID
    actor: Short
    chunk_id: uuid.UUID | None = None
    writer: Annotated[str, msgspec.Meta(max_length=100)] | None = None
    model: Short | None = None
    profile: Annotated[str, msgspec.Meta(max_length=50)] | None = None
    prompt_hash: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    reason: Text | None = None
    tags: Tags = msgspec.field(default_factory=list)
    owner: Owner | None = None  # the memory's, when the export did not say
    memory_at: Moment | None = None
    supersedes: Annotated[list[uuid.UUID], msgspec.Meta(max_length=100)] | None = None
    superseded_by: uuid.UUID | None = None
    expires_at: Moment | None = None
    valid_from: Moment | None = None
    valid_to: Moment | None = None
    language: Language | None = None  # None (an older export): detected here


class MemoryRecord(msgspec.Struct):
    id: uuid.UUID
    content: Content
    status: MemoryStatus
    version: Annotated[int, msgspec.Meta(ge=1)]
    created_at: Moment
    updated_at: Moment
    versions: Annotated[list[VersionRecord], msgspec.Meta(min_length=1, max_length=10_000)]
    agent_id: Name | None = None
    run_id: Name | None = None
    tags: Tags = msgspec.field(default_factory=list)
    owner: Owner = "user"
    memory_at: Moment | None = None
    expires_at: Moment | None = None
    valid_from: Moment | None = None
    valid_to: Moment | None = None
    language: Language | None = None  # None (an older export): detected here


class ImportIn(msgspec.Struct, forbid_unknown_fields=True):
    """A batch of an export's records; batches may come in any order and any number of times."""

    chunks: Annotated[list[ChunkRecord], msgspec.Meta(max_length=1000)] = msgspec.field(default_factory=list)
    changesets: Annotated[list[ChangesetRecord], msgspec.Meta(max_length=1000)] = msgspec.field(
        default_factory=list
    )
    memories: Annotated[list[MemoryRecord], msgspec.Meta(max_length=1000)] = msgspec.field(
        default_factory=list
    )


class ImportOut(msgspec.Struct):
    """Rows written by this batch, per kind (a batch loaded before writes none)."""

    user_id: str
    written: dict[str, int]
