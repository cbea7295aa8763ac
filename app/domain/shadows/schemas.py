"""Bodies of the shadow-bank endpoints: banks, replays, comparisons."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

from app.lib.validation import Moment

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
UserId = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class ProgressOut(msgspec.Struct):
    total: int
    applied: int
    failed: int
    pending: int


class BankOut(msgspec.Struct):
    """A shadow bank: which writer writes it, which chunks it receives, how far it has got."""

    name: str
    writer: str
    kind: str  # live | replay
    since: datetime
    until: datetime | None
    user_id: str | None
    progress: ProgressOut


class BankList(msgspec.Struct):
    items: list[BankOut]


class ReplayIn(msgspec.Struct, forbid_unknown_fields=True):
    # A writer this deployment has, other than `default` (the OpenAPI document lists them).
    writer: Annotated[str, msgspec.Meta(min_length=1, max_length=100, extra={"deployment": "named_writers"})]
    user_id: UserId | None = None
    since: Moment | None = None
    until: Moment | None = None
    # The bank to replay into; by default one named after the writer and the filter, so the same
    # replay asked again resumes.
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")] | None = (
        None
    )


class ReplayOut(msgspec.Struct):
    bank: BankOut
    fed: int  # chunks given to the bank by this call
    complete: bool  # every chunk the filter selects has been given to the bank


class CompareOut(msgspec.Struct):
    """Two banks side by side (see docs/writers.md, "Trying a writer")."""

    a: str
    b: str
    user_id: str | None
    threshold: float
    only_in_a_chunks: int
    only_in_b_chunks: int
    tenant: dict[str, Any]
    users: list[dict[str, Any]]
    chunks: list[dict[str, Any]]
