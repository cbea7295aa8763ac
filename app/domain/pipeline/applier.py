"""Group commit: a worker applies the writer results of many scopes in one transaction.

A GPU writer answers many calls at about the same time, so a busy worker holds many results ready
to apply at once. Applying each in its own transaction costs some ten round trips and a commit per
chunk, and on a small machine that per-statement work, not the model, caps throughput. The
`Applier` takes results as they come: the first one starts a transaction at once, and whatever
arrives while that transaction runs is applied together in the next, so the batch grows with load
and an idle worker adds no wait. A batch is a handful of bulk statements (`apply_many`), whatever
its size, and a changeset's rows are the same as when applied alone.

On a Citus cluster a batch is one tenant's results (`tenant_a_batch`), so each transaction stays on
the node of that tenant's shards. Each chunk still commits exactly once and in its scope's order: its
scope's next chunk is claimed only after its apply returns. If a batch fails, each of its chunks is
applied alone, so one bad result never holds back the others.

A result comes with the vectors of its texts, embedded before it was handed over: a batch's
transaction locks chunks and memories, and never waits on a model server while it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db.tenancy import tenant_scope
from app.domain.audit.repositories import AuditRepository
from app.domain.audit.services import event_row
from app.domain.memories.services import ApplyOutcome, ApplyRequest, Vectors, apply_many
from app.domain.pipeline.repositories import ChunkRow, PipelineRepository
from app.domain.provenance.repositories import WriterViewRepository
from app.domain.webhooks.events import Announcement, announce, chunk_fields
from app.lib import metrics, tracing
from app.lib.errors import is_db_outage, is_node_outage

if TYPE_CHECKING:
    from opentelemetry.context import Context

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Result:
    """A claimed chunk (as claimed: its `attempts` fence a worker that lost its lock), what its
    writer decided, and the vectors of the texts it may store (`embed_ops`): ready to apply."""

    chunk: ChunkRow
    request: ApplyRequest
    vectors: Vectors
    context_messages: int = 0  # earlier messages of the scope the writer was given (its writer view)


class ApplyInterruptedError(RuntimeError):
    """The worker stopped before the batch holding a result was committed."""


@dataclass(eq=False)
class _Waiting:
    result: Result
    done: asyncio.Future[ApplyOutcome | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # The chunk's trace (tracing on): the group commit is recorded in it once done.
    trace: Context | None = field(default_factory=tracing.current_context)


class Applier:
    """One per worker process; `apply` may be awaited by any number of scope jobs at once."""

    def __init__(
        self, engine: AsyncEngine, actor: str, max_batch: int = 64, *, tenant_a_batch: bool = False
    ) -> None:
        self.engine = engine
        self.actor = actor
        self.max_batch = max_batch
        # On a Citus cluster, a transaction a tenant: one that holds several tenants' rows reaches
        # several nodes (a two-phase commit), and Citus refuses its row locks across them.
        self.tenant_a_batch = tenant_a_batch
        self._waiting: list[_Waiting] = []
        self._flusher: asyncio.Task[None] | None = None

    async def apply(self, result: Result) -> ApplyOutcome | None:
        """Apply `result` and mark its chunk applied, in a transaction shared with other results.

        None if the chunk is no longer held by this claim (applied or re-claimed elsewhere). A
        cancelled caller withdraws its result if no batch has taken it yet, and otherwise waits for that
        batch to end: either way, when the cancellation reaches the caller, the result is settled, and
        the caller may give its claim back without racing a commit of it.
        """
        waiting = _Waiting(result)
        self._waiting.append(waiting)
        if self._flusher is None or self._flusher.done():
            # In a context of its own: the batch is no one job's (its log lines, its trace's spans).
            self._flusher = asyncio.create_task(self._flush(), context=contextvars.Context())
        try:
            return await asyncio.shield(waiting.done)
        except asyncio.CancelledError:
            if waiting in self._waiting:
                self._waiting.remove(waiting)
            else:
                with contextlib.suppress(Exception):
                    await asyncio.shield(waiting.done)
            raise

    async def aclose(self) -> None:
        """Let the batch in progress finish."""
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher

    async def _flush(self) -> None:
        batch: list[_Waiting] = []
        try:
            while self._waiting:
                await asyncio.sleep(0)  # results that became ready in this same turn join the batch
                batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
                if not self.tenant_a_batch:
                    await self._apply_batch(batch)
                    continue
                by_tenant: dict[uuid.UUID, list[_Waiting]] = {}
                for waiting in batch:
                    by_tenant.setdefault(waiting.result.chunk.tenant_id, []).append(waiting)
                for part in by_tenant.values():
                    await self._apply_batch(part)
                    batch = [w for w in batch if w not in part]
        finally:  # cancelled (the loop is closing): nobody may wait forever
            for waiting in [*batch, *self._waiting]:
                _settle(waiting, exc=ApplyInterruptedError("the worker stopped before the apply"))

    async def _apply_batch(self, batch: list[_Waiting]) -> None:
        """Commit `batch` together; if that fails for a reason of its own, each result alone."""
        metrics.APPLY_BATCH.observe(len(batch))
        started_ns = tracing.now_ns()
        try:
            outcomes = await self._commit([w.result for w in batch])
        except Exception as exc:  # noqa: BLE001  (each result gets its own chance, or its own error)
            if len(batch) == 1 or (is_db_outage(exc) and not is_node_outage(exc)):
                for waiting in batch:  # the database is away: every job retries later
                    _settle(waiting, exc=exc)
                return
            log.warning("apply.batch_failed", size=len(batch), error=f"{type(exc).__name__}: {exc}")
            for waiting in batch:
                try:
                    [outcome] = await self._commit([waiting.result])
                except Exception as single_exc:  # noqa: BLE001
                    _settle(waiting, exc=single_exc)
                else:
                    _settle(waiting, outcome)
        else:
            for waiting, outcome in zip(batch, outcomes, strict=True):
                _settle(waiting, outcome)
            if tracing.ENABLED:
                for waiting in batch:  # the commit, one piece of work for many chunks, in each one's trace
                    attributes = {"memstore.batch.chunks": len(batch)}
                    tracing.record("apply group commit", started_ns, attributes, context=waiting.trace)

    async def _commit(self, results: list[Result]) -> list[ApplyOutcome | None]:
        # The batch's tenants, and theirs alone (`app.db.tenancy`), whichever job started this flusher.
        with tenant_scope(r.chunk.tenant_id for r in results):
            return await self._commit_as_tenants(results)

    async def _commit_as_tenants(self, results: list[Result]) -> list[ApplyOutcome | None]:
        async with AsyncSession(self.engine, expire_on_commit=False) as session:
            claims = [(r.chunk, r.request.changeset_id) for r in results]
            still_ours = await PipelineRepository(session).mark_applied(claims)
            live = [r for r in results if r.chunk.id in still_ours]
            vectors = {text: vector for r in live for text, vector in r.vectors.items()}
            outcomes = await apply_many(session, [_counted(r) for r in live], vectors)
            await WriterViewRepository(session).insert_many(
                [writer_view(r, outcome) for r, outcome in zip(live, outcomes, strict=True)]
            )
            events = []
            for r, outcome in zip(live, outcomes, strict=True):
                events.append(
                    event_row(
                        tenant_id=r.chunk.tenant_id,
                        actor=self.actor,
                        action="chunk.applied",
                        target_type="chunk",
                        target_id=str(r.chunk.id),
                        summary={
                            "seq": r.chunk.seq,
                            "changeset_id": str(outcome.changeset_id),
                            "applied": outcome.applied,
                            "guards": len(outcome.guards),
                            "held": len(outcome.reviews),
                        },
                    )
                )
                events.extend(
                    event_row(
                        tenant_id=r.chunk.tenant_id,
                        actor=self.actor,
                        action="review.held",
                        target_type="review",
                        target_id=str(review_id),
                        summary={
                            "user_id": r.chunk.user_id,
                            "chunk_id": str(r.chunk.id),
                            "changeset_id": str(outcome.changeset_id),
                            "writer": r.request.provenance.writer,
                            "model": r.request.provenance.model,
                        },
                    )
                    for review_id in outcome.reviews
                )
            await AuditRepository(session).insert_many(events)
            # The webhooks' outbox: one statement for the batch (`webhooks.events`).
            await announce(session, [announcement(r, o) for r, o in zip(live, outcomes, strict=True)])
            await session.commit()
        by_chunk: dict[uuid.UUID, ApplyOutcome] = {
            r.chunk.id: outcome for r, outcome in zip(live, outcomes, strict=True)
        }
        return [by_chunk.get(r.chunk.id) for r in results]


def announcement(result: Result, outcome: ApplyOutcome) -> Announcement:
    """The webhooks' events of an applied chunk: its changeset's (`memory.*`, `review.held`), then
    `chunk.applied`."""
    chunk, provenance = result.chunk, result.request.provenance
    return Announcement(
        tenant_id=chunk.tenant_id,
        user_id=chunk.user_id,
        type="chunk.applied",
        data={
            **chunk_fields(chunk),
            "changeset_id": str(outcome.changeset_id),
            "writer": provenance.writer,
            "model": provenance.model,
            "profile": provenance.profile,
            "applied": outcome.applied,
            "guards": len(outcome.guards),
            "held": len(outcome.reviews),
        },
        changeset_id=outcome.changeset_id,
    )


def writer_view(result: Result, outcome: ApplyOutcome) -> dict[str, Any]:
    """What the writer of `result` was shown, kept beside its changeset so the decision can be explained."""
    shown = sorted(result.request.shown.items())
    return {
        "changeset_id": outcome.changeset_id,
        "tenant_id": result.chunk.tenant_id,
        "candidates": [
            {"local_id": local_id, "memory_id": str(s.memory_id), "version": s.version}
            for local_id, s in shown
        ],
        "context_messages": result.context_messages,
    }


def _settle(waiting: _Waiting, outcome: ApplyOutcome | None = None, exc: BaseException | None = None) -> None:
    if waiting.done.done():
        return
    if exc is not None:
        waiting.done.set_exception(exc)
    else:
        waiting.done.set_result(outcome)


def _counted(result: Result) -> ApplyRequest:
    """The request with the texts embedded for it added to its usage (`embedder_texts`): what the
    changeset records its apply cost, read by the usage reports (`GET /v1/admin/usage`)."""
    usage = {**(result.request.usage or {}), "embedder_texts": len(result.vectors)}
    return replace(result.request, usage=usage)
