"""The ADDs of one result are compared with the earlier ADDs of that result by one matrix product and a
lookup by words; the answer is the pairwise rule's (`repeats` against each earlier ADD, the first that
holds), on results built to hold repeats of every kind: close vectors, the same words, and near twins
that differ in a number."""

from __future__ import annotations

import math
import random

import pytest

from app.domain.memories.services.guards import _KeptAdds, repeats

WORDS = ["tea", "coffee", "Oslo", "Lisbon", "hiking", "chess", "jazz", "Python", "cats", "bread"]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return dot / norm if norm else 0.0


def _result(rng: random.Random, size: int) -> list[tuple[str, list[float]]]:
    """ADDs whose texts and vectors often nearly repeat earlier ones."""
    adds: list[tuple[str, list[float]]] = []
    for _ in range(size):
        if adds and rng.random() < 0.4:
            text, vector = rng.choice(adds)
            text = rng.choice(
                [
                    text,  # the same words
                    text.rstrip(".") + "!",
                    text.replace("likes", "really likes"),
                    text + " 3",  # another fact: a number more
                    f"The user enjoys {rng.choice(WORDS)}.",  # other words: a repeat only by its vector
                ]
            )
            noise = rng.choice([0.02, 0.2, 0.35, 0.5, 0.8])  # from near copies to past the threshold
            vector = [x + rng.gauss(0, noise) for x in vector]
        else:
            text = f"The user likes {rng.choice(WORDS)} and {rng.choice(WORDS)}."
            vector = [rng.gauss(0, 1) for _ in range(16)]
        if rng.random() < 0.05:
            vector = [0.0] * 16  # a zero vector is similar to nothing
        adds.append((text, vector))
    return adds


@pytest.mark.parametrize("seed", range(20))
def test_the_first_repeat_is_the_pairwise_rules(seed: int) -> None:
    rng = random.Random(seed)
    threshold = rng.choice([0.8, 0.9, 0.95, 1.0])
    kept, pairwise = _KeptAdds(), []
    found = 0
    for index, (text, vector) in enumerate(_result(rng, 120)):
        expected = next((i for i, v, t in pairwise if repeats(text, t, _cosine(v, vector), threshold)), None)
        assert kept.first_repeat(text, vector, threshold) == expected, (index, text)
        if expected is None:
            kept.keep(index, vector, text)
            pairwise.append((index, vector, text))
        else:
            found += 1
    assert found > 0  # the results hold repeats, so the comparison is not of empty answers
