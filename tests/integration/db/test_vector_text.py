"""Postgres reads back every vector the service writes, as written (pgvector keeps float32)."""

from __future__ import annotations

import random

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.base import vector_text
from tests.unit.test_vector_text import EDGES


async def test_pgvector_reads_the_text_form_of_every_kind_of_float(engine: AsyncEngine) -> None:
    rng = random.Random(5)
    vector = [rng.uniform(-1, 1) for _ in range(100)] + EDGES
    async with engine.connect() as conn:
        as_text = text("SELECT CAST(CAST(:v AS vector) AS text)")
        stored = await conn.scalar(as_text, {"v": vector_text(vector)})
    assert stored is not None
    read = [float(x) for x in stored[1:-1].split(",")]
    assert np.array_equal(np.array(read, dtype=np.float32), np.array(vector, dtype=np.float32))
