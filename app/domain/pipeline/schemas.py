"""Bodies of the chunk queue's admin endpoint (api.md, "Admin": retry)."""

from __future__ import annotations

import uuid

import msgspec


class RetryIn(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = False


class RetryOut(msgspec.Struct):
    chunk_id: uuid.UUID
    seq: int
    status: str
    dry_run: bool = False
