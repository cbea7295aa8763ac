"""The hand-written retrieval sets of tests/data/multilingual/ (and its everyday/ sets), as
`bench/retrieval.py --multilingual` and `--tenants` read them: each file one language, at least 30
facts, each question answered by exactly one fact and each fact asked about once, every text read as
the file's language."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.lib.lexical import detect

DATA = Path(__file__).parents[1] / "data" / "multilingual"
SETS = sorted([*DATA.glob("*.json"), *(DATA / "everyday").glob("*.json")])


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_every_language_has_both_sets() -> None:
    languages = {"en", "de", "es", "zh", "ja"}
    assert {p.stem for p in DATA.glob("*.json")} == languages
    assert {p.stem for p in (DATA / "everyday").glob("*.json")} == languages


@pytest.mark.parametrize("path", SETS, ids=lambda p: str(p.relative_to(DATA)))
def test_each_question_has_one_fact(path: Path) -> None:
    data = read(path)
    assert data["language"] == path.stem
    facts = data["facts"]
    ids = [f["id"] for f in facts]
    assert len(facts) >= 30
    assert len(set(ids)) == len(ids)
    assert len({f["text"] for f in facts}) == len(facts)
    assert sorted(q["fact"] for q in data["questions"]) == sorted(ids)
    assert len({q["text"] for q in data["questions"]}) == len(data["questions"])


@pytest.mark.parametrize("path", SETS, ids=lambda p: str(p.relative_to(DATA)))
def test_texts_are_read_as_their_language(path: Path) -> None:
    data = read(path)
    texts = [f["text"] for f in data["facts"]] + [q["text"] for q in data["questions"]]
    assert [t for t in texts if detect(t) != data["language"]] == []
