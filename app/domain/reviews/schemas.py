"""Bodies of `/v1/admin/reviews` (api.md, "Review queue")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec

Reason = Annotated[str, msgspec.Meta(max_length=2_000)]


class DecisionIn(msgspec.Struct, forbid_unknown_fields=True):
    reason: Reason | None = None


class TargetOut(msgspec.Struct):
    """A memory the held op names: the version the writer was shown, and the memory as it is now."""

    memory_id: uuid.UUID
    version: int
    current_version: int | None
    current_status: str | None
    current_content: str | None


class ReviewOut(msgspec.Struct):
    id: uuid.UUID
    user_id: str
    agent_id: str | None
    status: str
    op: dict[str, Any]
    targets: list[TargetOut]
    changeset_id: uuid.UUID
    chunk_id: uuid.UUID | None
    writer: str | None
    model: str | None
    profile: str | None
    prompt_hash: str | None
    memory_at: datetime | None
    created_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    decision_reason: str | None
    decision_changeset_id: uuid.UUID | None
    # False once a memory it names has changed since: approving it would be refused (409).
    applicable: bool


class ReviewList(msgspec.Struct):
    items: list[ReviewOut]
    next_cursor: str | None
