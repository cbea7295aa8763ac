"""Keyset cursors of the HTTP lists (memories, changesets, reviews ...): an opaque string of a row's
(created_at, id), and back; a cursor that is not one is a 422."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Protocol

from app.lib.errors import ApiError


class _Keyed(Protocol):
    @property
    def created_at(self) -> datetime: ...
    @property
    def id(self) -> uuid.UUID: ...


def encode_cursor(row: _Keyed) -> str:
    """A keyset cursor over (created_at, id)."""
    raw = f"{row.created_at.isoformat()}|{row.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, _, memory_id = raw.partition("|")
        return datetime.fromisoformat(created), uuid.UUID(memory_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            "The cursor is not valid.", code="validation_error", status_code=422, details={"field": "cursor"}
        ) from exc
