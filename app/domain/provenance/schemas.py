"""Bodies of `GET /v1/memories/{id}/explain` (api.md, "Provenance")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

from app.domain.history.schemas import ChangesetOut
from app.domain.memories.schemas import MemoryOut, VersionOut
from app.lib.schemas import Out


class SourceChunkOut(Out):
    """The chunk a version was written from: its messages, and the earlier messages of the scope its
    writer was given as context, as it saw them (oldest first)."""

    chunk_id: uuid.UUID
    seq: int
    agent_id: str | None
    run_id: str | None
    writer: str | None
    messages: list[dict[str, Any]]
    metadata: dict[str, Any]
    received_at: datetime
    applied_at: datetime | None
    context: list[dict[str, Any]] | None  # None: not recorded (written before writer views existed)


class CandidateOut(msgspec.Struct):
    """A memory the writer was shown under a local id, as it read then (that version's text)."""

    local_id: int
    memory_id: uuid.UUID
    version: int
    content: str | None  # None: the version is gone (a purge)
    status: str | None
    # When its fact held, as that version said (valid time; null where unknown, or gone).
    valid_from: datetime | None
    valid_to: datetime | None


class ExplainedVersion(msgspec.Struct):
    """One version with everything that explains it."""

    version: VersionOut
    changeset: ChangesetOut | None  # `raw_output` only with `?raw_output=true` (admin keys; audited)
    source: SourceChunkOut | None  # None for hand edits and admin undo
    candidates: list[CandidateOut] | None  # None: not a writer's version, or not recorded


class ExplainOut(msgspec.Struct):
    memory: MemoryOut
    versions: list[ExplainedVersion]  # oldest first
