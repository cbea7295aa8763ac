"""`WorkerSettings` for arq: the start-up and shut-down of what a worker process shares, and the
registration of the domain's jobs (`app.domain.pipeline.jobs`, `app.domain.audit.jobs`); the jobs'
bodies live with their domains."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections import Counter
from typing import Any, cast

import structlog
from arq import cron, func
from arq.typing import WorkerCoroutine

from app.config import Settings, get_settings
from app.db.distribution import is_distributed
from app.db.engine import create_engine, warn_if_bypassing_row_security
from app.domain.audit.jobs import seal_audit_job
from app.domain.pipeline.finished import ChunkAnnouncer
from app.domain.pipeline.jobs import WorkerContext, process_scope_job, run_turn, sweep_job
from app.domain.pipeline.scheduler import FairScheduler
from app.domain.pipeline.services import PipelineDeps
from app.domain.pipeline.wakeups import SCOPE_JOB
from app.domain.search.graph import keep_indexing
from app.domain.search.jobs import switch_embedder_job
from app.domain.search.tenant_embedder import SWITCH_JOB
from app.domain.shadows.services import LiveFeeder
from app.domain.system.services import WorkerBeat, beat, forget
from app.domain.webhooks.jobs import DELIVER_JOB, deliver_webhooks_job
from app.embeddings import Embedders
from app.lib import lexical, metrics, tracing
from app.lib.logging import configure_logging
from app.lib.queue import QUEUE_NAME, redis_settings
from app.writers.registry import WriterRegistry

log = structlog.get_logger("workers")

_STARTED_AT = time.time()  # the process's start, as its heartbeat reports it

# The jobs a heartbeat reports as running, by the name of their coroutine.
_JOB_NAMES = {
    process_scope_job.__name__: SCOPE_JOB,
    run_turn.__name__: SCOPE_JOB,
    seal_audit_job.__name__: "seal_audit",
    sweep_job.__name__: "sweep",
    deliver_webhooks_job.__name__: DELIVER_JOB,
    switch_embedder_job.__name__: SWITCH_JOB,
}


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _one_thread_a_run(settings: Settings) -> Settings:
    """A worker's onnx runs take one thread each unless `MEMSTORE_EMBEDDER_THREADS` says otherwise: its
    jobs' texts queue for the model anyway, and a second thread costs a fifth more CPU per text for
    the cores its jobs, Postgres and the API share (bench/writer.py at 256 in flight, back to back:
    69.8 % of ideal with one thread, 55.6-62.1 % with one per core; worker CPU 8.5 against 11.1 ms a
    chunk)."""
    return settings if settings.embedder_threads else settings.model_copy(update={"embedder_threads": 1})


async def startup(ctx: WorkerContext) -> None:
    """Open the shared clients one worker process uses for all its jobs."""
    settings: Settings = ctx.get("settings") or get_settings()
    configure_logging(settings.log_level, settings.log_format, process="worker")
    tracing.configure("worker")  # off unless OTEL_TRACES_EXPORTER asks (app/lib/tracing.py)
    ctx["settings"] = settings
    ctx["engine"] = create_engine(
        settings, application_name="memstore-worker", pre_ping=False, overflow=False
    )
    await warn_if_bypassing_row_security(ctx["engine"])
    ctx["worker_name"] = worker_name()
    await asyncio.to_thread(lexical.load)  # before the first job: every memory written is analysed
    embedders = Embedders(_one_thread_a_run(settings))
    ctx["pipeline"] = PipelineDeps(
        engine=ctx["engine"],
        settings=settings,
        writers=WriterRegistry(settings),
        embedder=embedders.default,
        embedders=embedders,
        worker_name=ctx["worker_name"],
        feeder=LiveFeeder(ctx["engine"]),
        announcer=ChunkAnnouncer(ctx["redis"]),
        distributed=await is_distributed(ctx["engine"]),
    )
    # A turn's lease lapses (its slot's share back to its tenant) if the worker dies: past the longest a
    # turn can take, its last writer call and apply included.
    lease_s = settings.scheduler_turn_s + settings.writer_timeout_s + 30
    ctx["scheduler"] = FairScheduler(ctx["redis"], worker=ctx["worker_name"], lease_s=lease_s)
    if settings.graph_index_budget_s > 0:  # the vector graph's indexer (`search.graph`), beside the jobs
        ctx["graph_indexer"] = asyncio.create_task(
            keep_indexing(
                ctx["engine"],
                batch=settings.graph_index_batch,
                budget_s=settings.graph_index_budget_s,
                everything=settings.graph_index_all,
            ),
            name="graph-indexer",
        )
    if settings.worker_metrics_port:
        metrics.serve_http(settings.worker_metrics_port)
    await heartbeat(ctx)
    log.info("worker.started", worker=ctx["worker_name"], max_jobs=settings.worker_max_jobs)


async def shutdown(ctx: WorkerContext) -> None:
    """Close what `startup` opened, as far as it got (a worker stopped while it started has an engine
    and no pipeline yet); a second call does nothing."""
    indexer = ctx.pop("graph_indexer", None)
    if indexer is not None:
        indexer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await indexer
    pipeline: PipelineDeps | None = ctx.pop("pipeline", None)
    if pipeline is not None:
        await forget(ctx["redis"], ctx["worker_name"])
        await pipeline.aclose()
    engine = ctx.pop("engine", None)
    if engine is not None:
        await engine.dispose()
        log.info("worker.stopped", worker=ctx.get("worker_name"))


async def on_job_start(ctx: WorkerContext) -> None:
    structlog.contextvars.bind_contextvars(job_id=ctx.get("job_id"), job_try=ctx.get("job_try"))


async def on_job_end(ctx: WorkerContext) -> None:
    structlog.contextvars.unbind_contextvars("job_id", "job_try")


async def heartbeat(ctx: WorkerContext) -> None:
    """Announce this worker in Redis (with a TTL) with the jobs it is running, so `memstore status` and
    `/metrics` can count workers. A cron job every 10 s: nothing on a chunk's path."""
    running = Counter(
        _JOB_NAMES[name]
        for task in asyncio.all_tasks()
        if (name := getattr(task.get_coro(), "__name__", None)) in _JOB_NAMES
    )
    host, _, pid = ctx["worker_name"].rpartition(":")
    settings = ctx["settings"]
    await beat(
        ctx["redis"],
        WorkerBeat(
            name=ctx["worker_name"],
            host=host,
            pid=int(pid),
            max_jobs=settings.worker_max_jobs + settings.shadow_max_jobs,
            jobs_running=dict(running),
            started_at=_STARTED_AT,
            beat_at=time.time(),
        ),
    )


# arq types a job's context as a plain dict; ours say what it holds (`WorkerContext`).
_SCOPE_JOB = cast("WorkerCoroutine", process_scope_job)
_HEARTBEAT = cast("WorkerCoroutine", heartbeat)
_SEAL_AUDIT = cast("WorkerCoroutine", seal_audit_job)
_SWEEP = cast("WorkerCoroutine", sweep_job)
_DELIVER_WEBHOOKS = cast("WorkerCoroutine", deliver_webhooks_job)
_SWITCH_EMBEDDER = cast("WorkerCoroutine", switch_embedder_job)


def worker_options(settings: Settings) -> dict[str, Any]:
    """arq `Worker` keyword arguments for `settings` (used by `WorkerSettings` and by tests)."""
    sweep_every = max(1, min(60, settings.sweep_interval_s))
    return {
        "queue_name": QUEUE_NAME,
        "functions": [
            # Retries come from Postgres state (attempts, backoff); Retry only covers database outages.
            func(_SCOPE_JOB, name=SCOPE_JOB, max_tries=1000, keep_result=0),
            # A slice of a tenant's move to another embedder (`search.jobs`): a worker that dies in it
            # leaves the job to arq, which runs it again; the move resumes from its cursor.
            func(_SWITCH_EMBEDDER, name=SWITCH_JOB, max_tries=1000, timeout=600, keep_result=0),
        ],
        "cron_jobs": [
            cron(_HEARTBEAT, second=set(range(0, 60, 10)), run_at_startup=False, unique=False, timeout=5),
            cron(
                _SEAL_AUDIT,
                second=set(range(0, 60, 2)),
                run_at_startup=True,
                unique=True,
                timeout=60,
                keep_result=0,
            ),
            cron(
                _SWEEP,
                second=set(range(0, 60, sweep_every)),
                run_at_startup=True,
                unique=True,
                timeout=60,
                keep_result=0,
            ),
            # Webhook deliveries due (`app.domain.webhooks.delivery`): one look a second, a round trip
            # when nothing is due.
            cron(
                _DELIVER_WEBHOOKS,
                name=DELIVER_JOB,
                second=set(range(60)),
                run_at_startup=True,
                unique=True,
                timeout=60,
                keep_result=0,
            ),
        ],
        "on_startup": startup,
        "on_shutdown": shutdown,
        "on_job_start": on_job_start,
        "on_job_end": on_job_end,
        # Shadow banks are drained in slots of their own, so they never take one the tenants' scopes need.
        "max_jobs": settings.worker_max_jobs + settings.shadow_max_jobs,
        # Shorter starts an idle scope's chunk sooner, but each look re-reads every queued and running
        # job (a few Redis round trips each): at 0.05 s a worker spent 3x the CPU per chunk at 64 in flight.
        "poll_delay": settings.worker_poll_delay_s,
        "job_timeout": settings.worker_job_timeout_s,
        "job_completion_wait": settings.worker_shutdown_wait_s,
        "keep_result": 60,
        "max_tries": 1000,
        "redis_settings": redis_settings(settings.redis_url, retries=60) if settings.redis_url else None,
        "ctx": {"settings": settings},
    }


# Read by `memstore worker` (a `workers.wakeable.WakeableWorker`); `arq workers.settings.WorkerSettings`
# also runs them, with arq's plain worker (no wake-ups: it waits out its poll delay).
WorkerSettings: dict[str, Any] = worker_options(get_settings())
