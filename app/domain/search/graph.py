"""The vector graph's indexer: active memories join the HNSW graph in batches, off the write path.

A head written by `memories.version_writer` is out of the graph (`in_graph` false), so the write pays
for no graph insert; it is in the graph's tail, which search reads exactly beside the graph
(`search.repositories`). The workers run `index_graph` every second (`workers/jobs.py`): it marks the
tail's rows in small batches, each its own transaction, so a writer that wants one of those rows waits
for one batch at most, and rows a writer holds are skipped until it has written them.

The mark is set by `memstore_index_graph` (migration 0011), a function of the tables' owner: the graph
is one index over every tenant, and the function returns only how many rows it marked.
"""

from __future__ import annotations

import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.lib import metrics

_INDEX_BATCH = text("SELECT memstore_index_graph(:batch)")


async def index_graph(engine: AsyncEngine, *, batch: int, budget_s: float) -> int:
    """Add the graph's tail to it, `batch` rows per transaction, until the tail is empty or `budget_s`
    has passed; how many rows were added."""
    started = time.monotonic()
    total = 0
    while True:
        async with engine.begin() as conn:
            added = int(await conn.scalar(_INDEX_BATCH, {"batch": batch}) or 0)
        total += added
        metrics.GRAPH_ROWS_INDEXED.inc(added)
        if added < batch or time.monotonic() - started >= budget_s:
            return total
