"""Mem0's `filters` (v2/v3 API) as a SQL condition on `memories`.

    {"AND": [{"user_id": "ana"}, {"OR": [{"categories": {"contains": "food"}},
                                         {"created_at": {"gte": "2026-01-01T00:00:00Z"}}]}]}

A filter is an object; its keys are field names or the logical keys `AND`, `OR` (each a list of
filters) and `NOT` (a filter, or a list of filters none of which may hold); several keys of one object
must all hold. A field takes a value (`eq`), `"*"` (any value: the field is set), or an object of
operators: `eq ne gt gte lt lte in nin contains icontains`.

| Mem0 field | Memstore column | operators |
| --- | --- | --- |
| `user_id`, `agent_id`, `run_id` | the memory's scope columns | eq ne in nin contains icontains, `*` |
| `created_at`, `updated_at` | the memory's times (RFC 3339 with a zone, or a date) | eq ne gt gte lt lte |
| `categories` | `tags` | eq / contains (holds the tag), in (holds any), nin (holds none) |
| `memory` | `content` | eq ne contains icontains |
| `memory_ids`, `id` | `id` | eq ne in nin |

Anything else — an unknown field (`metadata`, `app_id`, ...), an unknown operator, a value of the
wrong type, text with a NUL, nesting deeper than `MAX_DEPTH`, a list longer than `MAX_LIST`, more than
`MAX_NODES` conditions in all — raises `InvalidFilters`, which the routes answer with 400
`invalid_filters` naming where it was (`filters.AND[1].OR[0].categories`). Every value is a bound
parameter; no text of the client's reaches the SQL. Conditions are two-valued: a field that is not
set (an agent_id of a memory written for no agent) is "not equal" to any value, so `NOT` of a
condition is exactly the memories the condition leaves out.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from typing import Any

from sqlalchemy import ColumnElement, Text, and_, false, func, literal, not_, or_, true
from sqlalchemy.dialects.postgresql import ARRAY

from app.db.models import Memory
from app.lib.errors import InvalidFilters

MAX_DEPTH = 8
MAX_LIST = 100
MAX_NODES = 200
MAX_TEXT = 2_000

LOGICAL = ("AND", "OR", "NOT")
OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "icontains")
WILDCARD = "*"

_ID_FIELDS = {"user_id": Memory.user_id, "agent_id": Memory.agent_id, "run_id": Memory.run_id}
_NULLABLE = frozenset({"agent_id", "run_id"})  # the scope columns a memory may leave unset
_TIME_FIELDS = {"created_at": Memory.created_at, "updated_at": Memory.updated_at}
_FIELD_OPERATORS = {
    **dict.fromkeys(_ID_FIELDS, ("eq", "ne", "in", "nin", "contains", "icontains")),
    **dict.fromkeys(_TIME_FIELDS, ("eq", "ne", "gt", "gte", "lt", "lte")),
    "categories": ("eq", "contains", "in", "nin"),
    "memory": ("eq", "ne", "contains", "icontains"),
    "memory_ids": ("eq", "ne", "in", "nin"),
    "id": ("eq", "ne", "in", "nin"),
}
FIELDS = tuple(_FIELD_OPERATORS)


@dataclass
class Compiled:
    """A filter as SQL, and the scope values it pins (the `user_id` an `eq` at the top level names)."""

    condition: ColumnElement[bool]
    user_ids: set[str] = field(default_factory=set)


def compile_filters(filters: Any, where: str = "filters") -> Compiled:
    """`filters` (as decoded from JSON) -> a condition on `Memory`; raises `InvalidFilters`."""
    if filters is None:
        return Compiled(true())
    compiler = _Compiler()
    condition = compiler.node(filters, where, 1)
    return Compiled(condition, compiler.top_user_ids(filters))


class _Compiler:
    def __init__(self) -> None:
        self.nodes = 0

    def top_user_ids(self, filters: Any) -> set[str]:
        """The user ids a top-level (or top-level `AND`) `user_id` equality names."""
        found: set[str] = set()
        terms = [filters, *(filters.get("AND") or [])] if isinstance(filters, dict) else []
        for term in terms:
            value = term.get("user_id") if isinstance(term, dict) else None
            if isinstance(value, dict):
                value = value.get("eq")
            if isinstance(value, str) and value != WILDCARD:
                found.add(value)
        return found

    def node(self, value: Any, where: str, depth: int) -> ColumnElement[bool]:
        if depth > MAX_DEPTH:
            raise InvalidFilters(where, f"filters nest at most {MAX_DEPTH} levels deep")
        if not isinstance(value, dict):
            raise InvalidFilters(where, "a filter is an object of fields and AND / OR / NOT")
        if not value:
            raise InvalidFilters(where, "a filter names at least one field")
        parts = []
        for key, item in value.items():
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise InvalidFilters(where, f"a filter holds at most {MAX_NODES} conditions")
            at = f"{where}.{key}"
            if key in LOGICAL:
                parts.append(self.logical(key, item, at, depth))
            elif key in _FIELD_OPERATORS:
                parts.append(self.field(key, item, at))
            else:
                known = ", ".join((*FIELDS, *LOGICAL))
                raise InvalidFilters(at, f"unknown or unsupported field {_shown(key)} (known: {known})")
        return and_(*parts) if len(parts) > 1 else parts[0]

    def logical(self, key: str, item: Any, where: str, depth: int) -> ColumnElement[bool]:
        if key == "NOT" and isinstance(item, dict):
            item = [item]
        if not isinstance(item, list) or not item:
            raise InvalidFilters(where, f"{key} takes a non-empty list of filters")
        if len(item) > MAX_LIST:
            raise InvalidFilters(where, f"{key} takes at most {MAX_LIST} filters")
        terms = [self.node(term, f"{where}[{i}]", depth + 1) for i, term in enumerate(item)]
        if key == "AND":
            return and_(*terms)
        if key == "OR":
            return or_(*terms)
        return not_(or_(*terms))

    def field(self, name: str, spec: Any, where: str) -> ColumnElement[bool]:
        if spec == WILDCARD:
            return _is_set(name)
        if not isinstance(spec, dict):
            return self.operator(name, "eq", spec, where)
        if not spec:
            raise InvalidFilters(where, "an operator object names at least one operator")
        parts = []
        for op, value in spec.items():
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise InvalidFilters(where, f"a filter holds at most {MAX_NODES} conditions")
            parts.append(self.operator(name, op, value, f"{where}.{op}"))
        return and_(*parts) if len(parts) > 1 else parts[0]

    def operator(self, name: str, op: Any, value: Any, where: str) -> ColumnElement[bool]:
        if op not in OPERATORS:
            raise InvalidFilters(where, f"unknown operator {_shown(op)} (known: {', '.join(OPERATORS)})")
        if op not in _FIELD_OPERATORS[name]:
            allowed = ", ".join(_FIELD_OPERATORS[name])
            raise InvalidFilters(where, f"{name} does not take {op} (it takes: {allowed})")
        if value == WILDCARD and op == "eq":
            return _is_set(name)
        if op in ("in", "nin"):
            if not isinstance(value, list):
                raise InvalidFilters(where, f"{op} takes a list")
            if len(value) > MAX_LIST:
                raise InvalidFilters(where, f"{op} takes at most {MAX_LIST} values")
            values = [_value(name, v, f"{where}[{i}]") for i, v in enumerate(value)]
            return _membership(name, values, negate=op == "nin")
        return _COMPARE[op](name, _value(name, value, where))


def _shown(key: Any) -> str:
    return repr(str(key)[:60])


def _value(name: str, value: Any, where: str) -> Any:
    """A filter value of the type `name` holds."""
    if name in _TIME_FIELDS:
        return _moment(value, where)
    if name in ("memory_ids", "id"):
        try:
            return uuid.UUID(value) if isinstance(value, str) else _wrong(where, "a memory id (UUID)")
        except ValueError:
            return _wrong(where, "a memory id (UUID)")
    if not isinstance(value, str):
        return _wrong(where, "a string")
    if "\x00" in value:
        raise InvalidFilters(where, "text may not hold a NUL character")
    limit = MAX_TEXT if name == "memory" else 200
    if not value or len(value) > limit:
        raise InvalidFilters(where, f"text of 1 … {limit} characters")
    return value


def _wrong(where: str, expected: str) -> Any:
    raise InvalidFilters(where, f"expected {expected}")


def _moment(value: Any, where: str) -> datetime:
    if not isinstance(value, str) or len(value) > 64:
        return _wrong(where, "an RFC 3339 time with a zone, or a date (YYYY-MM-DD)")  # type: ignore[no-any-return]
    try:
        if len(value) == 10:
            return datetime.combine(date.fromisoformat(value), time(), tzinfo=UTC)
        moment = datetime.fromisoformat(value)
    except ValueError:
        return _wrong(where, "an RFC 3339 time with a zone, or a date (YYYY-MM-DD)")  # type: ignore[no-any-return]
    if moment.tzinfo is None:
        raise InvalidFilters(where, "a time needs a zone (Z or +hh:mm)")
    return moment


def _column(name: str) -> Any:
    if name in _ID_FIELDS:
        return _ID_FIELDS[name]
    if name in _TIME_FIELDS:
        return _TIME_FIELDS[name]
    if name == "memory":
        return Memory.content
    if name == "categories":
        return Memory.tags
    return Memory.id


def _is_set(name: str) -> ColumnElement[bool]:
    if name == "categories":
        return func.cardinality(Memory.tags) > 0
    return _column(name).is_not(None)  # type: ignore[no-any-return]


def _membership(name: str, values: list[Any], *, negate: bool) -> ColumnElement[bool]:
    if name == "categories":
        overlaps = Memory.tags.overlap(_tags(values)) if values else false()
        return not_(overlaps) if negate else overlaps
    column = _column(name)
    if not values:
        return true() if negate else false()
    # A null scope column is "not in" any list (SQL's NOT IN would say unknown).
    if negate:
        return or_(column.is_(None), column.not_in(values)) if name in _NULLABLE else column.not_in(values)
    return _set_and(name, column.in_(values))


def _tags(values: list[str]) -> ColumnElement[list[str]]:
    """A bound `text[]` (the tags' own type: Postgres compares no varchar[] with it)."""
    return literal(values, type_=ARRAY(Text))


def _like(value: str) -> str:
    return "%" + value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _eq(name: str, value: Any) -> ColumnElement[bool]:
    if name == "categories":
        return Memory.tags.contains(_tags([value]))
    column = _column(name)
    return and_(column.is_not(None), column == value) if name in _NULLABLE else column == value


def _ne(name: str, value: Any) -> ColumnElement[bool]:
    column = _column(name)
    return or_(column.is_(None), column != value) if name in _NULLABLE else column != value


def _contains(name: str, value: Any) -> ColumnElement[bool]:
    if name == "categories":
        return Memory.tags.contains(_tags([value]))
    return _set_and(name, _column(name).like(_like(value), escape="\\"))


def _icontains(name: str, value: Any) -> ColumnElement[bool]:
    return _set_and(name, _column(name).ilike(_like(value), escape="\\"))


def _set_and(name: str, condition: ColumnElement[bool]) -> ColumnElement[bool]:
    """`condition`, false (not unknown) where the field is not set."""
    return and_(_column(name).is_not(None), condition) if name in _NULLABLE else condition


_COMPARE: dict[str, Callable[[str, Any], ColumnElement[bool]]] = {
    "eq": _eq,
    "ne": _ne,
    "gt": lambda name, value: _column(name) > value,
    "gte": lambda name, value: _column(name) >= value,
    "lt": lambda name, value: _column(name) < value,
    "lte": lambda name, value: _column(name) <= value,
    "contains": _contains,
    "icontains": _icontains,
}
