"""`/v1/chunks`: accept one chunk or a batch (202 once durable), and report a chunk's progress."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, HeaderParameter, JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_202_ACCEPTED
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_any_role, requires_role
from app.domain.accounts.services import Principal
from app.domain.ingest import services
from app.domain.ingest.batcher import IngestBatcher
from app.domain.ingest.schemas import BatchAccepted, BatchIn, ChunkAccepted, ChunkIn, ChunkStatus
from app.lib.errors import ApiError

IdempotencyKey = Annotated[
    str | None, HeaderParameter(name="Idempotency-Key", required=False, max_length=200, min_length=1)
]


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
    )
    async def post_chunk(
        self,
        data: JSONBody[ChunkIn],
        request: Request[Principal, Any, Any],
        idempotency_key: IdempotencyKey = None,
    ) -> Response[ChunkAccepted]:
        state = request.app.state
        services.validate_chunks([data], state.settings, state.writers)
        batcher: IngestBatcher = state.ingest_batcher
        [result] = await batcher.submit(
            request.user, [(data, idempotency_key)], request.state.get("request_id")
        )
        return Response(_accepted(result), status_code=HTTP_200_OK if result.replayed else HTTP_202_ACCEPTED)

    @post(
        "/batch",
        guards=[requires_role("ingest")],
        status_code=HTTP_202_ACCEPTED,
        summary="Accept several chunks at once, atomically, in order",
    )
    async def post_batch(
        self, data: JSONBody[BatchIn], request: Request[Principal, Any, Any]
    ) -> BatchAccepted:
        state = request.app.state
        if len(data.chunks) > state.settings.max_batch_chunks:
            raise ApiError(
                f"A batch may hold at most {state.settings.max_batch_chunks} chunks.",
                code="validation_error",
                status_code=422,
                details={"field": "chunks", "max": state.settings.max_batch_chunks},
            )
        services.validate_chunks(data.chunks, state.settings, state.writers)
        batcher: IngestBatcher = state.ingest_batcher
        results = await batcher.submit(
            request.user, [(c, c.idempotency_key) for c in data.chunks], request.state.get("request_id")
        )
        return BatchAccepted(results=[_accepted(r) for r in results])

    @get("/{chunk_id:uuid}", guards=[requires_any_role("ingest", "read")], summary="A chunk's progress")
    async def get_chunk(
        self,
        chunk_id: FromPath[uuid.UUID],
        request: Request[Principal, Any, Any],
        db_session: NamedDependency[AsyncSession],
    ) -> ChunkStatus:
        chunk = await services.get_chunk(db_session, request.user.tenant_id, chunk_id)
        return ChunkStatus.of(chunk, may_read=bool(request.user.roles & {"read", "admin"}))
