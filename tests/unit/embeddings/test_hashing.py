"""The dependency-free `hashing` embedder: what it counts as alike, in every script."""

from __future__ import annotations

import itertools

import pytest

from app.config import Settings
from app.embeddings.hashing import HashingEmbedder

THRESHOLD = Settings().duplicate_threshold  # the near-duplicate guard's cosine


def cosine(a: str, b: str) -> float:
    embedder = HashingEmbedder()
    return sum(x * y for x, y in zip(embedder.embed_one(a), embedder.embed_one(b), strict=True))


UNRELATED_CJK = [
    "我住在上海。",  # I live in Shanghai.
    "我喜欢喝绿茶。",  # I like green tea.
    "我的女儿叫米娅。",  # My daughter is called Mia.
    "私は東京に住んでいます。",  # I live in Tokyo.
    "猫を二匹飼っています。",  # I have two cats.
    "コーヒーが大好きです。",  # I love coffee.
]


PAIRS = list(itertools.combinations(UNRELATED_CJK, 2))


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"pair{n}" for n in range(len(PAIRS))])
def test_unrelated_chinese_and_japanese_texts_are_not_near_duplicates(a: str, b: str) -> None:
    assert cosine(a, b) < 0.5 < THRESHOLD


def test_chinese_and_japanese_texts_are_alike_by_their_characters() -> None:
    assert cosine("我住在上海。", "我住在上海") == pytest.approx(1.0)
    # Sharing the words for living somewhere, not the place: related, not a repeat.
    assert 0.3 < cosine("我住在上海。", "我住在北京。") < THRESHOLD
    assert cosine("私は東京に住んでいます。", "東京に住んでいます") > cosine(
        "私は東京に住んでいます。", "猫を二匹飼っています。"
    )
    assert cosine("The user likes 寿司.", "寿司") > 0.3  # a CJK word in an English text is found


def test_english_vectors_are_unchanged_by_other_scripts() -> None:
    """Only characters it could not read before add features: an English bank keeps its vectors."""
    embedder = HashingEmbedder()
    assert embedder.embed_one("The user lives in Lyon.") == embedder.embed_one("The user lives in Lyon. 。")
