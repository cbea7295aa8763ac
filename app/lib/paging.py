"""One way to page a list: fetch one row more than the page, and hand out a cursor after its last row.

A list in (time, id) order pages by a keyset cursor, opaque to clients; the audit log by the last
event's id and the users by the last user id, which an exporter may keep. Each cursor parameter's
schema says exactly what it accepts; a cursor outside it is a 422 naming the `cursor` field.
"""

from __future__ import annotations

import base64
import binascii
import struct
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Generic, Protocol, TypeVar

from litestar.params import QueryParameter

from app.lib.errors import InvalidField

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: Sequence[T]
    next_cursor: str | None


async def paged(
    fetch: Callable[[int], Awaitable[Sequence[T]]], limit: int, cursor_of: Callable[[T], str]
) -> Page[T]:
    """`fetch(limit + 1)`: the page, and a cursor after its last row when there is more."""
    rows = await fetch(limit + 1)
    if len(rows) <= limit:
        return Page(rows, None)
    return Page(rows[:limit], cursor_of(rows[limit - 1]))


# A keyset cursor: the last row's time (microseconds since the epoch) and id, 24 bytes, in urlsafe
# base64 without padding. Every string of the pattern decodes to a position (a time past either end of
# the calendar is taken as that end), so the document's pattern is exactly what is accepted.
KEYSET_PATTERN = "^[A-Za-z0-9_-]{32}$"
_KEYSET = struct.Struct(">q16s")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EARLIEST = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_LATEST = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)

KeysetCursor = Annotated[
    str | None,
    QueryParameter(pattern=KEYSET_PATTERN, description="The `next_cursor` of the page before."),
]
# Audit events page by their id (`next_cursor` is the last event's id).
EventCursor = Annotated[
    str | None,
    QueryParameter(pattern="^[0-9]{1,18}$", description="The `next_cursor` of the page before: an event id."),
]
# Users page by their id (`next_cursor` is the last user id shown).
UserCursor = Annotated[
    str | None,
    QueryParameter(
        min_length=1, max_length=200, description="The `next_cursor` of the page before: a user id."
    ),
]


class Keyed(Protocol):
    @property
    def created_at(self) -> datetime: ...
    @property
    def id(self) -> uuid.UUID: ...


def keyset_cursor(at: datetime, row_id: uuid.UUID) -> str:
    """A cursor after the row (at, id) of a list in that order."""
    micros = (at - _EPOCH) // timedelta(microseconds=1)
    return base64.urlsafe_b64encode(_KEYSET.pack(micros, row_id.bytes)).decode()


def cursor_after(row: Keyed) -> str:
    return keyset_cursor(row.created_at, row.id)


def decode_keyset(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        micros, raw_id = _KEYSET.unpack(base64.urlsafe_b64decode(cursor))
    except (ValueError, binascii.Error, struct.error) as exc:
        raise InvalidField("The cursor is not valid.", details={"field": "cursor"}) from exc
    micros = min(max(micros, _EARLIEST), _LATEST)
    return _EPOCH + timedelta(microseconds=micros), uuid.UUID(bytes=raw_id)
