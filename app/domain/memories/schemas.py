"""Bodies of the memory endpoints (api.md, "Memories")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

import msgspec

from app.lib.schemas import Out
from app.lib.validation import Moment


class MemoryOut(Out):
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
    expires_at: datetime | None = None  # hidden from reads from this time on (null: never)
    # The text's language as detected when it was written (ISO 639-1): search reads its words in it.
    language: str | None = None
    # When the fact held in the user's world (valid time): null where unknown.
    valid_from: datetime | None = None
    valid_to: datetime | None = None


class MemoryWritten(Out, forbid_unknown_fields=True):
    """What an edit or delete answers to a key that may write but not read: the new version, no text."""

    id: uuid.UUID
    status: str
    version: int
    updated_at: datetime


class MemoryList(msgspec.Struct):
    items: list[MemoryOut]
    next_cursor: str | None


class VersionOut(Out):
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
    owner: str
    memory_at: datetime | None
    expires_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    language: str | None = None  # the text's, as detected when it was written (null: before detection)


class HistoryOut(msgspec.Struct):
    memory_id: uuid.UUID
    versions: list[VersionOut]


Tag = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]


class MemoryPatch(msgspec.Struct, forbid_unknown_fields=True):
    """A hand edit: new content and/or tags (tags replace the old ones when given and non-empty), and
    when the memory expires (`null`: never; left out: as it was)."""

    content: Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)] | None = None
    tags: Annotated[list[Tag], msgspec.Meta(max_length=50)] | None = None
    reason: Annotated[str, msgspec.Meta(max_length=2_000)] | None = None
    expires_at: Moment | msgspec.UnsetType | None = msgspec.UNSET
