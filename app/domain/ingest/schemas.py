"""Bodies of the ingestion endpoints (api.md, "Ingestion")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class MessageIn(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant", "system", "tool"]
    content: Annotated[str, msgspec.Meta(min_length=1)]
    name: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    created_at: Annotated[datetime, msgspec.Meta(tz=True)] | None = None


class ChunkIn(msgspec.Struct, forbid_unknown_fields=True):
    user_id: Id
    messages: Annotated[list[MessageIn], msgspec.Meta(min_length=1)]
    agent_id: Id | None = None
    run_id: Id | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    writer: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] | None = None


class BatchChunkIn(ChunkIn, forbid_unknown_fields=True):
    """A chunk inside a batch; it may carry its own idempotency key."""

    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None


class BatchIn(msgspec.Struct, forbid_unknown_fields=True):
    chunks: Annotated[list[BatchChunkIn], msgspec.Meta(min_length=1)]


class ChunkAccepted(msgspec.Struct):
    chunk_id: uuid.UUID
    seq: int
    status: str


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
