"""Group commit for ingestion.

Concurrent requests hand their (already validated) chunks to a batcher, which writes whatever has
accumulated in one transaction — one statement each for sequence numbers, chunks and audit events —
and answers every request only after that commit. Under load a batch holds dozens of requests, so
the per-chunk cost of round trips and commits (fsync) nearly vanishes; alone, a request waits for
nothing but its own transaction. Wake-up jobs for the workers go to Redis after the commit.

One request must never fail another. Input Postgres cannot store is refused before it gets here
(`app.server.middleware.RequestInputGuard`); should a batch fail anyway for a reason of its own (a
data error), each of its requests is written again alone, so only the bad one gets the error. A
request is atomic: if one of its chunks loses an idempotency race to another process after the
insert, the transaction is rolled back and written again without that request, which answers 409
with none of its chunks written. A lane holds at most `max_pending` chunks waiting for a transaction;
past that a request gets 503 with `Retry-After` instead of queueing without bound. A scope, and a
tenant, may have at most `max_queued_per_scope` / `max_queued_per_tenant` chunks waiting to be applied;
a request past either cap gets 429 `queue_full`, with none of its chunks written. The caps are checked
in the batch's transaction; API processes writing at once may overshoot them by a batch each. An end
user over the per-user chunk rate (`app.lib.ratelimit`) gets 429 `rate_limited`, checked for the whole
batch in one Redis round trip before its transaction.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import structlog
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Chunk
from app.db.tenancy import tenant_scope
from app.domain.accounts.services import Principal
from app.domain.audit.repositories import AuditRepository
from app.domain.audit.services import event_row
from app.domain.ingest.repositories import ChunkRepository, ScopeRepository
from app.domain.ingest.schemas import ChunkIn
from app.domain.ingest.services import Accepted, body_hash, wake_ups
from app.domain.pipeline.repositories import PipelineRepository
from app.lib import metrics, tracing
from app.lib.errors import (
    ApiError,
    ConflictError,
    IdempotencyConflict,
    Overloaded,
    QueueFull,
    RateLimited,
    Unavailable,
    data_error,
    is_db_outage,
    is_node_outage,
)
from app.lib.queue import JobQueue, ScriptCall
from app.lib.ratelimit import NO_LIMIT, Limit, RateLimiter
from app.lib.validation import encode_moment

if TYPE_CHECKING:
    from opentelemetry.context import Context

log = structlog.get_logger(__name__)


@dataclass
class _Request:
    principal: Principal
    chunks: Sequence[tuple[ChunkIn, str | None]]
    request_id: str | None
    future: asyncio.Future[list[Accepted]]
    hashes: list[str] = field(default_factory=list)
    # The request's trace (None when tracing is off): its chunks carry its `traceparent` to the workers,
    # and the group commit and the enqueue are recorded in it.
    trace: Context | None = None
    trace_parent: str | None = None
    backfill: bool = False  # its scopes wait behind the tenant's live ones (`pipeline.scheduler`)


@dataclass
class _Lane:
    pending: collections.deque[_Request] = field(default_factory=collections.deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pending_chunks: int = 0


class _Redo(Exception):  # noqa: N818  (a signal between two methods, never seen outside)
    """Roll the batch back and write it again without the requests answered meanwhile."""


class IngestBatcher:
    """Write chunks of many concurrent requests per transaction; see the module docstring."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        queue: JobQueue,
        *,
        max_chunks: int = 500,
        writers: int = 2,
        max_pending: int = 10_000,
        max_queued_per_scope: int = 0,
        max_queued_per_tenant: int = 0,
        limiter: RateLimiter | None = None,
        user_limit: Limit = NO_LIMIT,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.queue = queue
        self.limiter = limiter
        self.user_limit = user_limit
        self.max_chunks = max_chunks
        self.max_pending = max_pending
        self.caps = _Caps(max_queued_per_scope, max_queued_per_tenant)
        # One lane per writer, chosen by scope: two transactions in flight never wait for each other on
        # a scope's seq row (which would serialise them and put their commit times in the latency tail).
        self._lanes = [_Lane() for _ in range(max(1, writers))]
        self._closed = False
        self._tasks = [
            asyncio.create_task(self._run(lane), name=f"ingest-writer-{i}")
            for i, lane in enumerate(self._lanes)
        ]

    async def submit(
        self,
        principal: Principal,
        chunks: Sequence[tuple[ChunkIn, str | None]],
        request_id: str | None,
        *,
        backfill: bool = False,
    ) -> list[Accepted]:
        """Durably store `chunks` (in order); returns once they are committed. `backfill`: history being
        loaded, served after the tenant's live traffic."""
        future: asyncio.Future[list[Accepted]] = asyncio.get_running_loop().create_future()
        lane = self._lanes[hash((principal.tenant_id, chunks[0][0].user_id)) % len(self._lanes)]
        if self._closed:
            raise _shutting_down()
        if lane.pending_chunks + len(chunks) > self.max_pending:
            metrics.INGEST_REJECTED.labels("overloaded").inc()
            raise Overloaded("Too many chunks are waiting to be stored; retry shortly.")
        request = _Request(principal, chunks, request_id, future, backfill=backfill)
        if tracing.ENABLED:
            request.trace = tracing.current_context()
            request.trace_parent = tracing.traceparent()
        lane.pending.append(request)
        lane.pending_chunks += len(chunks)
        lane.ready.set()
        return await future

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop the writers; requests still waiting (none, after a graceful drain) get a 503.

        A batch being written is let finish, with its jobs' enqueue: its requests have been answered
        202, and a job cut off here would leave their scopes to the sweeper's much later look."""
        self._closed = True
        for lane in self._lanes:
            lane.ready.set()
        _, running = await asyncio.wait(self._tasks, timeout=grace_s)
        for task in running:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.caps.tenants.close()
        for lane in self._lanes:
            while lane.pending:
                _fail_request(lane.pending.popleft(), _shutting_down())

    def _take(self, lane: _Lane) -> list[_Request]:
        taken: list[_Request] = []
        size = 0
        while lane.pending and (not taken or size + len(lane.pending[0].chunks) <= self.max_chunks):
            request = lane.pending.popleft()
            taken.append(request)
            size += len(request.chunks)
        lane.pending_chunks -= size
        if not lane.pending:
            lane.ready.clear()
        return taken

    async def _run(self, lane: _Lane) -> None:
        while True:
            await lane.ready.wait()
            if self._closed:  # also when a cancellation was swallowed by a client library on the way
                return
            batch = await self._within_user_limits(self._take(lane))
            if not batch:
                continue
            started, started_ns = time.perf_counter(), tracing.now_ns()
            try:
                jobs = await self._write_with_retry(batch)
            except Exception as exc:  # noqa: BLE001  (every waiting request gets an answer, none hangs)
                jobs = await self._write_alone(batch, exc)
            log.debug(
                "ingest.batch", requests=len(batch), ms=round((time.perf_counter() - started) * 1000, 1)
            )
            committed_ns = tracing.now_ns()
            try:
                await self.queue.enqueue_many(jobs)
            except Exception:  # this loop must outlive any fault: requests wait on it
                # The chunks are committed; the sweeper wakes their scopes if no job reaches Redis.
                log.exception("ingest.enqueue_failed", jobs=len(jobs))
            if tracing.ENABLED:
                _traced(batch, started_ns, committed_ns, jobs=len(jobs))

    async def _within_user_limits(self, batch: list[_Request]) -> list[_Request]:
        """The requests whose users are within their chunk rate: one Redis round trip for the batch
        (`RateLimiter.admit`); the others are answered 429 `rate_limited`, none of their chunks written."""
        if self.limiter is None or self.user_limit.off or not batch:
            return batch
        buckets: dict[str, str] = {}  # bucket -> user_id
        charges = []
        for request in batch:
            charge: collections.Counter[str] = collections.Counter()
            for chunk, _ in request.chunks:
                bucket = f"user:{request.principal.tenant_id}:{chunk.user_id}"
                buckets[bucket] = chunk.user_id
                charge[bucket] += 1
            charges.append(charge)
        try:
            answers = await self.limiter.admit(self.user_limit, charges)
        except Exception:  # this loop must outlive any fault: a limit is a shield, requests pass
            log.exception("ingest.user_limit_failed", requests=len(batch))
            return batch
        admitted = []
        for request, (wait_s, holding) in zip(batch, answers, strict=True):
            if holding is None:
                admitted.append(request)
                continue
            metrics.INGEST_REJECTED.labels("rate_limited").inc()
            user_id = buckets[holding]
            limit = self.user_limit
            _fail_request(
                request,
                RateLimited(
                    f"The user {user_id!r} is over the limit of {limit.rate_per_s:g} chunks a second "
                    f"(bursts of {limit.burst}); retry after {math.ceil(wait_s)} s.",
                    details={
                        "scope": "user",
                        "user_id": user_id,
                        "rate_per_s": limit.rate_per_s,
                        "burst": limit.burst,
                    },
                    retry_after_s=max(1, math.ceil(wait_s)),
                ),
            )
        return admitted

    async def _write_alone(self, batch: list[_Request], exc: Exception) -> list[ScriptCall]:
        """The batch failed: if the database is reachable, write each request in a transaction of its
        own, so that only a request that fails alone gets an error (a node of a cluster down fails the
        requests of its tenants, not the others')."""
        open_requests = [r for r in batch if not r.future.done()]
        if len(open_requests) == 1 or (is_db_outage(exc) and not is_node_outage(exc)):
            for request in open_requests:
                _fail_request(request, data_error(exc) or exc)
            return []
        log.warning("ingest.batch_failed", requests=len(open_requests), error=type(exc).__name__)
        jobs: list[ScriptCall] = []
        for request in open_requests:
            try:
                jobs.extend(await self._write_with_retry([request]))
            except Exception as alone:  # noqa: BLE001
                _fail_request(request, data_error(alone) or alone)
        return jobs

    async def _write_with_retry(self, batch: list[_Request]) -> list[ScriptCall]:
        collided = False
        while batch:
            try:
                return await self._write(batch)
            except _Redo:
                batch = [r for r in batch if not r.future.done()]
            except DBAPIError as exc:
                # Two batches may still collide on rows (a deadlock or serialization failure): once more.
                if collided or getattr(exc.orig, "sqlstate", None) not in {"40P01", "40001"}:
                    raise
                collided = True
                log.info("ingest.batch_retry", error=type(exc.orig).__name__)
        return []

    async def _write(self, batch: list[_Request]) -> list[ScriptCall]:
        for request in batch:
            request.hashes = [body_hash(chunk) for chunk, _ in request.chunks]
        # One transaction for the batch's tenants, and theirs alone (`app.db.tenancy`).
        tenants = sorted({r.principal.tenant_id for r in batch})
        with tenant_scope(tenants):
            return await self._write_as_tenants(batch)

    async def _write_as_tenants(self, batch: list[_Request]) -> list[ScriptCall]:
        async with self.sessionmaker() as session, session.begin():
            chunks = ChunkRepository(session)
            keys = {(r.principal.tenant_id, key) for r in batch for _, key in r.chunks if key is not None}
            earlier = await chunks.by_idempotency_keys(sorted(keys))
            claimed: dict[tuple[uuid.UUID, str], tuple[uuid.UUID, str]] = {}  # key -> (chunk id, hash)
            plans: list[tuple[_Request, list[Accepted | None]]] = []
            new_rows: list[dict[str, object]] = []
            counts: dict[tuple[uuid.UUID, str], int] = {}
            caps = await self.caps.counted(chunks, batch, self.sessionmaker)
            for request in batch:
                plan = self._plan(request, earlier, claimed)
                if plan is None or not caps.admit(request, plan, claimed):
                    continue
                plans.append((request, plan))
                for (chunk, _), accepted in zip(request.chunks, plan, strict=True):
                    if accepted is None:
                        scope = (request.principal.tenant_id, chunk.user_id)
                        counts[scope] = counts.get(scope, 0) + 1
            last_seq = await ScopeRepository(session).allocate_seqs(counts)
            next_seq = {scope: last - counts[scope] + 1 for scope, last in last_seq.items()}
            audit_rows = []
            for request, plan in plans:
                tenant_id = request.principal.tenant_id
                for i, ((chunk, key), accepted) in enumerate(zip(request.chunks, plan, strict=True)):
                    if accepted is not None:
                        continue
                    scope = (tenant_id, chunk.user_id)
                    seq, next_seq[scope] = next_seq[scope], next_seq[scope] + 1
                    chunk_id = claimed[(tenant_id, key)][0] if key is not None else uuid.uuid4()
                    new_rows.append(
                        {
                            "id": chunk_id,
                            "tenant_id": tenant_id,
                            "user_id": chunk.user_id,
                            "agent_id": chunk.agent_id,
                            "run_id": chunk.run_id,
                            "seq": seq,
                            "messages": msgspec.to_builtins(chunk.messages, enc_hook=encode_moment),
                            "metadata": chunk.metadata,
                            "idempotency_key": key,
                            "body_hash": request.hashes[i],
                            "writer": chunk.writer,
                            "trace_parent": request.trace_parent,
                            "backfill": request.backfill,
                        }
                    )
                    plan[i] = Accepted(chunk_id, seq, "queued", chunk.user_id, replayed=False)
                    audit_rows.append(
                        event_row(
                            tenant_id=tenant_id,
                            actor=request.principal.actor,
                            action="chunk.accepted",
                            target_type="chunk",
                            target_id=str(chunk_id),
                            request_id=request.request_id,
                            summary={"user_id": chunk.user_id, "seq": seq},
                        )
                    )
            inserted = await PipelineRepository(session).insert_many(new_rows)
            if len(inserted) != len(new_rows):
                # Another process committed one of these idempotency keys first: answer from its chunk.
                await self._resolve_lost_races(session, plans, inserted)
            await self._answer_repeated_keys(chunks, plans, inserted)
            if any(request.future.done() for request, _ in plans):
                # A request answered 409 just now had chunks written here: none of them may commit.
                raise _Redo
            await AuditRepository(session).insert_many([a for a in audit_rows if _kept(a, inserted)])
        metrics.CHUNKS_ACCEPTED.inc(len(inserted))
        jobs: list[ScriptCall] = []
        for request, plan in plans:
            results = [a for a in plan if a is not None]
            if not request.future.done():
                request.future.set_result(results)
            fresh = [r for r in results if not r.replayed]
            jobs.extend(
                w.job() for w in wake_ups(request.principal.tenant_id, fresh, backfill=request.backfill)
            )
        return jobs

    @staticmethod
    def _plan(
        request: _Request,
        earlier: dict[tuple[uuid.UUID, str], Chunk],
        claimed: dict[tuple[uuid.UUID, str], tuple[uuid.UUID, str]],
    ) -> list[Accepted | None] | None:
        """Per chunk: a replayed answer, or None (to be written). None overall if the request conflicts."""
        tenant_id = request.principal.tenant_id
        plan: list[Accepted | None] = []
        claims: dict[tuple[uuid.UUID, str], tuple[uuid.UUID, str]] = {}
        try:
            for (_chunk, key), digest in zip(request.chunks, request.hashes, strict=True):
                if key is None:
                    plan.append(None)
                    continue
                found = earlier.get((tenant_id, key))
                if found is not None:
                    plan.append(_replay(found, digest))
                elif (tenant_id, key) in claimed or (tenant_id, key) in claims:
                    chunk_id, claimed_hash = claimed.get((tenant_id, key)) or claims[(tenant_id, key)]
                    if claimed_hash != digest:
                        raise _conflict(chunk_id)
                    plan.append(_Pending(chunk_id))
                else:
                    claims[(tenant_id, key)] = (uuid.uuid4(), digest)
                    plan.append(None)
        except ConflictError as exc:
            _fail_request(request, exc)
            return None
        claimed.update(claims)
        return plan

    @staticmethod
    async def _answer_repeated_keys(
        chunks: ChunkRepository, plans: list[tuple[_Request, list[Accepted | None]]], inserted: set[uuid.UUID]
    ) -> None:
        """The same key twice in one batch: the later copies answer as replays of whatever the first
        became (written here, or taken by another process first), looked up only after the insert."""
        written = {a.chunk_id: a for _, plan in plans for a in plan if a is not None and not a.replayed}
        for request, plan in plans:
            for i, accepted in enumerate(plan):
                if not isinstance(accepted, _Pending):
                    continue
                if (first := written.get(accepted.chunk_id)) is not None and first.chunk_id in inserted:
                    plan[i] = Accepted(first.chunk_id, first.seq, first.status, first.user_id, replayed=True)
                    continue
                key = request.chunks[i][1]
                assert key is not None
                tenant_id = request.principal.tenant_id
                winner = (await chunks.by_idempotency_keys([(tenant_id, key)]))[(tenant_id, key)]
                try:
                    plan[i] = _replay(winner, request.hashes[i])
                except ConflictError as exc:
                    _fail_request(request, exc)

    async def _resolve_lost_races(
        self,
        session: AsyncSession,
        plans: list[tuple[_Request, list[Accepted | None]]],
        inserted: set[uuid.UUID],
    ) -> None:
        chunks = ChunkRepository(session)
        for request, plan in plans:
            for i, accepted in enumerate(plan):
                if accepted is None or accepted.replayed or accepted.chunk_id in inserted:
                    continue
                key = request.chunks[i][1]
                assert key is not None
                winner = (await chunks.by_idempotency_keys([(request.principal.tenant_id, key)]))[
                    (request.principal.tenant_id, key)
                ]
                try:
                    plan[i] = _replay(winner, request.hashes[i])
                except ConflictError as exc:
                    # The other process's body differs: the request fails whole (`_Redo` in `_write`).
                    _fail_request(request, exc)


def _traced(batch: list[_Request], started_ns: int, committed_ns: int, *, jobs: int) -> None:
    """The group commit and the enqueue, one piece of work for many requests, recorded in each
    request's trace once done (a span has one parent)."""
    chunks = sum(len(r.chunks) for r in batch)
    for request in batch:
        if request.trace is None:
            continue
        shared = {"memstore.batch.requests": len(batch), "memstore.batch.chunks": chunks}
        tracing.record(
            "ingest group commit", started_ns, shared, ended_ns=committed_ns, context=request.trace
        )
        tracing.record(
            "ingest enqueue", committed_ns, {**shared, "memstore.jobs": jobs}, context=request.trace
        )


class _Pending(Accepted):
    """A chunk that repeats a key claimed earlier in the same batch; filled in once that one is written."""

    def __init__(self, chunk_id: uuid.UUID) -> None:
        super().__init__(chunk_id, 0, "queued", "", replayed=True)


@dataclass
class _TenantCounts:
    """A tenant's unfinished chunks, as last counted by this API process, plus those it admitted since.

    The count costs up to the tenant cap's worth of index entries (and the heap visits behind the
    entries of chunks applied since the last vacuum): far too much for every batch under a backlog,
    and too slow for any batch to wait on. So a batch waits for a tenant's count only the first time
    the process sees the tenant; after that it uses the last count, and a count older than
    `fresh_for_s` is taken again in the background, off every request's path. Chunks admitted since are
    added and those applied since are not taken off, so the figure errs high: the cap only gets
    stricter. Other API processes' admissions show at the next count (the overshoot the module
    docstring allows). A tenant far below its cap (under a quarter of it) is counted every
    `far_below_for_s` instead: its count walks the most entries for the least use, and three quarters
    of the cap (150,000 chunks by default) take more than those seconds to fill at any rate one
    deployment ingests."""

    fresh_for_s: float = 1.0
    far_below_for_s: float = 5.0
    counts: dict[uuid.UUID, tuple[float, int]] = field(default_factory=dict)
    _refresh: asyncio.Task[None] | None = None

    def known(self, tenant_id: uuid.UUID) -> int | None:
        seen = self.counts.get(tenant_id)
        return None if seen is None else seen[1]

    def stale(self, tenant_ids: Iterable[uuid.UUID], cap: int) -> list[uuid.UUID]:
        now = time.monotonic()
        stale = []
        for tenant_id in tenant_ids:
            if (seen := self.counts.get(tenant_id)) is not None:
                fresh_for_s = self.far_below_for_s if seen[1] < cap / 4 else self.fresh_for_s
                if now - seen[0] >= fresh_for_s:
                    stale.append(tenant_id)
        return sorted(stale)

    def seen(self, tenant_id: uuid.UUID, count: int) -> None:
        self.counts[tenant_id] = (time.monotonic(), count)

    def add(self, tenant_id: uuid.UUID, admitted: int) -> None:
        if (seen := self.counts.get(tenant_id)) is not None:
            self.counts[tenant_id] = (seen[0], seen[1] + admitted)

    def refresh_soon(
        self, tenant_ids: list[uuid.UUID], sessionmaker: async_sessionmaker[AsyncSession], cap: int
    ) -> None:
        """Count these tenants again in a task of their own, unless a count is already under way."""
        if not tenant_ids or (self._refresh is not None and not self._refresh.done()):
            return
        self._refresh = asyncio.create_task(
            self._count(tenant_ids, sessionmaker, cap), name="ingest-tenant-count"
        )

    async def _count(
        self, tenant_ids: list[uuid.UUID], sessionmaker: async_sessionmaker[AsyncSession], cap: int
    ) -> None:
        for tenant_id in tenant_ids:
            started = time.monotonic()
            before = self.counts.get(tenant_id, (0.0, 0))[1]
            try:
                with tenant_scope([tenant_id]):
                    async with sessionmaker() as session:
                        _, counted = await ChunkRepository(session).unfinished([], 0, [tenant_id], cap)
            except Exception:  # the old figure stands; the next batch asks again
                log.warning("ingest.tenant_count_failed", tenant_id=str(tenant_id), exc_info=True)
                return
            # What this process admitted while the count ran may or may not be in it: kept, erring high.
            admitted_meanwhile = self.counts.get(tenant_id, (0.0, 0))[1] - before
            self.counts[tenant_id] = (started, counted[tenant_id] + max(0, admitted_meanwhile))

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh


@dataclass
class _Caps:
    """How many chunks a scope and a tenant may have waiting to be applied (0: no cap)."""

    per_scope: int
    per_tenant: int
    tenants: _TenantCounts = field(default_factory=_TenantCounts)  # shared by the batches
    queued: dict[tuple[uuid.UUID, str], int] = field(default_factory=dict)
    queued_by_tenant: dict[uuid.UUID, int] = field(default_factory=dict)

    async def counted(
        self,
        chunks: ChunkRepository,
        batch: Sequence[_Request],
        sessionmaker: async_sessionmaker[AsyncSession],
    ) -> _Caps:
        """These caps with what the batch's scopes and tenants have waiting now: the scopes counted in
        the batch's transaction (one statement), a tenant only the first time it is seen."""
        counted = _Caps(self.per_scope, self.per_tenant, self.tenants)
        if self.per_scope or self.per_tenant:
            scopes = sorted({(r.principal.tenant_id, c.user_id) for r in batch for c, _ in r.chunks})
            tenants = {t for t, _ in scopes}
            unseen = sorted(t for t in tenants if self.per_tenant and self.tenants.known(t) is None)
            adding = sum(len(r.chunks) for r in batch)
            counted.queued, read = await chunks.unfinished(
                scopes, self.per_scope, unseen, self.per_tenant, adding=adding
            )
            for tenant_id, count in read.items():
                self.tenants.seen(tenant_id, count)
            if self.per_tenant:
                self.tenants.refresh_soon(
                    self.tenants.stale(tenants, self.per_tenant), sessionmaker, self.per_tenant
                )
            counted.queued_by_tenant = {t: self.tenants.known(t) or 0 for t in tenants}
        return counted

    def admit(
        self,
        request: _Request,
        plan: Sequence[Accepted | None],
        claimed: dict[tuple[uuid.UUID, str], tuple[uuid.UUID, str]],
    ) -> bool:
        """Whether the request's new chunks fit under both caps; if not it is answered 429, none of its
        chunks is written (its replays included: a request is atomic) and its keys are given back."""
        if not (self.per_scope or self.per_tenant):
            return True
        tenant_id = request.principal.tenant_id
        pairs = zip(request.chunks, plan, strict=True)
        new = collections.Counter(chunk.user_id for (chunk, _), accepted in pairs if accepted is None)
        over_scope = [
            user
            for user, n in new.items()
            if self.per_scope and self.queued[(tenant_id, user)] + n > self.per_scope
        ]
        total = sum(new.values())
        over_tenant = self.per_tenant and self.queued_by_tenant[tenant_id] + total > self.per_tenant
        if over_scope or over_tenant:
            metrics.INGEST_REJECTED.labels("queue_full").inc()
            _unclaim(request, plan, claimed)
            where = f"user {over_scope[0]!r}" if over_scope else "this tenant"
            cap = self.per_scope if over_scope else self.per_tenant
            _fail_request(
                request,
                QueueFull(
                    f"Too many chunks of {where} wait to be applied (at most {cap}); retry later.",
                    details={"user_id": over_scope[0]} if over_scope else {"scope": "tenant"},
                ),
            )
            return False
        for user, n in new.items():
            self.queued[(tenant_id, user)] += n
        self.queued_by_tenant[tenant_id] += total
        self.tenants.add(tenant_id, total)
        return True


def _unclaim(
    request: _Request,
    plan: Sequence[Accepted | None],
    claimed: dict[tuple[uuid.UUID, str], tuple[uuid.UUID, str]],
) -> None:
    """Give back the idempotency keys a refused request claimed in this batch."""
    for (_, key), accepted in zip(request.chunks, plan, strict=True):
        if accepted is None and key is not None:
            claimed.pop((request.principal.tenant_id, key), None)


def _fail_request(request: _Request, exc: BaseException) -> None:
    """Answer a request with an error, once (a retried batch or a cancelled handler may come first)."""
    if not request.future.done():
        request.future.set_exception(exc)


def _shutting_down() -> ApiError:
    return Unavailable("The server is shutting down; retry.")


def _kept(audit_row: dict[str, object], inserted: set[uuid.UUID]) -> bool:
    return uuid.UUID(str(audit_row["target_id"])) in inserted


def _conflict(chunk_id: uuid.UUID) -> ConflictError:
    return IdempotencyConflict(
        "This Idempotency-Key was used with a different body.",
        details={"chunk_id": str(chunk_id)},
    )


def _replay(earlier: Chunk, digest: str) -> Accepted:
    if earlier.body_hash != digest:
        raise _conflict(earlier.id)
    return Accepted(earlier.id, earlier.seq, earlier.status, earlier.user_id, replayed=True)
