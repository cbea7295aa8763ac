"""pgvector's text form of a vector, as the service binds every vector it sends."""

from __future__ import annotations

import random

import numpy as np

from app.db.base import vector_text

EDGES = [0.0, -0.0, 1e-30, 3.4e38, -1.5e-7, 1e16, 1, -2]


def _values(written: str) -> list[float]:
    assert written.startswith("[")
    assert written.endswith("]")
    return [float(x) for x in written[1:-1].split(",")]


def test_floats_are_written_exactly() -> None:
    rng = random.Random(3)
    vector = [rng.uniform(-1, 1) for _ in range(384)] + EDGES
    assert _values(vector_text(vector)) == [float(x) for x in vector]
    assert " " not in vector_text(vector)


def test_numpy_values_are_written_exactly() -> None:
    vector = np.random.default_rng(4).standard_normal(384).astype(np.float32)
    assert _values(vector_text(vector)) == [float(x) for x in vector]
    assert _values(vector_text(list(vector))) == [float(x) for x in vector]
