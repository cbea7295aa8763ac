"""The vector graph's indexer: active memories join the HNSW graph in batches, off the write path, where
searches go through the graph.

Only a search over all users of a tenant, or of a scope above `search_hnsw_min_scope`, goes through
the graph; every other search is exact on its scope. Such a search records its tenant (or scope) in
`graph_scopes` (`want_graph`), and the indexer adds those memories alone, so a deployment whose
searches are all per user pays for no graph at all (`graph_index_all` adds every memory instead).

A head written by `memories.version_writer` is out of the graph (`in_graph` false), so the write pays
for no graph insert; it is in the graph's tail, which search reads exactly beside the graph
(`search.repositories`). Each worker process runs `keep_indexing` beside its jobs. It is not an arq
job, so a look at an empty tail is one short query with no queue traffic, and the looks thin out to
one per 8 s while they find nothing. It marks the tail's rows in small batches, each its own
transaction, so a writer that wants one of those rows waits for one batch at most, and rows a writer
holds are skipped until it has written them.

The mark is set by `memstore_index_graph` (migrations 0011, 0012, 0020), a function of the tables'
owner: the graph is one index over every tenant, and the function returns only how many rows it marked.
Each call marks rows of one tenant (of one of its users, or of all of them), and
`memstore_graph_tails` says which have a tail to add: no statement touches two tenants, so the indexer
runs unchanged where the tables are distributed by tenant.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import structlog
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db.models import GraphScope
from app.db.models.graph_scope import EVERY_USER
from app.lib import metrics
from app.lib.errors import is_db_outage

log = structlog.get_logger(__name__)

_TAILS = text("SELECT tenant_id, user_id FROM memstore_graph_tails(:everything)")
_INDEX_BATCH = text("SELECT memstore_index_graph(:tenant_id, :user_id, :batch)")


async def want_graph(session: AsyncSession, tenant_id: uuid.UUID, user_id: str | None) -> None:
    """Record, in the caller's transaction, that searches of the scope (of every user of the tenant if
    `user_id` is None) go through the graph: the indexer adds the scope's memories from then on. On the
    caller's connection, so a search never waits for a second one from the pool."""
    await session.execute(
        insert(GraphScope)
        .values(tenant_id=tenant_id, user_id=EVERY_USER if user_id is None else user_id)
        .on_conflict_do_nothing()
    )


async def index_graph(engine: AsyncEngine, *, batch: int, budget_s: float, everything: bool = False) -> int:
    """Add the graph's tail of the wanted scopes (of every scope with `everything`) to it, `batch` rows
    of one tenant per transaction, until that tail is empty or `budget_s` has passed; how many rows
    were added. The tails take turns, a batch each, so one large tail holds no other back."""
    started = time.monotonic()
    total = 0
    # One statement per batch, its own transaction (no BEGIN / COMMIT round trips).
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with autocommit.connect() as conn:
        tails = [(r.tenant_id, r.user_id) for r in await conn.execute(_TAILS, {"everything": everything})]
    while tails:
        left = []
        for tenant_id, user_id in tails:
            async with autocommit.connect() as conn:
                params = {"tenant_id": tenant_id, "user_id": user_id, "batch": batch}
                added = int(await conn.scalar(_INDEX_BATCH, params) or 0)
            total += added
            metrics.GRAPH_ROWS_INDEXED.inc(added)
            if time.monotonic() - started >= budget_s:
                return total
            if added == batch:
                left.append((tenant_id, user_id))
        tails = left
    return total


async def keep_indexing(
    engine: AsyncEngine,
    *,
    batch: int,
    budget_s: float,
    everything: bool = False,
    interval_s: float = 1.0,
    idle_max_s: float = 8.0,
) -> None:
    """`index_graph` every `interval_s` while there is work, for as long as the worker runs; after
    passes that found nothing the wait doubles, up to `idle_max_s`, so an idle worker costs next to
    nothing (search reads the tail exactly meanwhile: a later pass changes speed, never results). A
    database outage is waited out, any other fault logged, and the next pass tried as usual."""
    wait_s = interval_s
    while True:
        started = time.monotonic()
        added = 0
        try:
            added = await index_graph(engine, batch=batch, budget_s=budget_s, everything=everything)
        except Exception as exc:
            if is_db_outage(exc):
                log.warning("graph.db_unavailable", error=type(exc).__name__)
            else:
                log.exception("graph.index_failed")
        wait_s = interval_s if added else min(idle_max_s, wait_s * 2)
        await asyncio.sleep(max(0.0, wait_s - (time.monotonic() - started)))
