"""A claimed chunk's writer, and what it is shown: its messages, the scope's earlier messages, the
memories related to it under local ids (only those shown get one: the apply step's `unknown_id`
guard relies on it), the memory date and the current date.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.memories.services import Shown
from app.domain.pipeline.repositories import ChunkRow, PipelineRepository, TenantOptions
from app.domain.pipeline.services.deps import PipelineDeps
from app.embeddings import Embedder
from app.embeddings.base import related_floor
from app.writers.base import (
    Candidate,
    CandidateQuery,
    Message,
    Writer,
    WriteRequest,
    select_candidates,
)


@dataclass(frozen=True)
class WriterView:
    """A claimed chunk's writer, and what it is shown (its request, and the memories under local ids)."""

    options: TenantOptions
    writer: Writer
    embedder: Embedder  # the tenant's
    request: WriteRequest
    shown: dict[int, Shown]


async def writer_view(session: AsyncSession, deps: PipelineDeps, chunk: ChunkRow) -> WriterView:
    options = await deps.tenants.get(session, chunk.tenant_id)
    embedder = deps.embedder_of(options)
    writer = deps.writers.get(chunk.writer, options.writer)
    # Writers plugged in by import path may predate `context_messages`; they get the default.
    request, shown = await build_request(
        session,
        deps,
        chunk,
        getattr(writer, "context_messages", None),
        initial_candidates=getattr(writer, "initial_candidates", True),
        embedder=embedder,
    )
    return WriterView(options, writer, embedder, request, shown)


def memory_at(chunk: ChunkRow) -> datetime:
    """When the chunk's conversation happened: its latest message time, else when it was received."""
    stamps = [m.get("created_at") for m in chunk.messages if m.get("created_at")]
    if stamps:
        with contextlib.suppress(ValueError):
            return max(datetime.fromisoformat(str(s)) for s in stamps)
    return chunk.received_at


def message_of(raw: dict[str, Any]) -> Message:
    created = raw.get("created_at")
    return Message(
        role=str(raw["role"]),
        content=str(raw["content"]),
        name=raw.get("name"),
        created_at=datetime.fromisoformat(created) if isinstance(created, str) else None,
    )


async def build_request(
    session: AsyncSession,
    deps: PipelineDeps,
    chunk: ChunkRow,
    context_messages: int | None,
    *,
    initial_candidates: bool = True,
    embedder: Embedder | None = None,
) -> tuple[WriteRequest, dict[int, Shown]]:
    """The writer's view: new messages, recent context, and related memories under local ids."""
    settings = deps.settings
    embedder = embedder or deps.embedder
    messages = tuple(message_of(m) for m in chunk.messages)
    earlier = await PipelineRepository(session).earlier_messages(
        chunk.tenant_id,
        chunk.user_id,
        chunk.seq,
        settings.context_messages if context_messages is None else context_messages,
    )
    shown: dict[int, Shown] = {}
    candidates: list[Candidate] = []
    by_memory: dict[uuid.UUID, int] = {}

    async def search(
        session: AsyncSession, queries: list[str], query: CandidateQuery | None
    ) -> tuple[Candidate, ...]:
        query = query or CandidateQuery(per_text=settings.candidate_limit)
        if query.min_score is not None:  # the protocol's floor, on this embedder's scale
            query = replace(query, min_score=related_floor(embedder.name, query.min_score))
        # The same search clients use (exact over the scope's active memories, vector ranking).
        ranked = await deps.searcher.writer_candidates(
            session, chunk.tenant_id, chunk.user_id, queries, query.per_text, embedder
        )
        hits = {hit.id: hit for found in ranked for hit in found}
        picked = select_candidates([[(hit.id, hit.score) for hit in found] for found in ranked], query)
        for memory_id in picked:  # only what is shown gets a local id (the unknown-id guard relies on it)
            if memory_id not in by_memory:
                memory = hits[memory_id]
                local_id = len(shown)
                by_memory[memory_id] = local_id
                shown[local_id] = Shown(
                    memory.id, memory.version, memory.content, tuple(memory.tags), memory.memory_at
                )
                candidates.append(
                    Candidate(
                        local_id,
                        memory.content,
                        tuple(memory.tags),
                        memory.owner,
                        memory.memory_at,
                        memory.created_at,
                    )
                )
        return tuple(candidates[by_memory[memory_id]] for memory_id in picked)

    async def find(queries: list[str], query: CandidateQuery | None) -> tuple[Candidate, ...]:
        """More candidates, for writers that search after extracting; local ids stay stable."""
        async with AsyncSession(deps.reads, expire_on_commit=False) as search_session:
            return await search(search_session, queries, query)

    user_text = "\n".join(m.content for m in messages if m.role == "user") or "\n".join(
        m.content for m in messages
    )
    initial = await search(session, [user_text], None) if initial_candidates else ()
    request = WriteRequest(
        user_id=chunk.user_id,
        agent_id=chunk.agent_id,
        run_id=chunk.run_id,
        messages=messages,
        context=tuple(message_of(m) for m in earlier),
        candidates=initial,
        memory_at=memory_at(chunk),
        now=datetime.now(UTC),
        search=find,
    )
    return request, shown
