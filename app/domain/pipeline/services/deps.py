"""What a worker process shares between the scopes it drains: its clients (database, writers,
embedder, scope locks, the applier), and the three things it keeps about tenants and itself — their
options, cached a while (`TenantOptionsCache`); how long its chunks have met faults outside Postgres
(`OutageClock`); and what a chunk's ops may do (`LimitsPolicy`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.config import Settings
from app.domain.memories.services import ApplyLimits
from app.domain.pipeline.applier import Applier
from app.domain.pipeline.finished import ChunkAnnouncer
from app.domain.pipeline.locks import ScopeLocks
from app.domain.pipeline.repositories import PipelineRepository, TenantOptions
from app.domain.pipeline.services.faults import outage_backoff
from app.domain.search.services import Searcher
from app.domain.search.tenant_embedder import (
    CACHE_TTL_S,
    SWITCHING_TTL_S,
    TenantEmbedder,
    refuse_while_switching,
)
from app.embeddings import Embedder, EmbedderCounts, Embedders, embedder_counts
from app.embeddings.base import duplicate_thresholds
from app.lib.read_cache import ReadCache
from app.writers.base import OpKind, strictest
from app.writers.registry import WriterRegistry


class FedBank(Protocol):
    @property
    def id(self) -> uuid.UUID: ...


class BankFeeder(Protocol):
    """Copies a tenant scope's new chunks into the live banks of its shadow writers (`shadows`)."""

    async def feed_scope(
        self,
        tenant_id: uuid.UUID,
        user_id: str,
        writers: tuple[str, ...],
        named: Mapping[str, str] | None = None,
    ) -> Sequence[FedBank]: ...


@dataclass
class TenantOptionsCache:
    """Tenants' options for the pipeline (writer, shadows, destructive-ops policy, embedder), read from
    Postgres and kept `ttl_s`: they change rarely and may lag a little (a tenant moving to another
    embedder is read again within a second, so its chunks go on once the move is done:
    `search.tenant_embedder`). At most `size` tenants, the least recently read dropped first."""

    size: int = 4096
    ttl_s: float = CACHE_TTL_S
    cache: ReadCache[uuid.UUID, TenantOptions] = field(init=False)

    def __post_init__(self) -> None:
        self.cache = ReadCache(self._ttl, self.size)

    def _ttl(self, options: TenantOptions) -> float:
        return SWITCHING_TTL_S if options.embedder_switching_to else self.ttl_s

    @property
    def entries(self) -> dict[uuid.UUID, tuple[TenantOptions, float]]:
        return self.cache.entries

    async def get(self, session: AsyncSession, tenant_id: uuid.UUID) -> TenantOptions:
        return await self.cache.get(tenant_id, lambda: PipelineRepository(session).tenant_options(tenant_id))


@dataclass
class OutageClock:
    """Since when this process's chunks meet faults outside Postgres (monotonic clock); None once a
    chunk gets through again. The backoff of such a fault grows with it."""

    settings: Settings
    since: float | None = None

    def backoff(self) -> timedelta:
        """The delay before a chunk that met a fault outside Postgres is tried again."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        return outage_backoff(self.settings, now - self.since)

    def over(self) -> None:
        self.since = None


@dataclass(frozen=True)
class LimitsPolicy:
    """What a writer's result may do: the deployment's limits, the destructive-ops policy of the
    tenant and the writer, and which writers shadow a tenant."""

    settings: Settings
    writers: WriterRegistry

    @property
    def base(self) -> ApplyLimits:
        return ApplyLimits(
            max_ops=self.settings.writer_max_ops,
            max_chars=self.settings.max_memory_chars,
            duplicate_threshold=self.settings.duplicate_threshold,
            duplicate_thresholds=duplicate_thresholds(self.settings.embedder),
        )

    def for_tenant(self, options: TenantOptions) -> ApplyLimits:
        """The deployment's limits, with the near-duplicate thresholds of the tenant's embedder."""
        if options.embedder is None or options.embedder == self.settings.embedder:
            return self.base
        return replace(self.base, duplicate_thresholds=duplicate_thresholds(options.embedder))

    def for_chunk(self, options: TenantOptions, writer: str) -> ApplyLimits:
        """The limits of a chunk of this tenant by this writer: the destructive-ops policy is the
        stricter of the tenant's (else the deployment's) and the writer's own (writers file). A shadow
        bank applies everything: what its writer would destroy is what the comparison reports."""
        if options.shadow_of is not None:
            return self.for_tenant(options)
        own = options.destructive_ops or self.settings.destructive_ops
        policy = strictest(own, self.writers.policy(writer))
        kinds = options.destructive_kinds or tuple(self.settings.destructive_kinds)
        return replace(
            self.for_tenant(options),
            destructive=policy,
            destructive_kinds=frozenset(OpKind(k) for k in kinds),
        )

    def shadow_writers(self, options: TenantOptions) -> tuple[str, ...]:
        """The writers that shadow a tenant: its own setting, else the deployment's; a bank has none."""
        if options.shadow_of is not None:
            return ()
        if options.shadow_writers is not None:
            return options.shadow_writers
        return tuple(self.settings.shadow_writers)


@dataclass
class PipelineDeps:
    """What a worker process shares between its jobs."""

    engine: AsyncEngine
    settings: Settings
    writers: WriterRegistry
    embedder: Embedder  # the deployment's
    worker_name: str
    # Feeds tenants' live shadow banks as their scopes are taken up (the worker's; none elsewhere).
    feeder: BankFeeder | None = None
    # Announces the chunks it finishes to the API processes' waiting reads (the worker's; none elsewhere).
    announcer: ChunkAnnouncer | None = None
    tenants: TenantOptionsCache = field(default_factory=TenantOptionsCache)
    # The database is a Citus cluster with distributed tables (`app.db.distribution.is_distributed`).
    distributed: bool = False
    # Every embedder the process has loaded: the deployment's, and those its tenants chose.
    embedders: Embedders | None = None
    outage: OutageClock = field(init=False)
    policy: LimitsPolicy = field(init=False)
    locks: ScopeLocks = field(init=False)
    applier: Applier = field(init=False)
    # The same pool without transactions: a chunk's claim and the reads that prepare its writer call
    # are single statements that need no BEGIN / COMMIT round trips around them. On a Citus cluster
    # they are in transactions after all: the tenants reach the shards, where the policies read them,
    # only as the `SET LOCAL` a BEGIN carries (`app.db.tenancy`); an autocommit statement routed to a
    # worker sees no row. Whatever they write is committed by `commit_reads`.
    reads: AsyncEngine = field(init=False)
    # Shadow banks drained at once by this process, in slots of their own (`MEMSTORE_SHADOW_MAX_JOBS`),
    # and no bank in more than half of them.
    shadow_slots: asyncio.Semaphore = field(init=False)
    bank_slots: dict[uuid.UUID, asyncio.Semaphore] = field(default_factory=dict)
    _searcher: Searcher | None = None

    def __post_init__(self) -> None:
        self.outage = OutageClock(self.settings)
        self.policy = LimitsPolicy(self.settings, self.writers)
        self.locks = ScopeLocks(self.engine)
        self.applier = Applier(self.engine, self.actor, tenant_a_batch=self.distributed)
        self.reads = (
            self.engine if self.distributed else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        )
        self.shadow_slots = asyncio.Semaphore(self.settings.shadow_max_jobs)
        if self.embedders is None:
            self.embedders = Embedders(self.settings, default=self.embedder)

    def embedder_of(self, options: TenantOptions) -> Embedder:
        """The tenant's embedder; refused (`embedder_mismatch`, so its chunks wait, their attempts
        uncounted) while it moves to another (`search.tenant_embedder`)."""
        if options.embedder_switching_to is not None:
            refuse_while_switching(TenantEmbedder(options.embedder, options.embedder_switching_to))
        if options.embedder is None or options.embedder == self.settings.embedder:
            return self.embedder
        assert self.embedders is not None
        return self.embedders.get(options.embedder)

    async def commit_reads(self, session: AsyncSession) -> None:
        """Commit what a session of `reads` wrote (a claim): its transaction on a cluster; on one
        Postgres each statement committed as it ran, and this costs nothing."""
        if self.distributed:
            await session.commit()

    @property
    def searcher(self) -> Searcher:
        """Candidate retrieval: the search clients use, with this process's embedder."""
        if self._searcher is None:
            self._searcher = Searcher(self.settings, self.embedder, embedders=self.embedders)
        return self._searcher

    @property
    def embedder_counts(self) -> EmbedderCounts:
        """Model runs, texts embedded and cache hits of this process's embedder so far (the candidate
        searches and the applies share it)."""
        return embedder_counts(self.embedder)

    @property
    def actor(self) -> str:
        return f"worker:{self.worker_name}"

    async def aclose(self) -> None:
        """Finish the apply in progress, release the scope locks, close the writer and embedder clients."""
        await self.applier.aclose()
        if self.announcer is not None:
            await self.announcer.aclose()
        await self.locks.aclose()
        await self.writers.aclose()
        assert self.embedders is not None
        await self.embedders.aclose()
