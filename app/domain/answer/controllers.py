"""`POST /v1/answer`: a user's question answered by the read model from the memories search finds."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Principal
from app.domain.answer.reader import ChatModel
from app.domain.answer.schemas import AnswerIn, AnswerOut, SourceOut, UsageOut, UsedMemoryOut
from app.domain.answer.services import (
    Answer,
    Question,
    ReaderNotConfiguredError,
    UsedMemory,
    answer_question,
)
from app.domain.memories.schemas import MemoryOut
from app.domain.search.services import Searcher


def provide_reader(state: State) -> ChatModel | None:
    """The process's read model (MEMSTORE_READER_*), None when none is configured."""
    reader: ChatModel | None = state.get("reader")
    return reader


def provide_searcher(state: State) -> Searcher:
    searcher: Searcher = state.searcher
    return searcher


def provide_sessionmaker(state: State) -> async_sessionmaker[AsyncSession]:
    sessionmaker: async_sessionmaker[AsyncSession] = state.sessionmaker
    return sessionmaker


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
    dependencies = {
        "reader": Provide(provide_reader, sync_to_thread=False),
        "searcher": Provide(provide_searcher, sync_to_thread=False),
        "sessionmaker": Provide(provide_sessionmaker, sync_to_thread=False),
    }

    @post(
        "/",
        status_code=HTTP_200_OK,
        summary="A question about a user answered by the read model from the memories search finds",
    )
    async def answer(
        self,
        data: JSONBody[AnswerIn],
        request: Request[Principal, Any, Any],
        reader: NamedDependency[ChatModel | None],
        searcher: NamedDependency[Searcher],
        sessionmaker: NamedDependency[async_sessionmaker[AsyncSession]],
    ) -> AnswerOut:
        if reader is None:
            raise ReaderNotConfiguredError
        question = Question(
            user_id=data.user_id,
            question=data.question,
            top_k=data.top_k,
            as_of=data.as_of,
            agent_id=data.agent_id,
        )
        answer = await answer_question(sessionmaker, searcher, reader, request.user.tenant_id, question)
        return answer_out(answer)
