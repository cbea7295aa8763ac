"""Bodies of the Mem0-compatible routes, as the `mem0ai` 2.2 client sends and reads them.

Fields Mem0 defines that Memstore has no use for are accepted and ignored (listed per body, and in
docs/mem0.md); any other field is refused (422), so a misspelt one is never silently dropped.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Annotated, Any, Literal

import msgspec

from app.domain.memories import expiry

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)]
MAX_BATCH = 1_000  # Mem0's own bound on /v1/batch/
# Seconds since 1970 that Postgres can hold (years 1970 … 9999).
UnixTime = Annotated[int, msgspec.Meta(ge=0, le=253_402_300_799)]


class Mem0Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant", "system", "tool"]
    content: Text
    name: Annotated[str, msgspec.Meta(max_length=200)] | None = None


class AddIn(msgspec.Struct, forbid_unknown_fields=True):
    messages: Annotated[list[Mem0Message], msgspec.Meta(min_length=1)]
    user_id: Id | None = None
    agent_id: Id | None = None
    run_id: Id | None = None
    filters: dict[str, Any] | None = None  # entity ids, as the 2.2 client's options carry them
    metadata: dict[str, Any] | None = None  # stored with the chunk
    infer: bool = True
    timestamp: UnixTime | None = None  # when it was said: the memories' date
    # The last day the memories this add writes are shown (Mem0's YYYY-MM-DD; hidden after it, UTC).
    expiration_date: date | None = None
    # Mem0 options Memstore ignores.
    app_id: Id | None = None
    custom_categories: Any = None
    custom_instructions: Any = None
    agent_custom_instructions: Any = None
    structured_data_schema: Any = None
    includes: Any = None
    excludes: Any = None
    immutable: Any = None
    version: Any = None
    output_format: Any = None
    async_mode: Any = None


class AddAccepted(msgspec.Struct):
    event_id: uuid.UUID
    status: str
    message: str


class EventResult(msgspec.Struct):
    id: uuid.UUID
    event: str
    data: dict[str, Any]


class EventOut(msgspec.Struct):
    id: uuid.UUID
    event_type: str
    status: Literal["PENDING", "RUNNING", "SUCCEEDED", "FAILED"]
    results: list[EventResult]
    error: str | None
    created_at: datetime
    updated_at: datetime | None


class ListIn(msgspec.Struct, forbid_unknown_fields=True):
    filters: dict[str, Any] | None = None
    show_expired: bool | None = None  # also memories whose expiration date has passed
    # Mem0 options Memstore ignores.
    fields: Any = None
    latest_only: Any = None
    metadata: Any = None


class SearchIn(msgspec.Struct, forbid_unknown_fields=True):
    query: Annotated[str, msgspec.Meta(min_length=1, max_length=4_000)]
    filters: dict[str, Any] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=1, le=100)] = 10
    threshold: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    keyword_search: bool | None = None
    show_expired: bool | None = None  # also memories whose expiration date has passed
    # Mem0 options Memstore ignores.
    rerank: Any = None
    fields: Any = None
    latest_only: Any = None
    reference_date: Any = None
    metadata: Any = None


class Mem0Memory(msgspec.Struct):
    """A memory as Mem0 shows one, with Memstore's own `status`, `version` and valid time besides."""

    id: uuid.UUID
    memory: str
    user_id: str
    agent_id: str | None
    run_id: str | None
    app_id: None
    metadata: None
    categories: list[str]
    owner: str
    status: str
    version: int
    created_at: datetime
    updated_at: datetime
    expiration_date: str | None  # the last day it is shown (YYYY-MM-DD, UTC), as Mem0 shows it
    # When its fact held in the user's world (Memstore's valid time; null where unknown).
    valid_from: datetime | None
    valid_to: datetime | None

    @classmethod
    def of(cls, memory: Any) -> Mem0Memory:
        return cls(
            id=memory.id,
            memory=memory.content,
            user_id=memory.user_id,
            agent_id=memory.agent_id,
            run_id=memory.run_id,
            app_id=None,
            metadata=None,
            categories=list(memory.tags),
            owner=memory.owner,
            status=memory.status,
            version=memory.version,
            created_at=memory.created_at,
            updated_at=memory.updated_at,
            expiration_date=expiry.last_day(memory.expires_at),
            valid_from=memory.valid_from,
            valid_to=memory.valid_to,
        )


class Mem0Hit(Mem0Memory):
    score: float = 0.0


class MemoryPage(msgspec.Struct):
    count: int
    next: str | None
    previous: str | None
    results: list[Mem0Memory]


class SearchOut(msgspec.Struct):
    results: list[Mem0Hit]


class HistoryEntry(msgspec.Struct):
    """One version of a memory in Mem0's history shape, with Memstore's op, provenance and the valid time
    the version gave the fact."""

    id: str  # "<memory id>:<version>"
    memory_id: uuid.UUID
    version: int
    event: str  # ADD | UPDATE | DELETE, as Mem0 names them
    op: str  # Memstore's own: ADD UPDATE SUPERSEDE DELETE ROLLBACK RESTORE
    old_memory: str | None
    new_memory: str
    status: str
    user_id: str
    changeset_id: uuid.UUID
    chunk_id: uuid.UUID | None
    actor: str
    reason: str | None
    created_at: datetime
    updated_at: datetime
    valid_from: datetime | None
    valid_to: datetime | None


class UpdateIn(msgspec.Struct, forbid_unknown_fields=True):
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)] | None = None
    metadata: dict[str, Any] | None = None  # refused unless null: memories hold no metadata
    timestamp: Any = None  # ignored
    # The last day the memory is shown (YYYY-MM-DD); null: never expires; left out: as it was.
    expiration_date: date | msgspec.UnsetType | None = msgspec.UNSET


class BatchUpdateItem(msgspec.Struct, forbid_unknown_fields=True):
    memory_id: uuid.UUID
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)]


class BatchUpdateIn(msgspec.Struct, forbid_unknown_fields=True):
    memories: Annotated[list[BatchUpdateItem], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


class BatchDeleteItem(msgspec.Struct, forbid_unknown_fields=True):
    memory_id: uuid.UUID


class BatchDeleteIn(msgspec.Struct, forbid_unknown_fields=True):
    memories: Annotated[list[BatchDeleteItem], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


class Message(msgspec.Struct):
    message: str


class Entity(msgspec.Struct):
    id: str
    name: str
    type: Literal["user", "agent", "run"]
    total_memories: int
    created_at: datetime
    updated_at: datetime


class EntityList(msgspec.Struct):
    count: int
    results: list[Entity]


class FeedbackIn(msgspec.Struct, forbid_unknown_fields=True):
    memory_id: uuid.UUID
    feedback: Literal["POSITIVE", "NEGATIVE", "VERY_NEGATIVE"] | None = None
    feedback_reason: Annotated[str, msgspec.Meta(max_length=2_000)] | None = None


class Ping(msgspec.Struct):
    """The client keeps `org_id` and `project_id` (it refuses to start without them) and uses them only
    for Mem0's project routes, which Memstore does not serve: both are the key's tenant."""

    status: str
    org_id: str
    project_id: str
    user_email: None
    tenant_id: uuid.UUID
    key_name: str | None
    roles: list[str]
