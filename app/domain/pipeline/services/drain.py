"""Draining a scope: its ready chunks one at a time in `seq` order, each claimed, written and applied
(or its failure recorded), under the scope's lock (see the package's docstring for the invariants).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.tenancy import tenant_scope
from app.domain.memories import expiry
from app.domain.memories.services import ApplyOutcome, ApplyRequest, Provenance, embed_ops
from app.domain.pipeline.applier import ApplyInterruptedError, Result
from app.domain.pipeline.locks import Lease, scope_lock_key
from app.domain.pipeline.repositories import ChunkRow, Claim, PipelineRepository
from app.domain.pipeline.services.deps import PipelineDeps
from app.domain.pipeline.services.failures import describe, fail, failed_attempt, give_back, outage
from app.domain.pipeline.services.faults import OUTAGES, jittered
from app.domain.pipeline.services.scope_run import ScopeRun
from app.domain.pipeline.services.writer_view import WriterView, memory_at, writer_view
from app.lib import metrics, tracing
from app.lib.errors import is_db_outage
from app.writers.base import Writer, WriteRequest, WriterError, WriteResult

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = structlog.get_logger("app.domain.pipeline.services")


async def take_up_scope(
    deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str, *, until: float | None = None
) -> ScopeRun:
    """A job's work on a scope. A tenant's scope first feeds its new chunks to the tenant's live shadow
    banks (`run.fed`: the caller wakes them), then is drained. A shadow bank's scope is drained in one
    of the process's shadow slots, or put off for a moment when they are all taken, so shadows never
    hold a slot the tenants' own scopes need.
    `until`: a turn's end (`ScopeRun.until`); none: the scope is drained.

    The work reads and writes as the scope's tenant (with its shadow banks) and no other."""
    with tenant_scope([tenant_id]):
        return await _take_up_scope(deps, tenant_id, user_id, until)


async def _take_up_scope(
    deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str, until: float | None
) -> ScopeRun:
    async with AsyncSession(deps.reads) as session:
        options = await deps.tenants.get(session, tenant_id)
    if options.shadow_of is not None:
        # No bank takes more than half the slots, so a slow shadow cannot starve the others either.
        own = deps.bank_slots.setdefault(
            tenant_id, asyncio.Semaphore(max(1, deps.settings.shadow_max_jobs // 2))
        )
        if deps.shadow_slots.locked() or own.locked():
            return ScopeRun(no_shadow_slot=True, retry_at=datetime.now(UTC) + jittered(1.0))
        async with deps.shadow_slots, own:
            return await process_scope(deps, tenant_id, user_id, linked=True, until=until)
    fed: list[uuid.UUID] = []
    if deps.feeder is not None and (writers := deps.policy.shadow_writers(options)):
        try:
            fed = [
                bank.id
                for bank in await deps.feeder.feed_scope(tenant_id, user_id, writers, options.shadow_since)
            ]
        except Exception as exc:
            if is_db_outage(exc):
                raise
            log.warning("shadow.feed_failed", error=describe(exc), exc_info=True)
    run = await process_scope(deps, tenant_id, user_id, until=until)
    run.fed = fed
    return run


async def process_scope(
    deps: PipelineDeps,
    tenant_id: uuid.UUID,
    user_id: str,
    *,
    linked: bool = False,
    until: float | None = None,
) -> ScopeRun:
    """Drain a scope's ready chunks in order, unless another worker is already doing so (as the scope's
    tenant: `app.db.tenancy`). `linked`: the chunks are copies of others (`ScopeRun.linked`); `until`:
    the end of a turn (`ScopeRun.until`)."""
    with tenant_scope([tenant_id]):
        return await _drain(deps, tenant_id, user_id, ScopeRun(linked=linked, until=until))


async def _drain(deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str, run: ScopeRun) -> ScopeRun:
    key = scope_lock_key(tenant_id, user_id)
    while True:
        lease = await deps.locks.try_acquire(key)
        if lease is None:
            run.locked_elsewhere = True
            return run
        run.claimed_seq = None
        turn_over = False
        try:
            while deps.locks.holds(lease) and await _process_next(deps, tenant_id, user_id, run, lease):
                if run.until is not None and time.monotonic() >= run.until:
                    turn_over = True  # the others' turn: the scope is ready again behind them
                    break
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
        if turn_over:
            run.more = True
            return run


async def _process_next(
    deps: PipelineDeps, tenant_id: uuid.UUID, user_id: str, run: ScopeRun, lease: Lease
) -> bool:
    """Handle the scope's next chunk; False when there is nothing (ready) left.

    The claim (attempts + 1, so a chunk that kills its worker is eventually failed) and the reads for
    the writer's view are single statements outside any transaction, on one connection taken from the
    pool once (on a Citus cluster: the claim committed in its own transaction, the reads in another,
    `PipelineDeps.reads`); the result is applied, and the chunk marked applied, in one transaction
    shared with other scopes' results (`Applier`). Nothing is held open while the writer thinks or the
    embedder answers (on a cluster, the reads' transaction while the embedder answers).
    """
    view: WriterView | None = None
    failure: BaseException | None = None
    started_ns = tracing.now_ns()
    claimed: ChunkRow | None = None
    try:
        async with AsyncSession(deps.reads, expire_on_commit=False) as session:
            claim = await PipelineRepository(session).claim_next(
                tenant_id,
                user_id,
                deps.settings.max_attempts,
                lease,
                from_seq=run.claimed_seq,
                distributed=deps.distributed,
            )
            await deps.commit_reads(session)  # the claim holds whatever the reads below meet
            claimed = claim.claimed
            if claimed is not None:
                run.claimed_seq = claimed.seq
                try:
                    view = await writer_view(session, deps, claimed)
                except BaseException as exc:  # noqa: BLE001  (handled below, the connection back in the pool)
                    failure = exc
    except asyncio.CancelledError:  # stopping as the session closed: a claimed chunk's attempt was not made
        if claimed is not None:
            await give_back(deps, claimed)
        raise
    chunk = claim.claimed
    if chunk is None:  # the common case is an empty scope
        return await _nothing_claimed(deps, claim, run)
    with _traced(chunk, run, started_ns) as span:
        tracing.record("claim chunk", started_ns, {"memstore.chunk.id": str(chunk.id)})
        try:
            if failure is not None:
                raise failure
            assert view is not None
            return await _process_claimed(deps, chunk, run, view)
        except asyncio.CancelledError:  # the worker is stopping: this attempt was not made
            await give_back(deps, chunk)
            raise
        except Exception as exc:
            tracing.fail(span, exc)
            if is_db_outage(exc) or isinstance(exc, ApplyInterruptedError):
                await give_back(deps, chunk)  # if Postgres answers; the job is retried (`jobs`)
                raise
            if isinstance(exc, OUTAGES) and getattr(exc, "transient", True):
                return await outage(deps, chunk, run, exc)
            # Anything else is this chunk's failed attempt: a poison chunk fails, alone, after its attempts.
            log.exception("chunk.error", chunk_id=str(chunk.id), seq=chunk.seq)
            return await failed_attempt(
                deps, chunk, run, describe(exc), writer_name=chunk.writer or "default"
            )


def _traced(
    chunk: ChunkRow, run: ScopeRun, started_ns: int
) -> contextlib.AbstractContextManager[Span | None]:
    """The span of a chunk's processing (from its claim to its apply), in the trace of the request
    that posted it, or, for a copy, in a trace of its own linked to that one (`app.lib.tracing`)."""
    if not tracing.ENABLED:
        return contextlib.nullcontext()
    return tracing.span(
        "process chunk",
        {
            "messaging.operation.type": "process",
            "memstore.chunk.id": str(chunk.id),
            "memstore.chunk.seq": chunk.seq,
            "memstore.chunk.attempt": chunk.attempts,
            "memstore.user.id": chunk.user_id,
            "gen_ai.memory.store.id": str(chunk.tenant_id),
        },
        kind="CONSUMER",
        context=None if run.linked else tracing.continued(chunk.trace_parent),
        links=tracing.link_to(chunk.trace_parent) if run.linked else (),
        start_ns=started_ns,
    )


async def _process_claimed(deps: PipelineDeps, chunk: ChunkRow, run: ScopeRun, view: WriterView) -> bool:
    """The writer's call for a claimed chunk, and its result applied or its failure recorded."""
    settings = deps.settings
    options, writer, request, shown = view.options, view.writer, view.request, view.shown

    log.debug("chunk.writing", chunk_id=str(chunk.id), seq=chunk.seq, writer=writer.name)
    started = time.perf_counter()
    with tracing.span("write memory ops", _writer_attributes(writer, len(shown))) as span:
        result, error, raw, attempt_limit, usage = await _call_writer(
            writer, request, settings.writer_timeout_s
        )
        if span is not None:
            if error is not None:
                tracing.fail(span, error)
            else:
                assert result is not None
                span.set_attributes(_ops_attributes(result, prefix="memstore.writer.ops"))
    metrics.WRITER_LATENCY.labels(writer.name, "error" if error else "ok").observe(
        time.perf_counter() - started
    )
    if error is not None:
        tracing.fail_current(error)
        return await failed_attempt(
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
        memory_at=memory_at(chunk),
        expires_at=expiry.of_date_text(chunk.expiration_date),
        raw_output=result.raw_output,
        usage=result.usage,
        guards=result.guards,
        limits=deps.policy.for_chunk(options, writer.name),
    )
    # Embedded here, before the apply's transaction locks anything.
    with tracing.span("embeddings", {"gen_ai.operation.name": "embeddings"}) as span:
        vectors = await embed_ops(view.embedder, [apply_request])
        if span is not None:
            span.set_attributes({"memstore.embedder.texts": len(vectors)})
    started = time.perf_counter()
    with tracing.span(
        "update_memory",
        {"gen_ai.operation.name": "update_memory", "gen_ai.memory.store.id": str(chunk.tenant_id)},
    ) as span:
        outcome = await deps.applier.apply(Result(chunk, apply_request, vectors, len(request.context)))
        if span is not None and outcome is not None:
            span.set_attributes(_applied_attributes(outcome))
            for guard in outcome.guards:
                span.add_event("guard fired", {"memstore.guard": str(guard.get("guard"))})
    deps.outage.over()
    if outcome is None:  # applied meanwhile by an earlier delivery
        tracing.set_attributes({"memstore.chunk.outcome": "skipped"})
        run.skipped += 1
        return True
    tracing.set_attributes({"memstore.chunk.outcome": "applied"})
    if deps.announcer is not None:
        deps.announcer.finished(chunk.id)
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


def _writer_attributes(writer: Writer, shown: int) -> dict[str, Any]:
    return {
        "memstore.writer": writer.name,
        "memstore.writer.profile": writer.profile,
        "gen_ai.request.model": writer.model,
        "memstore.writer.memories_shown": shown,
    }


def _ops_attributes(result: WriteResult, *, prefix: str) -> dict[str, Any]:
    """How many ops of each kind (`{prefix}.add` ...), and the ops themselves only with content on."""
    counts = collections.Counter(op.kind.value.lower() for op in result.ops)
    attributes: dict[str, Any] = {f"{prefix}.{kind}": n for kind, n in counts.items()}
    attributes[f"{prefix}.count"] = len(result.ops)
    if tracing.CAPTURE_CONTENT:
        attributes["gen_ai.memory.records"] = json.dumps(
            [op.as_json() for op in result.ops], ensure_ascii=False
        )
    return attributes


def _applied_attributes(outcome: ApplyOutcome) -> dict[str, Any]:
    return {
        "memstore.changeset.id": str(outcome.changeset_id),
        "gen_ai.memory.record.count": outcome.applied,
        "memstore.guards.fired": sorted({str(g.get("guard")) for g in outcome.guards}),
        "memstore.reviews.held": len(outcome.reviews),
    }


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
        await fail(deps, pending, f"gave up after {pending.attempts} attempts", None, final=True)
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
    except OUTAGES:
        raise  # the writer's own search (`request.search`) met a fault that is neither its nor the chunk's
    except WriterError as exc:
        if isinstance(exc.__cause__, OUTAGES):
            raise exc.__cause__ from exc
        usage = getattr(exc, "usage", None)
        return None, f"writer error: {exc}", exc.raw_output, exc.attempt_limit, usage
    except TimeoutError:
        return None, f"writer timed out after {timeout_s:g} s", None, None, None
    except Exception as exc:  # noqa: BLE001  (any writer bug is a failed attempt, not a dead worker)
        return None, f"writer raised {type(exc).__name__}: {exc}", None, None, None
