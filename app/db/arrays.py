"""Rows as column arrays, for an `INSERT ... SELECT ... FROM unnest(...)` of any number of rows.

One statement text whatever the number of rows (one prepared statement), and one bind parameter per
column rather than per value. JSON columns go as text (`msgspec`), cast to `jsonb` in the statement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec


def as_columns(
    rows: Sequence[Mapping[str, Any]],
    names: Iterable[str],
    *,
    json: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, list[Any]]:
    """`rows` as one list per column of `names`; a column in `defaults` may be left out of a row, any
    other must be there (KeyError); the `json` columns encoded as JSON text."""
    defaults = defaults or {}
    columns = {
        name: [row[name] if name in row or name not in defaults else defaults[name] for row in rows]
        for name in names
    }
    for name in json:
        columns[name] = [msgspec.json.encode(value).decode() for value in columns[name]]
    return columns
