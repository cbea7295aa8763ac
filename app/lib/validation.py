"""Input that Postgres could not store is refused at the edge, naming the field.

JSON can carry text that Postgres cannot hold: a NUL character (`\\u0000`) is valid in a JSON string
but not in a `text` or `jsonb` value, and a time such as `0001-01-01T00:00:00+14:00` is a valid
RFC 3339 string whose UTC instant lies before year 1. Accepted, such input fails deep inside a
transaction — a 500 for the request and for every request committed with it, or a chunk that can
never be applied. So every client-controlled value is checked here, before anything is written:

- `Moment` is the one type for times clients send: an RFC 3339 string with a zone, of a year from
  0002 to 9998, so that its UTC instant is a real calendar date whatever the offset (a Litestar type
  decoder parses it; a Unix number such as `-1` is refused; the OpenAPI document gives the years);
- `first_unstorable` finds the first string (or object key) in decoded JSON that holds a NUL or a
  lone surrogate, and says where it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from litestar.openapi.spec import OpenAPIFormat, OpenAPIType, Schema
from litestar.plugins import OpenAPISchemaPlugin
from litestar.typing import FieldDefinition

# The characters Postgres text cannot hold: NUL, and UTF-16 surrogates that have no partner.
_UNSTORABLE = frozenset(["\x00", *(chr(c) for c in range(0xD800, 0xE000))])


class Moment(datetime):
    """A time from a client: RFC 3339 with a zone, within the calendar once converted to UTC."""

    def plain(self) -> datetime:
        """The same time as a plain `datetime`, which every encoder knows."""
        return datetime.combine(self.date(), self.timetz())


def encode_moment(value: Any) -> Any:
    """`enc_hook` for msgspec (and Litestar's `type_encoders`): a `Moment` encodes as a `datetime`."""
    if isinstance(value, Moment):
        return value.plain()
    msg = f"cannot encode {type(value).__name__}"
    raise NotImplementedError(msg)


# A time of year 0001 or 9999 with an offset can fall outside the calendar once converted to UTC.
FIRST_YEAR, LAST_YEAR = 2, 9998


def parse_moment(value: object) -> Moment:
    """`value` as a `Moment`; ValueError (which the framework answers with 422) if it is not one."""
    if isinstance(value, datetime):  # already parsed (a default, or a test building a body)
        value = value.isoformat()
    if not isinstance(value, str):
        msg = "expected an RFC 3339 time string with a zone, e.g. 2026-11-30T10:00:00Z"
        raise ValueError(msg)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        msg = f"not an RFC 3339 time: {value[:40]!r}"
        raise ValueError(msg) from None
    if parsed.tzinfo is None:
        msg = "the time needs a zone (e.g. Z or +02:00)"
        raise ValueError(msg)
    if not FIRST_YEAR <= parsed.year <= LAST_YEAR:  # so that, with any offset, it stays in the calendar
        msg = f"the year must be between {FIRST_YEAR:04} and {LAST_YEAR}"
        raise ValueError(msg)
    return Moment.fromisoformat(parsed.isoformat())


def _decode_moment(target: type, value: Any) -> Moment:
    return parse_moment(value)


# Litestar `type_decoders`: how request values become our own types.
TYPE_DECODERS = [(lambda target: target is Moment, _decode_moment)]


# The document says which years a time may have (what `parse_moment` takes).
MOMENT_YEARS = "^(?:000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9])-"


class MomentSchemaPlugin(OpenAPISchemaPlugin):
    """`Moment` appears in the OpenAPI document as what it is on the wire: a date-time string."""

    @staticmethod
    def is_plugin_supported_type(value: Any) -> bool:
        return value is Moment

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator: Any) -> Schema:
        return Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.DATE_TIME, pattern=MOMENT_YEARS)


def unstorable_reason(text: str) -> str | None:
    """Why Postgres could not store `text`, or None if it can."""
    if _UNSTORABLE.isdisjoint(text):
        return None
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which cannot be stored"
    return "contains an unpaired UTF-16 surrogate, which cannot be stored"


def first_unstorable(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first string or object key in decoded JSON that Postgres cannot store: (field, why)."""
    for where, text in _strings(value, path):
        reason = unstorable_reason(text)
        if reason is not None:
            return where or "body", reason
    return None


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:  # iterative: a hostile body may nest deeper than Python's recursion limit
        where, item = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                child_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str):
                    yield child_path, key
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(list(enumerate(item))))


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """True if decoded JSON nests objects/arrays deeper than `limit`."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False
