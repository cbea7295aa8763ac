"""The near-duplicate decision against a labelled pair set written for it (tests/data/duplicate_pairs.jsonl):
172 pairs that state the same fact in other words, and 168 pairs of distinct facts, most of them minimal
pairs that differ in one number, date, time, weekday, month, name, unit, family member or negation
(the rest in one common noun). For each shipped embedder, with its default threshold: no distinct pair
is taken for a repeat, and at least nine in ten true repeats are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.domain.memories.distinct import distinct_facts
from app.domain.memories.services.guards import repeats
from app.embeddings import embedder_from_settings

PAIRS = [json.loads(line) for line in (Path(__file__).parents[2] / "data" / "duplicate_pairs.jsonl").open()]


def test_the_pair_set_is_what_it_says() -> None:
    assert len(PAIRS) >= 300
    assert {p["duplicate"] for p in PAIRS} == {True, False}
    kinds = {p["kind"] for p in PAIRS if not p["duplicate"]}
    assert kinds >= {
        "number",
        "unit",
        "time",
        "weekday",
        "month",
        "day",
        "name",
        "kin",
        "negation",
        "content",
    }
    assert len({(p["a"], p["b"]) for p in PAIRS}) == len(PAIRS)


@pytest.mark.parametrize("embedder", ["onnx", "hashing"])
async def test_no_distinct_fact_is_merged_and_nine_in_ten_repeats_are(embedder: str) -> None:
    settings = Settings(embedder=embedder)
    model = embedder_from_settings(settings)
    vectors = await model.embed([text for p in PAIRS for text in (p["a"], p["b"])])
    merged: list[dict[str, Any]] = []
    caught = 0
    for index, pair in enumerate(PAIRS):
        a, b = vectors[2 * index], vectors[2 * index + 1]
        similarity = sum(x * y for x, y in zip(a, b, strict=True))  # unit vectors
        same = repeats(pair["b"], pair["a"], similarity, settings.duplicate_threshold)
        if same and not pair["duplicate"]:
            merged.append(pair)
        caught += same and pair["duplicate"]
    duplicates = sum(p["duplicate"] for p in PAIRS)
    rate = caught / duplicates
    print(f"{embedder}: {caught}/{duplicates} repeats caught ({rate:.1%}), {len(merged)} distinct merged")
    assert merged == []
    assert caught / duplicates >= 0.9


def test_every_minimal_pair_differs_in_its_detail() -> None:
    minimal = [p for p in PAIRS if not p["duplicate"] and p["kind"] != "content"]
    assert [p for p in minimal if distinct_facts(p["a"], p["b"]) is None] == []
