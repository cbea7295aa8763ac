"""`POST /v1/answer`: a user's question answered by the read model from the memories search finds."""

from __future__ import annotations

from litestar import Controller, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.answer.reader import ChatModel
from app.domain.answer.schemas import AnswerIn, AnswerOut, SourceOut, UsageOut, UsedMemoryOut
from app.domain.answer.services import (
    Answer,
    Question,
    UsedMemory,
    answer_question,
)
from app.domain.memories.schemas import MemoryOut
from app.domain.search.services import Searcher
from app.lib.errors import EmbedderMismatch, InvalidField, ReaderNotConfigured, Unavailable, error_responses


def _used(memory: UsedMemory) -> UsedMemoryOut:
    hit, source = memory.hit, memory.source
    provenance = (
        SourceOut(
            version=source.version,
            changeset_id=source.changeset_id,
            chunk_id=source.chunk_id,
            writer=source.writer,
            model=source.model,
            created_at=source.created_at,
        )
        if source is not None
        else SourceOut(hit.version, None, None, None, None, None)
    )
    return UsedMemoryOut(memory=MemoryOut.of(hit), score=hit.score, provenance=provenance)


def answer_out(answer: Answer) -> AnswerOut:
    usage = answer.completion.usage()
    return AnswerOut(
        answer=answer.text,
        model=answer.model,
        memories=[_used(m) for m in answer.memories],
        usage=UsageOut(**usage),
    )


class AnswerController(Controller):
    path = "/v1/answer"
    tags = ["answers"]
    guards = [requires_role("read")]

    @post(
        "/",
        status_code=HTTP_200_OK,
        summary="A question about a user answered by the read model from the memories search finds",
        responses=error_responses(InvalidField, EmbedderMismatch, ReaderNotConfigured, Unavailable),
    )
    async def answer(
        self,
        data: JSONBody[AnswerIn],
        caller: NamedDependency[Caller],
        reader: NamedDependency[ChatModel | None],
        searcher: NamedDependency[Searcher],
        sessionmaker: NamedDependency[async_sessionmaker[AsyncSession]],
    ) -> AnswerOut:
        if reader is None:
            raise ReaderNotConfigured(
                "No read model is configured: set MEMSTORE_READER_BASE_URL and MEMSTORE_READER_MODEL.",
                details={"settings": ["MEMSTORE_READER_BASE_URL", "MEMSTORE_READER_MODEL"]},
            )
        question = Question(
            user_id=data.user_id,
            question=data.question,
            top_k=data.top_k,
            as_of=data.as_of,
            agent_id=data.agent_id,
            valid_at=data.valid_at,
            reference_time=data.reference_time,
        )
        answer = await answer_question(sessionmaker, searcher, reader, caller.tenant_id, question)
        return answer_out(answer)
