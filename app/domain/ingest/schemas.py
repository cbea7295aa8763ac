"""Bodies of the ingestion endpoints (api.md, "Ingestion")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from app.lib.validation import Moment, json_depth_exceeds

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]

# Chunk metadata is stored as jsonb and returned as it came; deeper nesting is refused (422).
MAX_METADATA_DEPTH = 16


class MessageIn(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant", "system", "tool"]
    content: Annotated[str, msgspec.Meta(min_length=1)]
    name: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    created_at: Moment | None = None


WriterName = Annotated[str, msgspec.Meta(min_length=1, max_length=100, extra={"deployment": "writers"})]


class ChunkIn(msgspec.Struct, forbid_unknown_fields=True):
    user_id: Id
    messages: Annotated[list[MessageIn], msgspec.Meta(min_length=1)]
    agent_id: Id | None = None
    run_id: Id | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    # A writer this deployment has (the OpenAPI document lists them); none: the tenant's default.
    writer: WriterName | None = None

    def __post_init__(self) -> None:
        if json_depth_exceeds(self.metadata, MAX_METADATA_DEPTH):
            msg = f"metadata may nest at most {MAX_METADATA_DEPTH} levels deep"
            raise ValueError(msg)


class BatchChunkIn(ChunkIn, forbid_unknown_fields=True):
    """A chunk inside a batch; it may carry its own idempotency key."""

    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None


class BatchIn(msgspec.Struct, forbid_unknown_fields=True):
    chunks: Annotated[list[BatchChunkIn], msgspec.Meta(min_length=1)]
    # `backfill`: history being loaded; its users wait behind the tenant's live traffic for the writer.
    priority: Literal["live", "backfill"] = "live"


class ChunkAccepted(msgspec.Struct):
    chunk_id: uuid.UUID
    seq: int
    status: str
    replayed: bool = False  # an Idempotency-Key matched an earlier identical chunk: nothing new was stored


class BatchAccepted(msgspec.Struct):
    results: list[ChunkAccepted]


class ChunkStatus(msgspec.Struct):
    chunk_id: uuid.UUID
    user_id: str
    agent_id: str | None
    run_id: str | None
    seq: int
    status: str
    attempts: int
    error: str | None
    changeset_id: uuid.UUID | None
    writer: str | None
    received_at: datetime
    applied_at: datetime | None
    # What its writer calls cost: an applied chunk's changeset's, with its failed attempts' (calls,
    # prompt_tokens, completion_tokens ...).
    usage: dict[str, Any] = msgspec.field(default_factory=dict)
    # Why it waits `queued` beyond its turn: `daily_token_budget` (its tenant's writer tokens for the UTC
    # day are spent; it is written once the day turns or the budget is raised). None: it waits its turn.
    waiting_for: str | None = None
    # What the writer answered in the last failed attempt, for keys that may read memories.
    raw_output: str | None = None
    # The chunk's messages and metadata as posted, for keys that may read memories.
    messages: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None

    @classmethod
    def of(cls, chunk: Any, *, may_read: bool, progress: Any = None) -> ChunkStatus:
        """A chunk's progress (`progress`: its writer, usage and wait as `ingest.services.progress`
        read them; none: the row's); its messages, metadata and the writer's raw output (which may
        quote the memories the writer was shown) only for keys that may read memories."""
        return cls(
            chunk_id=chunk.id,
            user_id=chunk.user_id,
            agent_id=chunk.agent_id,
            run_id=chunk.run_id,
            seq=chunk.seq,
            status=chunk.status,
            attempts=chunk.attempts,
            error=chunk.last_error,
            changeset_id=chunk.changeset_id,
            writer=progress.writer if progress is not None else chunk.writer,
            received_at=chunk.received_at,
            applied_at=chunk.applied_at,
            usage=progress.usage if progress is not None else chunk.usage,
            waiting_for=progress.waiting_for if progress is not None else None,
            raw_output=chunk.raw_output if may_read else None,
            messages=chunk.messages if may_read else None,
            metadata=chunk.metadata_ if may_read else None,
        )


class ChunkStatuses(msgspec.Struct):
    """Several chunks' progress, in the order asked for."""

    items: list[ChunkStatus]


class ChunkList(msgspec.Struct):
    items: list[ChunkStatus]
    next_cursor: str | None
