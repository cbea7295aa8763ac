"""Processing a scope: its chunks, one at a time in `seq` order, each applied exactly once.

Ordering and exclusivity come from a Postgres session-level advisory lock per scope (tenant +
user_id), held for as long as a worker drains the scope (see `locks`); it holds across worker
processes and machines and is released by Postgres itself if the worker dies. Exactly-once effect
comes from applying a chunk in one transaction that also marks it `applied` (a redelivered chunk
finds it applied and does nothing), backed by a unique index on the writer changeset per chunk.

A claim counts an attempt, and only a writer's failures, or the chunk's own (data Postgres cannot
store, a time off the calendar), may use attempts up: whatever goes wrong with a chunk ends recorded
on that chunk, never as a job that dies and leaves it `processing`. A fault that is not the chunk's —
the embedder down, a writer this worker does not know, Postgres unreachable, the worker stopping —
gives the claim back uncounted (fenced by the claim, see `PipelineRepository.give_back`); the chunk
then waits out a backoff with the error on it, for as long as the fault lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.config import Settings
from app.db.tenancy import tenant_scope
from app.domain.audit.services import record_event
from app.domain.memories.services import ApplyLimits, ApplyRequest, Provenance, Shown, embed_ops
from app.domain.pipeline.applier import Applier, ApplyInterruptedError, Result
from app.domain.pipeline.locks import Lease, ScopeLocks, scope_lock_key
from app.domain.pipeline.repositories import ChunkRow, Claim, PipelineRepository, TenantOptions
from app.domain.search.services import EmbedderMismatchError, Searcher
from app.domain.shadows.services import LiveFeeder
from app.embeddings import Embedder
from app.embeddings.base import related_floor
from app.embeddings.openai import EmbeddingError
from app.lib import metrics
from app.lib.errors import is_db_outage
from app.writers.base import (
    Candidate,
    CandidateQuery,
    Message,
    OpKind,
    Writer,
    WriteRequest,
    WriterError,
    WriteResult,
    select_candidates,
    storable_text,
    strictest,
)
from app.writers.registry import UnknownWriterError, WriterRegistry

log = structlog.get_logger(__name__)

_MAX_ERROR_CHARS = 2_000
_TENANT_CACHE_S = 30.0

# Faults outside Postgres that are not the chunk's: its claim is given back, its attempt not counted.
_OUTAGES = (EmbeddingError, EmbedderMismatchError, UnknownWriterError)


@dataclass
class PipelineDeps:
    """What a worker process shares between its jobs."""

    engine: AsyncEngine
    settings: Settings
    writers: WriterRegistry
    embedder: Embedder
    worker_name: str
    locks: ScopeLocks = field(init=False)
    applier: Applier = field(init=False)
    # The same pool without transactions: a chunk's claim and the reads that prepare its writer call
    # are single statements that need no BEGIN / COMMIT round trips around them.
    reads: AsyncEngine = field(init=False)
    # Tenants whose options are cached, at most: the least recently read are dropped first.
    tenant_cache_size: int = 4096
    # tenant -> (its options, when read), oldest read first; options change rarely and may lag a little.
    _tenant_options: dict[uuid.UUID, tuple[TenantOptions, float]] = field(default_factory=dict)
    # Shadow banks drained at once by this process, in slots of their own (`MEMSTORE_SHADOW_MAX_JOBS`).
    shadow_slots: asyncio.Semaphore = field(init=False)
    feeder: LiveFeeder = field(init=False)
    bank_slots: dict[uuid.UUID, asyncio.Semaphore] = field(default_factory=dict)
    _searcher: Searcher | None = None
    # Since when this process's chunks meet faults outside Postgres (monotonic clock); None once a
    # chunk gets through again. The backoff of such a fault grows with it (`outage_backoff`).
    _outage_since: float | None = None

    @property
    def searcher(self) -> Searcher:
        """Candidate retrieval: the search clients use, with this process's embedder."""
        if self._searcher is None:
            self._searcher = Searcher(self.settings, self.embedder)
        return self._searcher

    def __post_init__(self) -> None:
        self.locks = ScopeLocks(self.engine)
        self.applier = Applier(self.engine, self.actor)
        self.reads = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.shadow_slots = asyncio.Semaphore(self.settings.shadow_max_jobs)
        self.feeder = LiveFeeder(self.engine)

    async def aclose(self) -> None:
        """Finish the apply in progress, release the scope locks, close the writer and embedder clients."""
        await self.applier.aclose()
        await self.locks.aclose()
        await self.writers.aclose()
        await self.embedder.aclose()

    @property
    def actor(self) -> str:
        return f"worker:{self.worker_name}"

    @property
    def limits(self) -> ApplyLimits:
        return ApplyLimits(
            max_ops=self.settings.writer_max_ops,
            max_chars=self.settings.max_memory_chars,
            duplicate_threshold=self.settings.duplicate_threshold,
        )

    def limits_for(self, options: TenantOptions, writer: str) -> ApplyLimits:
        """The limits of a chunk of this tenant by this writer: the destructive-ops policy is the
        stricter of the tenant's (else the deployment's) and the writer's own (writers file). A shadow
        bank applies everything: what its writer would destroy is what the comparison reports."""
        if options.shadow_of is not None:
            return self.limits
        own = options.destructive_ops or self.settings.destructive_ops
        policy = strictest(own, self.writers.policy(writer))
        kinds = options.destructive_kinds or tuple(self.settings.destructive_kinds)
        return replace(self.limits, destructive=policy, destructive_kinds=frozenset(OpKind(k) for k in kinds))

    async def tenant_options(self, session: AsyncSession, tenant_id: uuid.UUID) -> TenantOptions:
        """The tenant's options (`PipelineRepository.tenant_options`), cached for a short while."""
        cached = self._tenant_options.get(tenant_id)
        if cached is not None and time.monotonic() - cached[1] < _TENANT_CACHE_S:
            return cached[0]
        options = await PipelineRepository(session).tenant_options(tenant_id)
        self._tenant_options.pop(tenant_id, None)  # re-inserted last: the most recently read
        self._tenant_options[tenant_id] = (options, time.monotonic())
        while len(self._tenant_options) > self.tenant_cache_size:
            del self._tenant_options[next(iter(self._tenant_options))]
        return options

    async def tenant_writer(self, session: AsyncSession, tenant_id: uuid.UUID) -> str | None:
        """The tenant's default writer name (tenant setting `writer`)."""
        return (await self.tenant_options(session, tenant_id)).writer

    def shadow_writers(self, options: TenantOptions) -> tuple[str, ...]:
        """The writers that shadow a tenant: its own setting, else the deployment's; a bank has none."""
        if options.shadow_of is not None:
            return ()
        if options.shadow_writers is not None:
            return options.shadow_writers
        return tuple(self.settings.shadow_writers)

    def outage_backoff(self) -> timedelta:
        """The delay before a chunk that met a fault outside Postgres is tried again."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        return outage_backoff(self.settings, now - self._outage_since)

    def outage_over(self) -> None:
        self._outage_since = None


@dataclass
class ScopeRun:
    """What one `process_scope` call did."""

    applied: int = 0
    failed: int = 0
    retried: int = 0
    skipped: int = 0
    locked_elsewhere: bool = False
    retry_at: datetime | None = None  # the scope waits for a chunk's backoff until then
    lost_lock: bool = False  # the scope lock was found gone mid-run
    no_shadow_slot: bool = False  # a shadow bank's scope put off: the process drains enough of them
    fed: list[uuid.UUID] = field(default_factory=list)  # shadow banks that got the scope's new chunks
    # The seq of the chunk claimed last under the current lease: the next claim reads on from there
    # (`PipelineRepository.claim_next`).
    claimed_seq: int | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "failed": self.failed,
            "retried": self.retried,
            "skipped": self.skipped,
            "locked_elsewhere": self.locked_elsewhere,
            "lost_lock": self.lost_lock,
            "retry_at": self.retry_at.isoformat() if self.retry_at else None,
            "no_shadow_slot": self.no_shadow_slot,
            "fed": [str(b) for b in self.fed],
        }


def backoff(settings: Settings, attempt: int) -> timedelta:
    """Exponential backoff with +-20 % jitter, so retries of many scopes do not align."""
    delay = min(settings.retry_backoff_max_s, settings.retry_backoff_s * 2 ** max(0, attempt - 1))
    return _jittered(delay)


def outage_backoff(settings: Settings, outage_s: float) -> timedelta:
    """While a dependency has been down `outage_s` seconds: about as long again, so the retries of a
    long outage thin out exponentially as `backoff`'s do, within the same bounds. Counting no attempts,
    they go on until it is back."""
    return _jittered(min(settings.retry_backoff_max_s, max(settings.retry_backoff_s, outage_s)))


def _jittered(delay_s: float) -> timedelta:
    return timedelta(seconds=delay_s * random.uniform(0.8, 1.2))  # noqa: S311  (jitter, not security)


async def take_up_scope(deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str) -> ScopeRun:
    """A job's work on a scope. A tenant's scope first feeds its new chunks to the tenant's live shadow
    banks (`run.fed`: the caller wakes them), then is drained. A shadow bank's scope is drained in one
    of the process's shadow slots, or put off for a moment when they are all taken, so shadows never
    hold a slot the tenants' own scopes need.

    The work reads and writes as the scope's tenant (with its shadow banks) and no other."""
    with tenant_scope([tenant_id]):
        return await _take_up_scope(deps, tenant_id, user_id)


async def _take_up_scope(deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str) -> ScopeRun:
    async with AsyncSession(deps.reads) as session:
        options = await deps.tenant_options(session, tenant_id)
    if options.shadow_of is not None:
        # No bank takes more than half the slots, so a slow shadow cannot starve the others either.
        own = deps.bank_slots.setdefault(
            tenant_id, asyncio.Semaphore(max(1, deps.settings.shadow_max_jobs // 2))
        )
        if deps.shadow_slots.locked() or own.locked():
            return ScopeRun(no_shadow_slot=True, retry_at=datetime.now(UTC) + _jittered(1.0))
        async with deps.shadow_slots, own:
            return await process_scope(deps, tenant_id, user_id)
    fed: list[uuid.UUID] = []
    if writers := deps.shadow_writers(options):
        try:
            fed = [
                bank.id
                for bank in await deps.feeder.feed_scope(tenant_id, user_id, writers, options.shadow_since)
            ]
        except Exception as exc:
            if is_db_outage(exc):
                raise
            log.warning("shadow.feed_failed", error=_describe(exc), exc_info=True)
    run = await process_scope(deps, tenant_id, user_id)
    run.fed = fed
    return run


async def process_scope(deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str) -> ScopeRun:
    """Drain a scope's ready chunks in order, unless another worker is already doing so (as the scope's
    tenant: `app.db.tenancy`)."""
    with tenant_scope([tenant_id]):
        return await _drain(deps, tenant_id, user_id)


async def _drain(deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str) -> ScopeRun:
    run = ScopeRun()
    key = scope_lock_key(tenant_id, user_id)
    while True:
        lease = await deps.locks.try_acquire(key)
        if lease is None:
            run.locked_elsewhere = True
            return run
        run.claimed_seq = None
        try:
            while deps.locks.holds(lease) and await _process_next(deps, tenant_id, user_id, run, lease):
                pass
        finally:
            await deps.locks.release(lease)
        if run.lost_lock:
            # Its connection died unnoticed: replace it, and come back to the scope in a moment.
            await deps.locks.lost(lease)
            run.retry_at = datetime.now(UTC) + timedelta(seconds=1)
        if run.retry_at is not None:
            return run
        # A wake-up that arrived while we held the lock gave up on it; make sure its chunk is not left
        # behind by looking again now that the lock is released.
        async with AsyncSession(deps.reads) as session:
            if not await PipelineRepository(session).has_ready(tenant_id, user_id):
                return run


async def _process_next(
    deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str, run: ScopeRun, lease: Lease
) -> bool:
    """Handle the scope's next chunk; False when there is nothing (ready) left.

    The claim (attempts + 1, so a chunk that kills its worker is eventually failed) and the reads for
    the writer's view are single statements outside any transaction, on one connection taken from the
    pool once; the result is applied, and the chunk marked applied, in one transaction shared with
    other scopes' results (`Applier`). Nothing is held open while the writer thinks or the embedder
    answers.
    """
    view: _View | None = None
    failure: BaseException | None = None
    async with AsyncSession(deps.reads, expire_on_commit=False) as session:
        claim = await PipelineRepository(session).claim_next(
            tenant_id, user_id, deps.settings.max_attempts, lease, from_seq=run.claimed_seq
        )
        if claim.claimed is not None:
            run.claimed_seq = claim.claimed.seq
            try:
                view = await _writer_view(session, deps, claim.claimed)
            except BaseException as exc:  # noqa: BLE001  (handled below, the connection back in the pool)
                failure = exc
    chunk = claim.claimed
    if chunk is None:  # the common case is an empty scope
        return await _nothing_claimed(deps, claim, run)
    try:
        if failure is not None:
            raise failure
        assert view is not None
        return await _process_claimed(deps, chunk, run, view)
    except asyncio.CancelledError:  # the worker is stopping: this attempt was not made
        await _give_back(deps, chunk)
        raise
    except Exception as exc:
        if is_db_outage(exc) or isinstance(exc, ApplyInterruptedError):
            await _give_back(deps, chunk)  # if Postgres answers; the job is retried (workers/jobs.py)
            raise
        if isinstance(exc, _OUTAGES) and getattr(exc, "transient", True):
            return await _outage(deps, chunk, run, exc)
        # Anything else is this chunk's failed attempt: a poison chunk fails, alone, after its attempts.
        log.exception("chunk.error", chunk_id=str(chunk.id), seq=chunk.seq)
        return await _failed_attempt(deps, chunk, run, _describe(exc), writer_name=chunk.writer or "default")


@dataclass(frozen=True)
class _View:
    """A claimed chunk's writer, and what it is shown (its request, and the memories under local ids)."""

    options: TenantOptions
    writer: Writer
    request: WriteRequest
    shown: dict[int, Shown]


async def _writer_view(session: AsyncSession, deps: PipelineDeps, chunk: ChunkRow) -> _View:
    options = await deps.tenant_options(session, chunk.tenant_id)
    writer = deps.writers.get(chunk.writer, options.writer)
    # Writers plugged in by import path may predate `context_messages`; they get the default.
    request, shown = await _build_request(
        session,
        deps,
        chunk,
        getattr(writer, "context_messages", None),
        initial_candidates=getattr(writer, "initial_candidates", True),
    )
    return _View(options, writer, request, shown)


async def _process_claimed(deps: PipelineDeps, chunk: ChunkRow, run: ScopeRun, view: _View) -> bool:
    """The writer's call for a claimed chunk, and its result applied or its failure recorded."""
    settings = deps.settings
    options, writer, request, shown = view.options, view.writer, view.request, view.shown

    log.debug("chunk.writing", chunk_id=str(chunk.id), seq=chunk.seq, writer=writer.name)
    started = time.perf_counter()
    result, error, raw, attempt_limit, usage = await _call_writer(writer, request, settings.writer_timeout_s)
    metrics.WRITER_LATENCY.labels(writer.name, "error" if error else "ok").observe(
        time.perf_counter() - started
    )
    if error is not None:
        return await _failed_attempt(
            deps, chunk, run, error, raw, attempt_limit, writer_name=writer.name, usage=usage
        )

    assert result is not None
    apply_request = ApplyRequest(
        tenant_id=chunk.tenant_id,
        user_id=chunk.user_id,
        ops=result.ops,
        shown=shown,
        provenance=Provenance(
            actor=deps.actor,
            kind="writer",
            writer=writer.name,
            model=writer.model,
            profile=writer.profile,
            prompt_hash=result.prompt_hash,
            chunk_id=chunk.id,
        ),
        agent_id=chunk.agent_id,
        run_id=chunk.run_id,
        memory_at=_memory_at(chunk),
        raw_output=result.raw_output,
        usage=result.usage,
        guards=result.guards,
        limits=deps.limits_for(options, writer.name),
    )
    # Embedded here, before the apply's transaction locks anything.
    vectors = await embed_ops(deps.embedder, [apply_request])
    started = time.perf_counter()
    outcome = await deps.applier.apply(Result(chunk, apply_request, vectors, len(request.context)))
    deps.outage_over()
    if outcome is None:  # applied meanwhile by an earlier delivery
        run.skipped += 1
        return True
    metrics.APPLY_LATENCY.observe(time.perf_counter() - started)
    metrics.CHUNKS_FINISHED.labels("applied", writer.name).inc()
    for guard in outcome.guards:
        metrics.GUARDS_FIRED.labels(guard["guard"]).inc()
    log.info(
        "chunk.applied",
        chunk_id=str(chunk.id),
        seq=chunk.seq,
        ops=outcome.applied,
        guards=len(outcome.guards),
        held=len(outcome.reviews),
    )
    run.applied += 1
    return True


async def _failed_attempt(
    deps: PipelineDeps,
    chunk: ChunkRow,
    run: ScopeRun,
    error: str,
    raw: str | None = None,
    attempt_limit: int | None = None,
    *,
    writer_name: str,
    usage: dict[str, Any] | None = None,
) -> bool:
    """Record the claimed attempt as failed: retried after a backoff, or failed for good once the
    chunk has had its attempts (True: go on with the scope's next chunk)."""
    settings = deps.settings
    attempt = chunk.attempts
    final = attempt >= min(settings.max_attempts, attempt_limit or settings.max_attempts)
    retry_at = None if final else datetime.now(UTC) + backoff(settings, attempt)
    await _fail(deps, chunk, error, raw, final=final, attempt=attempt, retry_at=retry_at, usage=usage)
    if final:
        metrics.CHUNKS_FINISHED.labels("failed", writer_name).inc()
        run.failed += 1
        return True
    run.retried += 1
    run.retry_at = retry_at
    return False


async def _outage(deps: PipelineDeps, chunk: ChunkRow, run: ScopeRun, exc: Exception) -> bool:
    """A fault that is not the chunk's: the claim goes back uncounted, and the chunk waits with the
    error on it (`GET /v1/chunks/{id}` shows it) until the backoff has passed."""
    error = _describe(exc)
    retry_at = datetime.now(UTC) + deps.outage_backoff()
    async with AsyncSession(deps.engine) as session, session.begin():
        await PipelineRepository(session).give_back(
            chunk, error=storable_text(error[:_MAX_ERROR_CHARS]), available_at=retry_at
        )
    log.warning("chunk.outage", chunk_id=str(chunk.id), seq=chunk.seq, error=error, at=retry_at.isoformat())
    run.retried += 1
    run.retry_at = retry_at
    return False


async def _give_back(deps: PipelineDeps, chunk: ChunkRow) -> None:
    """Return the claim's attempt, if Postgres answers; shielded, so a job cancelled again meanwhile
    does not stop it half-way."""

    async def give_back() -> None:
        async with AsyncSession(deps.engine) as session, session.begin():
            await PipelineRepository(session).give_back(chunk)

    try:
        await asyncio.shield(give_back())
    except Exception as exc:  # noqa: BLE001  (the fault being handled is what the caller reports)
        log.warning("chunk.give_back_failed", chunk_id=str(chunk.id), error=type(exc).__name__)


def _describe(exc: BaseException) -> str:
    """An error as recorded on its chunk: a database error by the driver's exception and message
    (SQLAlchemy's text repeats the statement and its parameters)."""
    cause = getattr(exc, "orig", None) or exc
    driver = cause.__cause__ if isinstance(cause.__cause__, Exception) else cause  # asyncpg's, by name
    return f"{type(driver).__name__}: {cause}"


async def _nothing_claimed(deps: PipelineDeps, claim: Claim, run: ScopeRun) -> bool:
    """Why the claim took nothing: the lock is gone, the scope is empty, its next chunk has used up its
    attempts (failed now: True, go on), or it is backing off (`run.retry_at`)."""
    settings = deps.settings
    pending = claim.next
    if not claim.lock_held:
        run.lost_lock = True
        return False
    if pending is None:
        return False
    if pending.attempts >= settings.max_attempts:
        # Every attempt so far ended with the worker dying mid-way (a poison chunk): give up on it.
        await _fail(deps, pending, f"gave up after {pending.attempts} attempts", None, final=True)
        metrics.CHUNKS_FINISHED.labels("failed", pending.writer or "default").inc()
        run.failed += 1
        return True
    # Backing off; or, if it was due, changed under the claim (a concurrent retry or purge): look again
    # in a moment.
    now = datetime.now(UTC)
    run.retry_at = pending.available_at if pending.available_at > now else now + timedelta(seconds=1)
    return False


_WriterOutcome = (
    tuple[WriteResult, None, None, None, None]
    | tuple[None, str, str | None, int | None, dict[str, Any] | None]
)


async def _call_writer(writer: Writer, request: WriteRequest, timeout_s: float) -> _WriterOutcome:
    """The writer's result, or why it failed, what it said (for inspection), how many attempts such a
    failure deserves and the calls' token usage. A fault outside Postgres met by the writer's
    searches is raised as is."""
    try:
        async with asyncio.timeout(timeout_s):
            return await writer.write(request), None, None, None, None
    except _OUTAGES:
        raise  # the writer's own search (`request.search`) met a fault that is neither its nor the chunk's
    except WriterError as exc:
        if isinstance(exc.__cause__, _OUTAGES):
            raise exc.__cause__ from exc
        usage = getattr(exc, "usage", None)
        return None, f"writer error: {exc}", exc.raw_output, exc.attempt_limit, usage
    except TimeoutError:
        return None, f"writer timed out after {timeout_s:g} s", None, None, None
    except Exception as exc:  # noqa: BLE001  (any writer bug is a failed attempt, not a dead worker)
        return None, f"writer raised {type(exc).__name__}: {exc}", None, None, None


async def _fail(
    deps: PipelineDeps,
    chunk: ChunkRow,
    error: str,
    raw: str | None,
    *,
    final: bool,
    attempt: int | None = None,
    retry_at: datetime | None = None,
    usage: dict[str, Any] | None = None,
) -> None:
    """Record a failed attempt (and, if final, its audit event) in a transaction of its own."""
    attempts = attempt if attempt is not None else chunk.attempts
    async with AsyncSession(deps.engine) as session, session.begin():
        recorded = await PipelineRepository(session).mark_failed_attempt(
            chunk.id,
            error=storable_text(error[:_MAX_ERROR_CHARS]),  # a plugin's message may hold a NUL
            raw_output=None if raw is None else storable_text(raw),
            final=final,
            available_at=retry_at,
            attempt=attempt,
            usage=usage,
        )
        if recorded and final:
            await record_event(
                session,
                tenant_id=chunk.tenant_id,
                actor=deps.actor,
                action="chunk.failed",
                target_type="chunk",
                target_id=str(chunk.id),
                summary={"seq": chunk.seq, "attempts": attempts, "error": storable_text(error[:200])},
            )
    if not recorded:
        return
    if final:
        log.warning("chunk.failed", chunk_id=str(chunk.id), seq=chunk.seq, attempts=attempts, error=error)
    else:
        log.info(
            "chunk.retry_scheduled",
            chunk_id=str(chunk.id),
            seq=chunk.seq,
            attempts=attempts,
            error=error,
            at=retry_at.isoformat() if retry_at else None,
        )


def _memory_at(chunk: ChunkRow) -> datetime:
    stamps = [m.get("created_at") for m in chunk.messages if m.get("created_at")]
    if stamps:
        with contextlib.suppress(ValueError):
            return max(datetime.fromisoformat(str(s)) for s in stamps)
    return chunk.received_at


def _message(raw: dict[str, Any]) -> Message:
    created = raw.get("created_at")
    return Message(
        role=str(raw["role"]),
        content=str(raw["content"]),
        name=raw.get("name"),
        created_at=datetime.fromisoformat(created) if isinstance(created, str) else None,
    )


async def _build_request(
    session: AsyncSession,
    deps: PipelineDeps,
    chunk: ChunkRow,
    context_messages: int | None,
    *,
    initial_candidates: bool = True,
) -> tuple[WriteRequest, dict[int, Shown]]:
    """The writer's view: new messages, recent context, and related memories under local ids."""
    settings = deps.settings
    messages = tuple(_message(m) for m in chunk.messages)
    earlier = await PipelineRepository(session).earlier_messages(
        chunk.tenant_id,
        chunk.user_id,
        chunk.seq,
        settings.context_messages if context_messages is None else context_messages,
    )
    shown: dict[int, Shown] = {}
    candidates: list[Candidate] = []
    by_memory: dict[uuid.UUID, int] = {}

    async def search(
        session: AsyncSession, queries: list[str], query: CandidateQuery | None
    ) -> tuple[Candidate, ...]:
        query = query or CandidateQuery(per_text=settings.candidate_limit)
        if query.min_score is not None:  # the protocol's floor, on this embedder's scale
            query = replace(query, min_score=related_floor(deps.embedder.name, query.min_score))
        # The same search clients use (exact over the scope's active memories, vector ranking).
        ranked = await deps.searcher.writer_candidates(
            session, chunk.tenant_id, chunk.user_id, queries, query.per_text
        )
        hits = {hit.id: hit for found in ranked for hit in found}
        picked = select_candidates([[(hit.id, hit.score) for hit in found] for found in ranked], query)
        for memory_id in picked:  # only what is shown gets a local id (the unknown-id guard relies on it)
            if memory_id not in by_memory:
                memory = hits[memory_id]
                local_id = len(shown)
                by_memory[memory_id] = local_id
                shown[local_id] = Shown(memory.id, memory.version)
                candidates.append(
                    Candidate(
                        local_id,
                        memory.content,
                        tuple(memory.tags),
                        memory.owner,
                        memory.memory_at,
                        memory.created_at,
                    )
                )
        return tuple(candidates[by_memory[memory_id]] for memory_id in picked)

    async def find(queries: list[str], query: CandidateQuery | None) -> tuple[Candidate, ...]:
        """More candidates, for writers that search after extracting; local ids stay stable."""
        async with AsyncSession(deps.reads, expire_on_commit=False) as search_session:
            return await search(search_session, queries, query)

    user_text = "\n".join(m.content for m in messages if m.role == "user") or "\n".join(
        m.content for m in messages
    )
    initial = await search(session, [user_text], None) if initial_candidates else ()
    request = WriteRequest(
        user_id=chunk.user_id,
        agent_id=chunk.agent_id,
        run_id=chunk.run_id,
        messages=messages,
        context=tuple(_message(m) for m in earlier),
        candidates=initial,
        memory_at=_memory_at(chunk),
        now=datetime.now(UTC),
        search=find,
    )
    return request, shown


async def find_stranded_scopes(engine: AsyncEngine, min_age_s: float) -> list[tuple[uuid.UUID, str]]:
    """Scopes whose unfinished chunks nobody has touched for `min_age_s` (lost or never-sent jobs)."""
    async with AsyncSession(engine) as session:
        return list(await PipelineRepository(session).stranded_scopes(min_age_s))
