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

The rooms, each importing only those listed above it:
- `faults` — which faults are not the chunk's (`OUTAGES`), and the backoffs of a failed attempt and
  of an outage;
- `scope_run` — what one drain of a scope did (`ScopeRun`);
- `budgets` — a tenant's shares for the fair scheduler, paused while its daily token budget is spent;
- `deps` — what a worker process shares between its jobs (`PipelineDeps`), and its caches and rules:
  tenants' options, the outage clock, the limits policy;
- `writer_view` — what a claimed chunk's writer is shown (`build_request`);
- `failures` — a failed attempt, a fault outside Postgres, a claim given back, recorded on the chunk;
- `drain` — taking up and draining a scope, a chunk at a time (`take_up_scope`, `process_scope`);
- `retry` — an admin's retry of a failed chunk (on its own).
"""

from __future__ import annotations

from app.domain.pipeline.services.deps import (
    BankFeeder,
    LimitsPolicy,
    OutageClock,
    PipelineDeps,
    TenantOptionsCache,
)
from app.domain.pipeline.services.drain import process_scope, take_up_scope
from app.domain.pipeline.services.faults import backoff, outage_backoff
from app.domain.pipeline.services.scope_run import ScopeRun
from app.domain.pipeline.services.writer_view import build_request, memory_at

__all__ = [
    "BankFeeder",
    "LimitsPolicy",
    "OutageClock",
    "PipelineDeps",
    "ScopeRun",
    "TenantOptionsCache",
    "backoff",
    "build_request",
    "memory_at",
    "outage_backoff",
    "process_scope",
    "take_up_scope",
]
