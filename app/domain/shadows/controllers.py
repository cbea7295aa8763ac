"""`/v1/admin/banks`, `/v1/admin/replays`, `/v1/admin/writers/compare`: writers on trial."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import JSONBody, QueryParameter
from litestar.status_codes import HTTP_202_ACCEPTED
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.audit.services import record_event
from app.domain.pipeline.wakeups import WakeReason, scope_wake
from app.domain.shadows import services
from app.domain.shadows.compare import compare_banks
from app.domain.shadows.replay import UnknownReplayWriterError, start_replay
from app.domain.shadows.schemas import BankList, BankOut, CompareOut, ProgressOut, ReplayIn, ReplayOut
from app.lib.errors import BankConflict, BankNotFound, InvalidField, error_responses
from app.lib.queue import JobQueue
from app.writers.registry import WriterRegistry

BankName = Annotated[str, QueryParameter(min_length=1, max_length=100)]

# Chunks one replay request gives its bank; asked again, the replay goes on from there.
_REPLAY_FEED_LIMIT = 10_000


async def _bank_out(session: AsyncSession, bank: services.Bank) -> BankOut:
    done = await services.progress(session, bank)
    return BankOut(
        name=bank.name,
        writer=bank.writer,
        kind=bank.kind,
        since=bank.since,
        until=bank.until,
        user_id=bank.user_id,
        progress=msgspec.convert(done, ProgressOut, from_attributes=True),
    )


class ShadowController(Controller):
    path = "/v1/admin"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get("/banks", summary="The tenant's shadow banks and how far each has got")
    async def list_banks(
        self, caller: NamedDependency[Caller], db_session: NamedDependency[AsyncSession]
    ) -> BankList:
        found = await services.banks(db_session, caller.tenant_id)
        return BankList(items=[await _bank_out(db_session, b) for b in found])

    @post(
        "/replays",
        status_code=HTTP_202_ACCEPTED,
        summary="Replay stored chunks through a writer",
        responses=error_responses(InvalidField, BankConflict),
    )
    async def replay(
        self,
        data: JSONBody[ReplayIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        writers: NamedDependency[WriterRegistry],
        job_queue: NamedDependency[JobQueue],
    ) -> Response[ReplayOut]:
        tenant_id = caller.tenant_id
        try:
            bank = await start_replay(
                db_session,
                tenant_id,
                writer=data.writer,
                writers=writers,
                user_id=data.user_id,
                since=data.since,
                until=data.until,
                name=data.name,
            )
        except UnknownReplayWriterError as exc:
            raise InvalidField(str(exc), details={"field": "writer"}) from exc
        fed = await services.feed(db_session, bank, limit=_REPLAY_FEED_LIMIT)
        await record_event(
            db_session,
            tenant_id=tenant_id,
            actor=caller.actor,
            action="bank.replayed",
            target_type="bank",
            target_id=bank.name,
            request_id=caller.request_id,
            summary={"writer": bank.writer, "fed": len(fed), **bank.as_json()},
        )
        jobs = [scope_wake(bank.id, user, WakeReason.REPLAYED).job() for user in dict.fromkeys(fed)]
        out = ReplayOut(
            bank=await _bank_out(db_session, bank), fed=len(fed), complete=len(fed) < _REPLAY_FEED_LIMIT
        )
        # After the commit, as ingestion does.
        return Response(
            out, status_code=HTTP_202_ACCEPTED, background=BackgroundTask(job_queue.enqueue_many, jobs)
        )

    @get(
        "/writers/compare",
        summary="Two banks side by side: ops, memories, guards, failures, cost",
        responses=error_responses(BankNotFound),
    )
    async def compare(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        settings: NamedDependency[Settings],
        b: BankName,
        a: BankName = services.PRIMARY,
        user_id: Annotated[str | None, QueryParameter(min_length=1, max_length=200)] = None,
        # (A bound of 0 is written out: Litestar leaves a falsy one out of the document.)
        threshold: Annotated[
            float | None, QueryParameter(gt=0.0, le=1.0, schema_extra={"exclusive_minimum": 0.0})
        ] = None,
        chunk_rows: Annotated[int, QueryParameter(ge=0, le=1000, schema_extra={"minimum": 0})] = 200,
    ) -> CompareOut:
        report = await compare_banks(
            db_session,
            caller.tenant_id,
            a,
            b,
            user_id=user_id,
            threshold=threshold or settings.compare_match_threshold,
            chunk_rows=chunk_rows,
        )
        return msgspec.convert(report, CompareOut)
