"""Bodies of `GET /v1/memories/{id}/explain` (api.md, "Provenance")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

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


class ChangesetBriefOut(Out):
    """The changeset that wrote a version: what kind of write, its state now, the ops it recorded and
    the guards that fired. `raw_output` only with `?raw_output=true` (admin keys; audited)."""

    id: uuid.UUID
    kind: str
    status: str
    actor: str
    reason: str | None
    created_at: datetime
    ops: list[dict[str, Any]]
    guards: list[dict[str, Any]]
    usage: dict[str, Any]
    target: dict[str, Any]
    raw_output: str | None = None


class ExplainedVersion(msgspec.Struct):
    """One version with everything that explains it."""

    version: VersionOut
    changeset: ChangesetBriefOut | None
    source: SourceChunkOut | None  # None for hand edits and admin undo
    candidates: list[CandidateOut] | None  # None: not a writer's version, or not recorded


class ExplainOut(msgspec.Struct):
    memory: MemoryOut
    versions: list[ExplainedVersion]  # oldest first
