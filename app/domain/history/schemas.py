"""Bodies of the admin history and audit endpoints (api.md, "Admin")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec

from app.db.models import AuditEvent, Changeset
from app.domain.history.services import UndoResult

Reason = Annotated[str, msgspec.Meta(max_length=2_000)]
Moment = Annotated[datetime, msgspec.Meta(tz=True)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class RollbackIn(msgspec.Struct, forbid_unknown_fields=True):
    to_version: Annotated[int, msgspec.Meta(ge=1)]
    dry_run: bool = False
    reason: Reason | None = None


class RevertIn(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = False
    force: bool = False
    reason: Reason | None = None


class RestoreIn(msgspec.Struct, forbid_unknown_fields=True):
    as_of: Moment
    dry_run: bool = False
    reason: Reason | None = None


class BulkRevertIn(msgspec.Struct, forbid_unknown_fields=True):
    since: Moment
    until: Moment | None = None
    writer: Name | None = None
    model: Name | None = None
    user_id: Name | None = None
    dry_run: bool = False
    force: bool = False
    reason: Reason | None = None


class DiffOut(msgspec.Struct):
    """api.md's diff object; `changeset_ids` / `reverted` also name every changeset written / undone."""

    changeset_id: uuid.UUID | None
    diff: list[dict[str, Any]]
    conflicts: list[dict[str, Any]]
    dry_run: bool
    changeset_ids: list[uuid.UUID]
    reverted: list[uuid.UUID]

    @classmethod
    def of(cls, result: UndoResult) -> DiffOut:
        return cls(
            changeset_id=result.changeset_id,
            diff=result.diff,
            conflicts=result.conflicts,
            dry_run=result.dry_run,
            changeset_ids=result.changeset_ids,
            reverted=result.reverted,
        )


class ChangesetOut(msgspec.Struct):
    id: uuid.UUID
    user_id: str
    kind: str
    chunk_id: uuid.UUID | None
    writer: str | None
    model: str | None
    profile: str | None
    prompt_hash: str | None
    status: str
    ops: list[dict[str, Any]]
    guards: list[dict[str, Any]]
    usage: dict[str, Any]
    target: dict[str, Any]
    reason: str | None
    created_at: datetime
    actor: str
    raw_output: str | None = None

    @classmethod
    def of(cls, c: Changeset, *, raw: bool = False) -> ChangesetOut:
        return cls(
            id=c.id,
            user_id=c.user_id,
            kind=c.kind,
            chunk_id=c.chunk_id,
            writer=c.writer,
            model=c.model,
            profile=c.profile,
            prompt_hash=c.prompt_hash,
            status=c.status,
            ops=c.ops,
            guards=c.guards,
            usage=c.usage,
            target=c.target,
            reason=c.reason,
            created_at=c.created_at,
            actor=c.actor,
            raw_output=c.raw_output if raw else None,
        )


class ChangesetList(msgspec.Struct):
    items: list[ChangesetOut]
    next_cursor: str | None


class RetryIn(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = False


class RetryOut(msgspec.Struct):
    chunk_id: uuid.UUID
    seq: int
    status: str
    dry_run: bool = False


class PurgeOut(msgspec.Struct):
    """Rows deleted per kind (with `dry_run`: rows that would be)."""

    user_id: str
    deleted: dict[str, int]
    dry_run: bool = False


class AuditEventOut(msgspec.Struct):
    id: int
    seq: int | None
    actor: str
    action: str
    target_type: str | None
    target_id: str | None
    request_id: str | None
    summary: dict[str, Any]
    created_at: datetime
    prev_hash: str | None
    hash: str | None

    @classmethod
    def of(cls, e: AuditEvent) -> AuditEventOut:
        return cls(
            id=e.id,
            seq=e.seq,
            actor=e.actor,
            action=e.action,
            target_type=e.target_type,
            target_id=e.target_id,
            request_id=e.request_id,
            summary=e.summary,
            created_at=e.created_at,
            prev_hash=e.prev_hash,
            hash=e.hash,
        )


class AuditList(msgspec.Struct):
    items: list[AuditEventOut]
    next_cursor: str | None


class VerifyOut(msgspec.Struct):
    """`ok` and how many sealed events were checked; otherwise the first broken link and why."""

    ok: bool
    checked: int
    unsealed: int
    broken_at_seq: int | None = None
    reason: str | None = None
