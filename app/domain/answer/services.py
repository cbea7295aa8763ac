"""Answering a question from a user's bank: the memories clients would find, read by a model.

The memories come from Memstore's own search (`Searcher`, hybrid ranking, the same code that serves
`POST /v1/memories/search`), each with the provenance of the version found, in a short transaction
of its own that ends before the read model is called: nothing is held open while the model thinks.
`POST /v1/answer` and the evaluation (`app.domain.evaluation`) both answer through `answer_question`,
so what an evaluation scores is what clients get.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.answer.reader import ChatModel, ChatModelError, Completion
from app.domain.answer.repositories import AnswerRepository, VersionSource
from app.domain.search.repositories import Hit
from app.domain.search.services import Searcher, SearchQuery
from app.lib import tracing
from app.lib.errors import Unavailable

DEFAULT_TOP_K = 10

READER_INSTRUCTIONS = (
    "You answer a question about people from what a memory store remembers of their conversations. "
    "Use only the memories given. The date in brackets is when a memory was said: resolve relative "
    'times ("last year", "yesterday") against it. If the memories do not hold the answer, say that '
    "you do not know. Answer with a short phrase or one sentence, without explanation."
)


@dataclass(frozen=True)
class Question:
    """A question about one user's bank (api.md `POST /v1/answer`)."""

    user_id: str
    question: str
    top_k: int = DEFAULT_TOP_K
    as_of: datetime | None = None
    agent_id: str | None = None
    valid_at: datetime | None = None  # only what held then (valid time)
    reference_time: datetime | None = None  # the "now" of the question's time words (default: now)
    time_boost: float | None = None  # the search's time boost (None: `search_time_boost`)
    # Further users' banks read too, `top_k` from each after the first's (an evaluation that keeps a
    # bank per speaker of a conversation, as Mem0's and MemOS's LoCoMo harnesses do).
    also_user_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class UsedMemory:
    """A memory handed to the read model, and the write it was read from (None: not found, as for
    a memory purged meanwhile)."""

    hit: Hit
    source: VersionSource | None


@dataclass(frozen=True)
class Answer:
    text: str
    model: str
    memories: list[UsedMemory]
    completion: Completion


async def retrieve(
    session: AsyncSession, searcher: Searcher, tenant_id: uuid.UUID, question: Question
) -> list[UsedMemory]:
    """The memories a hybrid search finds for the question, best first (bank by bank), with their
    provenance."""
    hits = []
    for user_id in (question.user_id, *question.also_user_ids):
        hits += await searcher.search(
            session,
            tenant_id,
            SearchQuery(
                query=question.question,
                user_id=user_id,
                top_k=question.top_k,
                as_of=question.as_of,
                agent_id=question.agent_id,
                mode="hybrid",
                valid_at=question.valid_at,
                reference_time=question.reference_time,
                time_boost=question.time_boost,
            ),
        )
    sources = await AnswerRepository(session).sources(tenant_id, [(h.id, h.version) for h in hits])
    return [UsedMemory(h, sources.get((h.id, h.version))) for h in hits]


def reader_messages(question: str, memories: list[UsedMemory]) -> list[dict[str, str]]:
    """The read model's prompt: the instructions, then the numbered memories and the question."""
    lines = [f"{i}. {_dated(m.hit)}" for i, m in enumerate(memories, 1)] or ["(none)"]
    prompt = "Memories:\n" + "\n".join(lines) + f"\n\nQuestion: {question}\nAnswer:"
    return [{"role": "system", "content": READER_INSTRUCTIONS}, {"role": "user", "content": prompt}]


def _day(when: datetime) -> str:
    return f"{when.day} {when:%B %Y}"


def _dated(hit: Hit) -> str:
    """A memory as the reader sees it: when it was said, and when its fact held where that is known."""
    text = f"[{_day(hit.memory_at)}] {hit.content}" if hit.memory_at is not None else hit.content
    begun, ended = hit.valid_from, hit.valid_to
    if begun is not None and ended is not None:
        return f"{text} (true from {_day(begun)} until {_day(ended)})"
    if begun is not None:
        return f"{text} (true from {_day(begun)})"
    return f"{text} (true until {_day(ended)})" if ended is not None else text


@tracing.operation("answer question")
async def answer_question(
    sessionmaker: async_sessionmaker[AsyncSession],
    searcher: Searcher,
    reader: ChatModel,
    tenant_id: uuid.UUID,
    question: Question,
) -> Answer:
    """Retrieve, then ask the read model; raises `Unavailable` (503) when it fails."""
    async with sessionmaker() as session, session.begin():
        memories = await retrieve(session, searcher, tenant_id, question)
    try:
        completion = await reader.complete(reader_messages(question.question, memories))
    except ChatModelError as exc:
        raise Unavailable(
            "The read model is unavailable; retry shortly.", details={"reader": str(exc)[:300]}
        ) from exc
    return Answer(completion.text, completion.model, memories, completion)
