"""Bodies of the admin history endpoints (api.md, "Admin")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Self

import msgspec

from app.lib.schemas import Out
from app.lib.validation import Moment

Reason = Annotated[str, msgspec.Meta(max_length=2_000)]
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


class DiffOut(Out):
    """api.md's diff object; `changeset_ids` / `reverted` also name every changeset written / undone."""

    changeset_id: uuid.UUID | None
    diff: list[dict[str, Any]]
    conflicts: list[dict[str, Any]]
    dry_run: bool
    changeset_ids: list[uuid.UUID]
    reverted: list[uuid.UUID]


class ChangesetOut(Out):
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
    def of(cls, obj: object, *, raw: bool = False) -> Self:
        """The changeset; its raw writer output only when asked (reading it is an audited act)."""
        out = super().of(obj)
        if not raw:
            out.raw_output = None
        return out


class ChangesetList(msgspec.Struct):
    items: list[ChangesetOut]
    next_cursor: str | None


class PurgeOut(msgspec.Struct):
    """Rows deleted per kind (with `dry_run`: rows that would be)."""

    user_id: str
    deleted: dict[str, int]
    dry_run: bool = False
