"""Bodies of the audit log's endpoints (api.md, "Audit")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from app.lib.schemas import Out


class AuditEventOut(Out):
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
