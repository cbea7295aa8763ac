"""Bodies of the admin reads the console browses by (api.md, "Admin console")."""

from __future__ import annotations

from datetime import datetime

import msgspec


class UserOut(msgspec.Struct):
    """A user of the tenant: how many chunks were posted for them and how many memories are active."""

    user_id: str
    chunks: int
    active_memories: int
    created_at: datetime


class UserList(msgspec.Struct):
    items: list[UserOut]
    next_cursor: str | None


class ChangesetCount(msgspec.Struct):
    kind: str
    writer: str | None
    model: str | None
    status: str
    count: int
    first_at: datetime
    last_at: datetime


class ChangesetCounts(msgspec.Struct):
    items: list[ChangesetCount]
