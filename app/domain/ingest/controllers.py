"""`/v1/chunks`: accept one chunk or a batch (202 once durable), and report a chunk's progress."""

from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Controller, Response, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, HeaderParameter, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK, HTTP_202_ACCEPTED
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.accounts.auth import requires_any_role, requires_role
from app.domain.accounts.services import Caller
from app.domain.ingest import services
from app.domain.ingest.batcher import IngestBatcher
from app.domain.ingest.schemas import (
    BatchAccepted,
    BatchIn,
    ChunkAccepted,
    ChunkIn,
    ChunkStatus,
    ChunkStatuses,
)
from app.domain.pipeline.finished import FinishedChunks
from app.lib.errors import (
    IdempotencyConflict,
    InvalidField,
    NotFoundError,
    Overloaded,
    QueueFull,
    Unavailable,
    error_responses,
)
from app.writers.registry import WriterRegistry

# Read-your-writes: how long a status read may wait for the chunk to finish (`pipeline.finished`).
Wait = Annotated[
    float,
    QueryParameter(
        ge=0,
        le=services.MAX_WAIT_S,
        description=(
            "Seconds to wait for the chunk(s) to be applied or failed before answering (at most "
            f"{services.MAX_WAIT_S:g}); the answer comes as soon as they are, or after this with the "
            "status then. 0: at once."
        ),
    ),
]
IdempotencyKey = Annotated[
    str | None, HeaderParameter(name="Idempotency-Key", required=False, max_length=200, min_length=1)
]


REPLAYED = "A replay: an earlier chunk had this Idempotency-Key and the same body; its acknowledgement."


def _accepted(result: services.Accepted) -> ChunkAccepted:
    return ChunkAccepted(
        chunk_id=result.chunk_id, seq=result.seq, status=result.status, replayed=result.replayed
    )


class ChunkController(Controller):
    path = "/v1/chunks"
    tags = ["ingestion"]

    @post(
        "/",
        guards=[requires_role("ingest")],
        status_code=HTTP_202_ACCEPTED,
        summary="Accept a conversation chunk (durable when this returns)",
        responses={
            200: ResponseSpec(ChunkAccepted, description=REPLAYED),
            **error_responses(InvalidField, IdempotencyConflict, QueueFull, Overloaded, Unavailable),
        },
    )
    async def post_chunk(
        self,
        data: JSONBody[ChunkIn],
        caller: NamedDependency[Caller],
        settings: NamedDependency[Settings],
        writers: NamedDependency[WriterRegistry],
        ingest_batcher: NamedDependency[IngestBatcher],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[ChunkAccepted]:
        services.validate_chunks([data], settings, writers)
        [result] = await ingest_batcher.submit(caller.principal, [(data, idempotency_key)], caller.request_id)
        return Response(_accepted(result), status_code=HTTP_200_OK if result.replayed else HTTP_202_ACCEPTED)

    @post(
        "/batch",
        guards=[requires_role("ingest")],
        status_code=HTTP_202_ACCEPTED,
        summary="Accept several chunks at once, atomically, in order",
        responses=error_responses(InvalidField, IdempotencyConflict, QueueFull, Overloaded, Unavailable),
    )
    async def post_batch(
        self,
        data: JSONBody[BatchIn],
        caller: NamedDependency[Caller],
        settings: NamedDependency[Settings],
        writers: NamedDependency[WriterRegistry],
        ingest_batcher: NamedDependency[IngestBatcher],
    ) -> BatchAccepted:
        if len(data.chunks) > settings.max_batch_chunks:
            raise InvalidField(
                f"A batch may hold at most {settings.max_batch_chunks} chunks.",
                details={"field": "chunks", "max": settings.max_batch_chunks},
            )
        services.validate_chunks(data.chunks, settings, writers)
        results = await ingest_batcher.submit(
            caller.principal,
            [(c, c.idempotency_key) for c in data.chunks],
            caller.request_id,
            backfill=data.priority == "backfill",
        )
        return BatchAccepted(results=[_accepted(r) for r in results])

    @get(
        "/{chunk_id:uuid}",
        guards=[requires_any_role("ingest", "read")],
        summary="A chunk's progress; with `wait`, once it is applied or failed (read-your-writes)",
        responses=error_responses(NotFoundError),
    )
    async def get_chunk(
        self,
        chunk_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        sessionmaker: NamedDependency[async_sessionmaker[AsyncSession]],
        finished_chunks: NamedDependency[FinishedChunks],
        wait: Wait = 0.0,
    ) -> ChunkStatus:
        [chunk] = await services.finished_or_after(
            sessionmaker, finished_chunks, caller.tenant_id, [chunk_id], wait
        )
        [progress] = await services.progress(sessionmaker, caller.tenant_id, [chunk])
        return ChunkStatus.of(chunk, may_read=caller.may("read"), progress=progress)

    @get(
        "/",
        guards=[requires_any_role("ingest", "read")],
        summary="Several chunks' progress; with `wait`, once all are applied or failed",
        responses=error_responses(NotFoundError, InvalidField),
    )
    async def get_chunks(
        self,
        caller: NamedDependency[Caller],
        sessionmaker: NamedDependency[async_sessionmaker[AsyncSession]],
        finished_chunks: NamedDependency[FinishedChunks],
        chunk_id: Annotated[list[uuid.UUID], QueryParameter(min_items=1, max_items=services.MAX_STATUS_IDS)],
        wait: Wait = 0.0,
    ) -> ChunkStatuses:
        chunks = await services.finished_or_after(
            sessionmaker, finished_chunks, caller.tenant_id, list(dict.fromkeys(chunk_id)), wait
        )
        may_read = caller.may("read")
        found = await services.progress(sessionmaker, caller.tenant_id, chunks)
        return ChunkStatuses(
            items=[
                ChunkStatus.of(c, may_read=may_read, progress=p) for c, p in zip(chunks, found, strict=True)
            ]
        )
