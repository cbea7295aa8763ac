"""Typed bodies of the REST API (docs/api.md), as the SDK receives them.

Fields the server adds later are ignored, so an older SDK keeps working against a newer server; times
are timezone-aware `datetime`s, ids `uuid.UUID`s.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec


class Message(msgspec.Struct, omit_defaults=True):
    role: str  # user | assistant | system | tool
    content: str
    name: str | None = None
    created_at: datetime | None = None


class ChunkAccepted(msgspec.Struct):
    chunk_id: uuid.UUID
    seq: int
    status: str
    replayed: bool = False  # the idempotency key matched an earlier identical chunk: nothing new stored


class ChunkStatus(msgspec.Struct):
    chunk_id: uuid.UUID
    user_id: str
    seq: int
    status: str  # queued | processing | applied | failed
    attempts: int
    error: str | None
    changeset_id: uuid.UUID | None
    received_at: datetime
    applied_at: datetime | None
    agent_id: str | None = None
    run_id: str | None = None
    writer: str | None = None
    usage: dict[str, Any] = msgspec.field(default_factory=dict)
    raw_output: str | None = None
    messages: list[dict[str, Any]] | None = None  # to keys that may read memories
    metadata: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("applied", "failed")


class ChunkStatuses(msgspec.Struct):
    items: list[ChunkStatus]


class Memory(msgspec.Struct):
    id: uuid.UUID
    user_id: str
    content: str
    status: str  # active | superseded | deleted
    version: int
    created_at: datetime
    updated_at: datetime
    agent_id: str | None = None
    run_id: str | None = None
    tags: list[str] = msgspec.field(default_factory=list)
    owner: str = "user"
    memory_at: datetime | None = None
    expires_at: datetime | None = None  # hidden from reads from then on (None: never)
    language: str | None = None  # detected when the text was written (ISO 639-1)
    valid_from: datetime | None = None  # when the fact began to hold (None: unknown)
    valid_to: datetime | None = None  # when it stopped holding (None: still holds, or unknown)


class Page(msgspec.Struct):
    """One page of a list; `next_cursor` fetches the next (None: this was the last)."""

    next_cursor: str | None


class ChunkPage(Page):
    items: list[ChunkStatus]


class MemoryPage(Page):
    items: list[Memory]


class SearchResult(msgspec.Struct):
    memory: Memory
    score: float
    similarity: float | None = None


class Version(msgspec.Struct):
    version: int
    op: str  # ADD UPDATE SUPERSEDE DELETE ROLLBACK RESTORE
    content: str
    status: str
    created_at: datetime
    changeset_id: uuid.UUID
    actor: str
    chunk_id: uuid.UUID | None = None
    writer: str | None = None
    model: str | None = None
    profile: str | None = None
    prompt_hash: str | None = None
    reason: str | None = None
    tags: list[str] = msgspec.field(default_factory=list)
    supersedes: list[uuid.UUID] | None = None
    superseded_by: uuid.UUID | None = None
    owner: str | None = None
    memory_at: datetime | None = None
    expires_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    language: str | None = None  # the text's, detected when it was written (ISO 639-1)


class History(msgspec.Struct):
    memory_id: uuid.UUID
    versions: list[Version]


class SourceChunk(msgspec.Struct):
    chunk_id: uuid.UUID
    seq: int
    messages: list[dict[str, Any]]
    received_at: datetime
    context: list[dict[str, Any]] | None = None  # earlier messages the writer was given
    agent_id: str | None = None
    run_id: str | None = None
    writer: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    applied_at: datetime | None = None


class Candidate(msgspec.Struct):
    local_id: int
    memory_id: uuid.UUID
    version: int
    content: str | None
    status: str | None
    valid_from: datetime | None = None  # when the fact held, as that version said
    valid_to: datetime | None = None


class Changeset(msgspec.Struct):
    id: uuid.UUID
    user_id: str
    kind: str  # writer | rollback | revert | restore | manual | review
    status: str  # applied | reverted
    actor: str
    created_at: datetime
    chunk_id: uuid.UUID | None = None
    writer: str | None = None
    model: str | None = None
    profile: str | None = None
    prompt_hash: str | None = None
    ops: list[dict[str, Any]] = msgspec.field(default_factory=list)
    guards: list[dict[str, Any]] = msgspec.field(default_factory=list)
    usage: dict[str, Any] = msgspec.field(default_factory=dict)
    target: dict[str, Any] = msgspec.field(default_factory=dict)
    reason: str | None = None
    raw_output: str | None = None


class ExplainedVersion(msgspec.Struct):
    version: Version
    changeset: Changeset | None
    source: SourceChunk | None
    candidates: list[Candidate] | None


class Explanation(msgspec.Struct):
    memory: Memory
    versions: list[ExplainedVersion]


class ChangesetPage(Page):
    items: list[Changeset]


class Diff(msgspec.Struct):
    """What an undo did (or, with `dry_run`, would do): one entry per memory it changes."""

    changeset_id: uuid.UUID | None
    diff: list[dict[str, Any]]
    conflicts: list[dict[str, Any]]
    dry_run: bool = False
    changeset_ids: list[uuid.UUID] = msgspec.field(default_factory=list)
    reverted: list[uuid.UUID] = msgspec.field(default_factory=list)


class User(msgspec.Struct):
    user_id: str
    chunks: int
    active_memories: int
    created_at: datetime


class UserPage(Page):
    items: list[User]


class AuditEvent(msgspec.Struct):
    id: int
    actor: str
    action: str
    created_at: datetime
    seq: int | None = None
    target_type: str | None = None
    target_id: str | None = None
    request_id: str | None = None
    summary: dict[str, Any] = msgspec.field(default_factory=dict)
    prev_hash: str | None = None
    hash: str | None = None


class AuditPage(Page):
    items: list[AuditEvent]


class AuditVerdict(msgspec.Struct):
    ok: bool
    checked: int
    unsealed: int = 0
    broken_at_seq: int | None = None
    reason: str | None = None


class NewKey(msgspec.Struct):
    id: uuid.UUID
    key: str


class Imported(msgspec.Struct):
    """Rows a batch of an export wrote here, per kind (none for records already loaded)."""

    user_id: str
    written: dict[str, int]


class Webhook(msgspec.Struct):
    """A webhook endpoint (docs/webhooks.md); `event_types` empty: every type."""

    id: uuid.UUID
    url: str
    event_types: list[str]
    description: str | None
    include_content: bool
    enabled: bool
    created_at: datetime
    updated_at: datetime
    previous_secret_expires_at: datetime | None = None


class NewWebhook(Webhook, kw_only=True):
    """An endpoint with its signing secret (`whsec_...`), answered only by create and rotate."""

    secret: str


class WebhookList(msgspec.Struct):
    items: list[Webhook]


class DeliveryAttempt(msgspec.Struct):
    at: str
    attempt: int
    status: int | None
    error: str | None
    duration_ms: int


class WebhookDelivery(msgspec.Struct):
    """One event on its way to an endpoint: `pending`, `delivered` or `failed` (given up)."""

    id: uuid.UUID
    event_id: uuid.UUID
    webhook_id: str
    event_type: str
    user_id: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_attempt_at: datetime | None
    delivered_at: datetime | None
    response_status: int | None
    last_error: str | None
    log: list[DeliveryAttempt]
    created_at: datetime
    data: dict[str, Any]


class DeliveryPage(Page):
    items: list[WebhookDelivery]
