"""Bodies of the memory endpoints (api.md, "Memories")."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Protocol

import msgspec

from app.db.models import MemoryVersion


class MemoryFields(Protocol):
    """What a memory's answer is made of: a `Memory`, a memory as of a time, a search hit."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def user_id(self) -> str: ...
    @property
    def agent_id(self) -> str | None: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def content(self) -> str: ...
    @property
    def tags(self) -> Sequence[str]: ...
    @property
    def owner(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def memory_at(self) -> datetime | None: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def updated_at(self) -> datetime: ...


class MemoryOut(msgspec.Struct):
    id: uuid.UUID
    user_id: str
    agent_id: str | None
    run_id: str | None
    content: str
    tags: list[str]
    owner: str
    status: str
    version: int
    memory_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, m: MemoryFields) -> MemoryOut:
        return cls(
            id=m.id,
            user_id=m.user_id,
            agent_id=m.agent_id,
            run_id=m.run_id,
            content=m.content,
            tags=list(m.tags),
            owner=m.owner,
            status=m.status,
            version=m.version,
            memory_at=m.memory_at,
            created_at=m.created_at,
            updated_at=m.updated_at,
        )


class MemoryList(msgspec.Struct):
    items: list[MemoryOut]
    next_cursor: str | None


class VersionOut(msgspec.Struct):
    version: int
    op: str
    content: str
    tags: list[str]
    status: str
    created_at: datetime
    changeset_id: uuid.UUID
    chunk_id: uuid.UUID | None
    writer: str | None
    model: str | None
    profile: str | None
    prompt_hash: str | None
    actor: str
    reason: str | None
    supersedes: list[uuid.UUID] | None
    superseded_by: uuid.UUID | None

    @classmethod
    def of(cls, v: MemoryVersion) -> VersionOut:
        return cls(
            version=v.version,
            op=v.op,
            content=v.content,
            tags=list(v.tags),
            status=v.status,
            created_at=v.created_at,
            changeset_id=v.changeset_id,
            chunk_id=v.chunk_id,
            writer=v.writer,
            model=v.model,
            profile=v.profile,
            prompt_hash=v.prompt_hash,
            actor=v.actor,
            reason=v.reason,
            supersedes=v.supersedes,
            superseded_by=v.superseded_by,
        )


class HistoryOut(msgspec.Struct):
    memory_id: uuid.UUID
    versions: list[VersionOut]


Tag = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]


class MemoryPatch(msgspec.Struct, forbid_unknown_fields=True):
    """A hand edit: new content and/or tags (tags replace the old ones when given and non-empty)."""

    content: Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)] | None = None
    tags: Annotated[list[Tag], msgspec.Meta(max_length=50)] | None = None
    reason: Annotated[str, msgspec.Meta(max_length=2_000)] | None = None
