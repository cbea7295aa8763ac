"""The usage report's rows."""

from __future__ import annotations

import uuid
from datetime import date

import msgspec


class UsageRow(msgspec.Struct):
    """One group's cost: the writer changesets (applied chunks) of a day, a user and a writer (a field
    not grouped by is null), with their model calls, tokens and embedded texts."""

    day: date | None
    user_id: str | None
    writer: str | None
    chunks_applied: int
    model_calls: int
    prompt_tokens: int
    completion_tokens: int
    embedder_texts: int
    tenant_id: uuid.UUID | None = None  # the operator's report, across tenants

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class UsageReport(msgspec.Struct):
    """The groups, most tokens first, and their sum; the budget left today, for a tenant with one."""

    since: date
    until: date
    group_by: list[str]
    items: list[UsageRow]
    total: UsageRow
    daily_token_budget: int | None = None
    tokens_today: int | None = None
