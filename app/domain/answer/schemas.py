"""Bodies of `POST /v1/answer` (api.md, "Answers")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

import msgspec

from app.domain.memories.schemas import MemoryOut
from app.lib.validation import Moment

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class AnswerIn(msgspec.Struct, forbid_unknown_fields=True):
    user_id: Id
    question: Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)]
    as_of: Moment | None = None  # answer from the bank as it stood then
    valid_at: Moment | None = None  # answer from what held then (valid time)
    reference_time: Moment | None = None  # the "now" of the question's time words; default: now
    # At most MEMSTORE_SEARCH_MAX_TOP_K (the document says how many).
    top_k: Annotated[int, msgspec.Meta(ge=1, extra={"deployment": "max_top_k"})] = 10
    agent_id: Id | None = None


class SourceOut(msgspec.Struct):
    """Which write of the memory the reader was shown, and where that write came from."""

    version: int
    changeset_id: uuid.UUID | None
    chunk_id: uuid.UUID | None
    writer: str | None
    model: str | None
    created_at: datetime | None


class UsedMemoryOut(msgspec.Struct):
    memory: MemoryOut
    score: float  # the hybrid search's score (share of the best possible fused rank)
    provenance: SourceOut


class UsageOut(msgspec.Struct):
    prompt_tokens: int | None  # as the reader's server counts them; None when it does not say
    completion_tokens: int | None
    total_tokens: int | None
    latency_ms: float


class AnswerOut(msgspec.Struct):
    answer: str
    model: str
    memories: list[UsedMemoryOut]  # the memories handed to the reader, best first
    usage: UsageOut
