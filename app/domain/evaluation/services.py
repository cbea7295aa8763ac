"""Writers on trial: only the writer changes between runs; retrieval, read model and judge stay fixed.

For each writer, in turn:

1. a fresh bank — a tenant of its own, `eval-<run id>-<writer>` — receives the dataset's chunks,
   stored as ingestion stores them (per-scope `seq`, an audit event each), naming that writer;
2. the real pipeline writes them: `process_scope` with a `PipelineDeps` built in this process, so no
   worker or Redis is needed, and every chunk is applied (or failed) exactly as a worker would;
3. each question is answered by `answer_question`, the code behind `POST /v1/answer` (hybrid search
   with the same `top_k` for every writer, then the same read model), and graded by the same judge —
   once for each way of asking (`Asking`: with or without the time boost, with or without `valid_at`),
   all from the same bank, so that only the asking differs between them.

Evidence recall follows what the bank itself records: a retrieved memory derives from the chunks of
its versions up to the one retrieved (`memory_versions.chunk_id`), and a chunk holds the turns its
metadata names (`turn_ids`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.distribution import is_distributed
from app.db.engine import create_sessionmaker
from app.domain.accounts.services import create_tenant
from app.domain.answer.reader import ChatModel, ChatModelError, Completion
from app.domain.answer.services import Question, answer_question
from app.domain.audit.repositories import AuditRepository
from app.domain.audit.services import event_row
from app.domain.evaluation.datasets import (
    Dataset,
    EvalChunk,
    EvalQuestion,
    frame_chunks,
    frame_question,
    framing_for,
)
from app.domain.evaluation.repositories import EvaluationRepository
from app.domain.evaluation.scoring import evidence_recall, judge_messages, parse_verdict, token_f1
from app.domain.ingest.repositories import ScopeRepository
from app.domain.ingest.schemas import ChunkIn
from app.domain.ingest.services import body_hash, validate_chunks
from app.domain.pipeline.repositories import PipelineRepository
from app.domain.pipeline.services import PipelineDeps, process_scope
from app.embeddings import embedder_from_settings
from app.lib.errors import ApiError
from app.lib.time_expressions import named_time
from app.lib.validation import encode_moment
from app.writers.registry import DEFAULT, WriterRegistry

log = structlog.get_logger(__name__)

# (what is under way, done, total)
Progress = Callable[[str, int, int], None]

JUDGE_MAX_TOKENS = 128
_POLL_S = 0.5
_MAX_WAIT_S = 5.0


@dataclass(frozen=True)
class Asking:
    """How questions are put to a bank: the time boost's weight (None: the setting's), and whether a
    question that names a time is asked `valid_at` the end of that time (what held by then)."""

    time_boost: float | None = None
    valid_at_named: bool = False

    @property
    def label(self) -> str:
        parts = [] if self.time_boost is None else [f"boost {self.time_boost:g}"]
        return ", ".join(parts + (["valid_at"] if self.valid_at_named else []))

    def question(self, question: EvalQuestion, top_k: int) -> Question:
        """The `POST /v1/answer` question for `question`, asked this way."""
        valid_at = None
        if self.valid_at_named and (named := named_time(question.question, question.asked_at)) is not None:
            # What held by the end of the named time (by the asking, for "since 2019").
            valid_at = named[1] - timedelta(microseconds=1) if named[1] is not None else question.asked_at
        return Question(
            user_id=question.user_id,
            question=question.question,
            top_k=top_k,
            also_user_ids=question.also_user_ids,
            reference_time=question.asked_at,
            valid_at=valid_at,
            time_boost=self.time_boost,
        )


class EvaluationError(ValueError):
    """The evaluation cannot run as asked (an unknown writer, a chunk over the limits ...)."""


@dataclass
class QuestionResult:
    question: EvalQuestion
    answer: str | None
    correct: bool
    judge_parsed: bool
    f1: float
    evidence_recall: float | None
    evidence_found: list[str]
    memories: list[dict[str, Any]]
    answer_usage: dict[str, Any] = field(default_factory=dict)
    judge_usage: dict[str, Any] = field(default_factory=dict)
    judge_output: str | None = None
    error: str | None = None  # the read model or the judge gave no answer


@dataclass
class WriterRun:
    """What one writer's bank became, and how its questions fared."""

    writer: str
    tenant: str
    chunks: int
    statuses: dict[str, int]
    failures: list[str]
    memories: int
    active_memories: int
    usage: list[dict[str, Any]]
    pipeline_s: float
    results: list[QuestionResult] = field(default_factory=list)


def new_run_id() -> str:
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"


def resolve_writers(registry: WriterRegistry, names: list[str]) -> list[str]:
    """The concrete writer names to try (`default` is the deployment's); unknown ones are refused."""
    resolved = []
    for name in names:
        if not registry.knows(name):
            available = ", ".join(n for n in registry.names() if n != DEFAULT)
            msg = f"unknown writer {name!r} (configured here: {available})"
            raise EvaluationError(msg)
        resolved.append(registry.resolve_name(None) if name == DEFAULT else name)
    if len(set(resolved)) != len(resolved):
        msg = f"each writer once: {', '.join(names)}"
        raise EvaluationError(msg)
    return resolved


async def run_evaluation(
    engine: AsyncEngine,
    settings: Settings,
    dataset: Dataset,
    questions: list[EvalQuestion],
    writers: list[str],
    *,
    reader: ChatModel,
    judge: ChatModel,
    top_k: int,
    run_id: str,
    actor: str,
    concurrency: int = 8,
    progress: Progress | None = None,
    askings: list[Asking] | None = None,
) -> list[WriterRun]:
    """Each writer's bank written from `dataset` and questioned with `questions`, once per way of asking
    (named `writer [how]` when there are several); see the module."""
    askings = askings or [Asking()]
    report = progress or (lambda _what, _done, _total: None)
    registry = WriterRegistry(settings)
    names = resolve_writers(registry, writers)
    sessionmaker = create_sessionmaker(engine)
    deps = PipelineDeps(
        engine=engine,
        settings=settings,
        writers=registry,
        embedder=embedder_from_settings(settings),
        worker_name=f"eval-{run_id}",
        distributed=await is_distributed(engine),
    )
    runs = []
    try:
        for name in names:
            framing = framing_for(getattr(registry.get(name), "profile", None))
            chunks = _chunks_for(frame_chunks(dataset.chunks, framing), name, settings, registry)
            tenant_id, tenant = await _fresh_bank(sessionmaker, f"eval-{run_id}-{name}", actor)
            await store_chunks(sessionmaker, tenant_id, chunks, actor)
            log.info("eval.bank_created", writer=name, tenant=tenant, chunks=len(chunks))
            started = time.perf_counter()
            users = list(dict.fromkeys(c.user_id for c in chunks))
            await _write_bank(deps, sessionmaker, tenant_id, users, len(chunks), name, report)
            run = await _bank_figures(sessionmaker, tenant_id, name, tenant, len(chunks))
            run.pipeline_s = time.perf_counter() - started
            asked = [frame_question(q, dataset.chunks, framing) for q in questions]
            for asking in askings:
                label = f"{name} [{asking.label}]" if len(askings) > 1 and asking.label else name
                results = await _ask(
                    sessionmaker,
                    deps,
                    tenant_id,
                    asked,
                    label,
                    reader,
                    judge,
                    top_k,
                    concurrency,
                    report,
                    asking,
                )
                runs.append(replace(run, writer=label, results=results))
    finally:
        await deps.aclose()
    return runs


def _chunks_for(
    chunks: list[EvalChunk], writer: str, settings: Settings, registry: WriterRegistry
) -> list[ChunkIn]:
    bodies = [
        ChunkIn(user_id=c.user_id, messages=list(c.messages), metadata=c.metadata(), writer=writer)
        for c in chunks
    ]
    for chunk, body in zip(chunks, bodies, strict=True):
        try:
            validate_chunks([body], settings, registry)
        except ApiError as exc:
            msg = f"{chunk.conversation} {chunk.label}: {exc.detail} ({exc.details})"
            raise EvaluationError(msg) from exc
    return bodies


async def _fresh_bank(
    sessionmaker: async_sessionmaker[AsyncSession], name: str, actor: str
) -> tuple[uuid.UUID, str]:
    async with sessionmaker() as session, session.begin():
        tenant, _ = await create_tenant(session, name, actor=actor)
    return tenant.id, tenant.name


async def store_chunks(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, chunks: list[ChunkIn], actor: str
) -> None:
    """Store `chunks` as ingestion does: the next `seq` of each scope, in order, an audit event each,
    in one transaction (through ingestion's repositories)."""
    counts = Counter((tenant_id, c.user_id) for c in chunks)
    async with sessionmaker() as session, session.begin():
        last = await ScopeRepository(session).allocate_seqs(dict(counts))
        next_seq = {scope: last[scope] - counts[scope] + 1 for scope in counts}
        rows, events = [], []
        for chunk in chunks:
            scope = (tenant_id, chunk.user_id)
            seq, next_seq[scope] = next_seq[scope], next_seq[scope] + 1
            chunk_id = uuid.uuid4()
            rows.append(
                {
                    "id": chunk_id,
                    "tenant_id": tenant_id,
                    "user_id": chunk.user_id,
                    "agent_id": chunk.agent_id,
                    "run_id": chunk.run_id,
                    "seq": seq,
                    "messages": msgspec.to_builtins(chunk.messages, enc_hook=encode_moment),
                    "metadata": chunk.metadata,
                    "idempotency_key": None,
                    "body_hash": body_hash(chunk),
                    "writer": chunk.writer,
                }
            )
            events.append(
                event_row(
                    tenant_id=tenant_id,
                    actor=actor,
                    action="chunk.accepted",
                    target_type="chunk",
                    target_id=str(chunk_id),
                    summary={"user_id": chunk.user_id, "seq": seq},
                )
            )
        await PipelineRepository(session).insert_many(rows)
        await AuditRepository(session).insert_many(events)


async def _write_bank(
    deps: PipelineDeps,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant_id: uuid.UUID,
    users: list[str],
    total: int,
    writer: str,
    report: Progress,
) -> None:
    """Drain every scope of the bank through the pipeline, scopes side by side, until each chunk is
    applied or failed (a failing writer's chunks wait out their backoff, as on a worker)."""
    slots = asyncio.Semaphore(max(1, deps.settings.worker_max_jobs))

    async def drain(user_id: str) -> None:
        async with slots:
            while True:
                run = await process_scope(deps, tenant_id, user_id)
                async with sessionmaker() as session:
                    if not await EvaluationRepository(session).unfinished(tenant_id, user_id):
                        return
                wait = _POLL_S
                if run.retry_at is not None:
                    wait = (run.retry_at - datetime.now(UTC)).total_seconds()
                await asyncio.sleep(min(_MAX_WAIT_S, max(0.01, wait)))

    async def tick() -> None:
        while True:
            async with sessionmaker() as session:
                statuses = await EvaluationRepository(session).chunk_statuses(tenant_id)
            report(f"writing with {writer}", statuses.get("applied", 0) + statuses.get("failed", 0), total)
            await asyncio.sleep(_POLL_S)

    ticker = asyncio.create_task(tick())
    try:
        await asyncio.gather(*(drain(u) for u in users))
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    report(f"writing with {writer}", total, total)


async def _bank_figures(
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant_id: uuid.UUID,
    writer: str,
    tenant: str,
    chunks: int,
) -> WriterRun:
    async with sessionmaker() as session:
        repo = EvaluationRepository(session)
        statuses = await repo.chunk_statuses(tenant_id)
        memories, active = await repo.memory_counts(tenant_id)
        return WriterRun(
            writer=writer,
            tenant=tenant,
            chunks=chunks,
            statuses=statuses,
            failures=await repo.failed_chunks(tenant_id) if statuses.get("failed") else [],
            memories=memories,
            active_memories=active,
            usage=await repo.writer_usage(tenant_id),
            pipeline_s=0.0,
        )


async def _ask(
    sessionmaker: async_sessionmaker[AsyncSession],
    deps: PipelineDeps,
    tenant_id: uuid.UUID,
    questions: list[EvalQuestion],
    writer: str,
    reader: ChatModel,
    judge: ChatModel,
    top_k: int,
    concurrency: int,
    report: Progress,
    asking: Asking,
) -> list[QuestionResult]:
    async with sessionmaker() as session:
        repo = EvaluationRepository(session)
        derivations = await repo.derivations(tenant_id)
        turns = await repo.chunk_turns(tenant_id)
    slots = asyncio.Semaphore(max(1, concurrency))
    done = 0

    async def one(question: EvalQuestion) -> QuestionResult:
        nonlocal done
        async with slots:
            result = await _answer_and_grade(
                sessionmaker,
                deps,
                tenant_id,
                question,
                asking.question(question, top_k),
                reader,
                judge,
                derivations,
                turns,
            )
        done += 1
        report(f"asking {writer}'s bank", done, len(questions))
        return result

    report(f"asking {writer}'s bank", 0, len(questions))
    return list(await asyncio.gather(*(one(q) for q in questions)))


async def _answer_and_grade(
    sessionmaker: async_sessionmaker[AsyncSession],
    deps: PipelineDeps,
    tenant_id: uuid.UUID,
    question: EvalQuestion,
    asked: Question,
    reader: ChatModel,
    judge: ChatModel,
    derivations: dict[uuid.UUID, list[tuple[int, uuid.UUID]]],
    turns: dict[uuid.UUID, tuple[str, ...]],
) -> QuestionResult:
    try:
        answer = await answer_question(sessionmaker, deps.searcher, reader, tenant_id, asked)
    except ApiError as exc:
        return QuestionResult(
            question,
            None,
            False,
            False,
            0.0,
            None,
            [],
            [],
            error=f"answer: {exc.code}: {exc.details or exc.detail}",
        )
    covered: set[str] = set()
    memories = []
    for used in answer.memories:
        hit = used.hit
        chunk_ids = [c for version, c in derivations.get(hit.id, []) if version <= hit.version]
        for chunk_id in chunk_ids:
            covered.update(turns.get(chunk_id, ()))
        memories.append(
            {
                "id": str(hit.id),
                "content": hit.content,
                "score": round(hit.score, 4),
                "version": hit.version,
                "chunk_ids": [str(c) for c in dict.fromkeys(chunk_ids)],
            }
        )
    recall = evidence_recall(question.evidence, covered)
    result = QuestionResult(
        question=question,
        answer=answer.text,
        correct=False,
        judge_parsed=False,
        f1=token_f1(answer.text, question.answer),
        evidence_recall=recall,
        evidence_found=[e for e in question.evidence if e in covered],
        memories=memories,
        answer_usage=answer.completion.usage(),
    )
    verdict = await _judged(judge, judge_messages(question.question, question.answer, answer.text))
    if isinstance(verdict, str):
        result.error = f"judge: {verdict}"
        return result
    parsed = parse_verdict(verdict.text)
    result.correct, result.judge_parsed = parsed.correct, parsed.parsed
    result.judge_output = verdict.text if not parsed.parsed else None
    result.judge_usage = verdict.usage()
    return result


async def _judged(judge: ChatModel, messages: list[dict[str, str]]) -> Completion | str:
    """The judge's completion, or why there is none."""
    try:
        return await judge.complete(messages, max_tokens=JUDGE_MAX_TOKENS)
    except ChatModelError as exc:
        return str(exc)
