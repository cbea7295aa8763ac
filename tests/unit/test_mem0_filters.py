"""Mem0 filters compiled to SQL: every operator, AND / OR / NOT, the wildcard, and refusals that name
where the filter went wrong."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.dialects import postgresql

from app.domain.mem0.filters import MAX_DEPTH, MAX_LIST, compile_filters
from app.lib.errors import InvalidFilters


def sql(filters: Any) -> str:
    """The condition with its values inlined (asyncpg's paramstyle doubles a literal `%`)."""
    condition = compile_filters(filters).condition
    return str(condition.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"user_id": "ana"}, "memories.user_id = 'ana'"),
        ({"user_id": {"eq": "ana"}}, "memories.user_id = 'ana'"),
        ({"agent_id": {"ne": "bot"}}, "memories.agent_id IS NULL OR memories.agent_id != 'bot'"),
        ({"run_id": {"in": ["r1", "r2"]}}, "memories.run_id IS NOT NULL AND memories.run_id IN ('r1', 'r2')"),
        ({"run_id": {"nin": ["r1"]}}, "memories.run_id IS NULL OR (memories.run_id NOT IN ('r1'))"),
        ({"created_at": {"gt": "2026-01-01T00:00:00Z"}}, "memories.created_at > '2026-01-01 00:00:00+00:00'"),
        ({"created_at": {"gte": "2026-01-01"}}, "memories.created_at >= '2026-01-01 00:00:00+00:00'"),
        (
            {"updated_at": {"lt": "2026-01-01T00:00:00+02:00"}},
            "memories.updated_at < '2026-01-01 00:00:00+02:00'",
        ),
        ({"updated_at": {"lte": "2026-01-01"}}, "memories.updated_at <= '2026-01-01 00:00:00+00:00'"),
        ({"memory": {"contains": "50%_x"}}, "memories.content LIKE '%%50\\%%\\_x%%' ESCAPE '\\'"),
        ({"memory": {"icontains": "lyon"}}, "memories.content ILIKE '%%lyon%%' ESCAPE '\\'"),
        ({"categories": {"contains": "food"}}, "memories.tags @> ARRAY['food']"),
        ({"categories": {"in": ["a", "b"]}}, "memories.tags && ARRAY['a', 'b']"),
        ({"categories": {"nin": ["a"]}}, "NOT (memories.tags && ARRAY['a'])"),
        ({"agent_id": "*"}, "memories.agent_id IS NOT NULL"),
        ({"user_id": {"eq": "*"}}, "memories.user_id IS NOT NULL"),
        (
            {"AND": [{"user_id": "ana"}, {"agent_id": "bot"}]},
            "memories.user_id = 'ana' AND memories.agent_id IS NOT NULL AND memories.agent_id = 'bot'",
        ),
        (
            {"OR": [{"user_id": "ana"}, {"user_id": "bo"}]},
            "memories.user_id = 'ana' OR memories.user_id = 'bo'",
        ),
        ({"NOT": [{"user_id": "ana"}]}, "memories.user_id != 'ana'"),
        ({"NOT": {"run_id": "r"}}, "NOT (memories.run_id IS NOT NULL AND memories.run_id = 'r')"),
    ],
)
def test_each_operator_and_connective_compiles_to_its_condition(filters: Any, expected: str) -> None:
    assert sql(filters) == expected


def test_several_keys_of_one_object_must_all_hold_and_pin_the_user() -> None:
    compiled = compile_filters({"user_id": "ana", "AND": [{"user_id": "ana"}], "run_id": {"ne": "x"}})
    assert compiled.user_ids == {"ana"}
    assert compile_filters({"OR": [{"user_id": "a"}, {"user_id": "b"}]}).user_ids == set()
    assert compile_filters({"user_id": "*"}).user_ids == set()


def _nested(depth: int) -> dict[str, Any]:
    filters: dict[str, Any] = {"user_id": "ana"}
    for _ in range(depth - 1):
        filters = {"AND": [filters]}
    return filters


@pytest.mark.parametrize(
    ("filters", "where", "reason"),
    [
        ({"metadata": {"a": 1}}, "filters.metadata", "unknown or unsupported field"),
        ({"app_id": "x"}, "filters.app_id", "unknown or unsupported field"),
        ({"user_id": {"like": "a"}}, "filters.user_id.like", "unknown operator"),
        ({"created_at": {"contains": "2026"}}, "filters.created_at.contains", "does not take contains"),
        ({"user_id": {"in": "ana"}}, "filters.user_id.in", "takes a list"),
        ({"user_id": {"in": ["a"] * (MAX_LIST + 1)}}, "filters.user_id.in", f"at most {MAX_LIST}"),
        ({"user_id": 7}, "filters.user_id", "expected a string"),
        ({"user_id": {"in": [1]}}, "filters.user_id.in[0]", "expected a string"),
        ({"user_id": "a\x00b"}, "filters.user_id", "NUL"),
        ({"created_at": {"gt": "yesterday"}}, "filters.created_at.gt", "RFC 3339"),
        ({"created_at": {"gt": "2026-01-01T00:00:00"}}, "filters.created_at.gt", "needs a zone"),
        ({"id": {"eq": "not-a-uuid"}}, "filters.id.eq", "UUID"),
        ({"AND": {"user_id": "a"}}, "filters.AND", "list of filters"),
        ({"OR": []}, "filters.OR", "non-empty list"),
        ({"AND": ["ana"]}, "filters.AND[0]", "a filter is an object"),
        ({}, "filters", "at least one field"),
        ([{"user_id": "a"}], "filters", "a filter is an object"),
        (_nested(MAX_DEPTH + 1), "filters" + ".AND[0]" * MAX_DEPTH, "nest at most"),
    ],
)
def test_what_cannot_run_is_refused_naming_where_and_why(filters: Any, where: str, reason: str) -> None:
    with pytest.raises(InvalidFilters) as refused:
        compile_filters(filters)
    assert refused.value.status_code == 400
    assert refused.value.details["field"] == where
    assert reason in refused.value.details["reason"]


def test_the_deepest_allowed_nesting_compiles() -> None:
    assert sql(_nested(MAX_DEPTH)) == "memories.user_id = 'ana'"


def test_a_filter_of_too_many_conditions_is_refused() -> None:
    wide = {"OR": [{"user_id": f"u{i}", "agent_id": "a", "run_id": "r"} for i in range(MAX_LIST)]}
    with pytest.raises(InvalidFilters, match="at most 200 conditions"):
        compile_filters(wide)
